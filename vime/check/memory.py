"""V8xx: memory per GPU and per node, from vime.plan.memory."""

from __future__ import annotations

from dataclasses import replace

from vime.check.registry import Finding, rule
from vime.plan.memory import CUDA_CONTEXT, HEADROOM_WARNING, GiB, loss_head, memory_plan
from vime.plan.stages import describe_split, spec_split
from vime.resolve.spec import Spec
from vime.words import a


def _gib(value: float) -> str:
    return f"{value / GiB:.1f} GiB"


def _train_fixes(spec: Spec, over: float) -> str:
    plan = memory_plan(spec)
    terms = {t.name: t.bytes for t in plan.train.terms}
    fixes = []
    opt, par = spec.train.optimizer, spec.train.parallel
    if not opt.cpu_offload and terms["optimizer"] > 0:
        # the step's transient goes with the optimizer
        moved = terms["optimizer"] + terms["optimizer step"]
        fixes.append(f"train.optimizer.cpu_offload = true (with precision_aware and distributed) "
                     f"moves {_gib(moved)} to the host")
    # recompute and fewer tokens shrink the backward's working set, not the optimizer step's
    # transient that follows it: no help once the step is the peak
    backward_bound = terms["optimizer step"] == 0
    if spec.train.recompute != "full" and backward_bound:
        fixes.append('train.recompute = "full"')
    if spec.train.dynamic_batch and backward_bound:
        tokens = spec.train.max_tokens_per_gpu
        head = loss_head(spec, tokens).token_bytes if "logits" in terms else 0.0
        per_token = (terms["activations"] + terms.get("uneven routing", 0.0) + head) / tokens
        smaller = int((spec.train.max_tokens_per_gpu * per_token - over) / per_token)
        if smaller >= 1024:
            fixes.append(f"max_tokens_per_gpu ≤ {smaller // 1024 * 1024}")
    if spec.arch.is_moe and spec.arch.num_experts % (par.ep * 2) == 0 and (
            spec.train.num_gpus % (par.etp * par.ep * 2 * par.pp) == 0):
        fixes.append(f"ep = {par.ep * 2}")
    stage_fix = _stage_fix(spec, plan)
    if stage_fix:
        fixes.append(stage_fix)
    return "; or ".join(fixes) if fixes else "more GPUs (nodes), or a larger tp"


STAGE_FIX_TRIES = 64  # layers moved off the busiest stage, one at a time, at most


def _stage_fix(spec: Spec, plan) -> str | None:
    """Fewer layers on the busiest stage when it is the first or the last (which also hold the
    embeddings, or the output layer and the loss head): the most layers it may keep with every
    stage at ≤ 90% of the GPU, as first_stage_layers or last_stage_layers."""
    if len(plan.stages) < 2:
        return None
    busiest = plan.stages[plan.busiest_stage].stage
    if not (busiest.embedding or busiest.output):
        return None
    name = "first_stage_layers" if busiest.embedding else "last_stage_layers"
    target = plan.train.capacity * (1 - HEADROOM_WARNING)
    par = spec.train.parallel
    for layers in range(busiest.num_layers - 1, max(busiest.num_layers - 1 - STAGE_FIX_TRIES, 0),
                        -1):
        moved = replace(spec, train=replace(spec.train, parallel=replace(par, **{name: layers})))
        split = spec_split(moved)
        if split.problem:
            continue
        found = memory_plan(moved)
        if found is not None and found.train.peak <= target:
            return (f"train.parallel.{name} = {layers} ({describe_split(split.layers)} layers: "
                    f"{_gib(found.train.peak)} on the busiest stage)")
    return None


@rule("V801", "train-memory-fits", enforced_by="megatron", needs_arch=True)
def train_memory_fits(spec: Spec):
    """The actor's training step does not fit in GPU memory (or barely does).

    vime adds, for the most loaded GPU: bf16 weights, fp32 gradients, the optimizer state
    (fp32 main params and two Adam moments, sharded by the distributed optimizer over dp × cp
    for dense and edp for expert parameters; on the host with cpu_offload), activations of
    one micro-batch (max_tokens_per_gpu with dynamic batches) under the recompute setting,
    the loss head (the plan's "logits" line: the runtime computes the log-probs from the final
    hidden states a chunk of tokens at a time and keeps no [tokens, vocab] logits, so it
    counts per token the hidden states kept for the backward, one chunk's temporaries over
    the vocabulary ÷ tp, or the whole vocabulary with top-p, and the output weight's gradient
    summed in fp32), the optimizer step's transient beyond that, the memory outside torch's
    allocator and the allocator's fragmentation (the "allowance"), and the sleeping vLLM
    engine when colocated.
    MoE layers: with etp > 1 each rank processes the routed rows of its whole etp group (at
    ffn ÷ etp); with ep > 1 the busiest rank gets more routed rows than the mean, and the
    "uneven routing" line charges train.routing_imbalance (default 1.8, the most
    measured at ep 2 with random routing: 1.5-1.8× the mean) times the mean rows' activations.
    Lower it for a router trained with load balancing, raise it for a skewed one; it is capped
    at min(ep, experts ÷ top-k). The grouped experts (the default where torch's grouped GEMM
    runs; VIME_MOE_EXPERTS = "sequential" in [cluster.env] turns them off) keep the same
    activations as SequentialMLP plus one stacked copy of a layer's local fc1 weights and its
    gradient ("expert stacks"). Without Transformer Engine or Apex, megatron-core steps with
    torch's foreach AdamW, which adds 4 bytes per parameter of the larger optimizer shard for
    the step ("optimizer step", measured on an H200; the activations are freed by then); it is
    charged unless train.transformer_impl = "transformer_engine", under which TE imports on
    every node and its FusedAdam updates in place.
    At run time this is "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ..."
    in the first training step, after the queue wait and the model load. A warning means
    less than 10% headroom: real runs vary with sequence lengths and routing imbalance.
    With pipeline parallelism (pp > 1) each stage is judged by its own layers, the embeddings
    on the first, the output layer and the loss head on the last, and the activations of the
    micro-batches it holds at once under the 1F1B schedule (stage i of pp holds up to pp − i:
    megatron/core/pipeline_parallel/schedules.py's warm-up), and the busiest stage is named.
    The breakdown is in `vime plan`, each line marked by what it was checked against (● a GPU
    measurement, ◐ the CPU only, ○ the model's estimate; `plan --json` names the measurement and
    the error seen): the less of the peak is ●, the less a small headroom means.
    docs/memory-validation.md says how close it is.
    Fix: the help line lists what would make it fit (CPU Adam, recompute, fewer tokens per
    GPU, more expert parallelism, fewer layers on a crowded first or last pipeline stage)."""
    plan = memory_plan(spec)
    if plan is None:
        return
    phase = plan.train
    where = (f" on pipeline stage {plan.busiest_stage}, the busiest of {len(plan.stages)}"
             if len(plan.stages) > 1 else "")
    if phase.peak > phase.capacity:
        yield Finding("train", f"training needs {_gib(phase.peak)} per GPU{where} but "
                      f"{a(spec.cluster.gpu)} has {_gib(phase.capacity)}",
                      help=_train_fixes(spec, phase.peak - phase.capacity),
                      related=("train.optimizer.cpu_offload", "train.max_tokens_per_gpu"))
    elif phase.headroom < HEADROOM_WARNING:
        yield Finding("train", f"training needs {_gib(phase.peak)} of "
                      f"{_gib(phase.capacity)} per GPU{where}: {phase.headroom:.0%} headroom",
                      severity="warning", help=_train_fixes(spec, 0.1 * phase.capacity))


@rule("V802", "kv-cache-fits", enforced_by="vllm", needs_arch=True)
def kv_cache_fits(spec: Spec):
    """The rollout engine has no room for the KV cache of one full-length sequence.

    vLLM reserves gpu_memory_utilization × the GPU's memory, loads the weights, profiles one
    forward pass and gives the rest to the KV cache (v1/worker/gpu_worker.py
    `determine_available_memory`). When the rest cannot hold max_model_len tokens it raises
    "ValueError: To serve at least one request with the model's max seq len (L), (X GiB KV
    cache is needed, which is larger than the available KV cache memory (Y GiB)" or "No
    available memory for the cache blocks. Try increasing gpu_memory_utilization".
    max_model_len is max_prompt_len plus the longest max_response_len of the rollout and of
    the evaluation datasets, so one evaluation sequence must fit too.
    Fix: a higher gpu_memory_utilization, engines of more GPUs (weights split further), or
    shorter max_prompt_len + max_response_len (the rollout's or the evaluation's)."""
    plan = memory_plan(spec)
    if plan is None:
        return
    roll = plan.rollout
    if roll.kv_tokens < roll.max_len:
        longest = ("rollout.max_response_len"
                   if spec.rollout.max_prompt_len + spec.rollout.max_response_len == roll.max_len
                   else "an eval dataset's max_response_len")
        yield Finding("inference.gpu_memory_utilization",
                      f"the KV cache has room for {roll.kv_tokens} tokens per GPU, less than one "
                      f"sequence of max_prompt_len + {longest} = {roll.max_len} "
                      f"({_gib(roll.kv_bytes_per_token * roll.max_len)} needed)",
                      help="raise gpu_memory_utilization, or gpus_per_engine, or shorten the "
                      "sequences", related=("inference.gpus_per_engine", "rollout.max_response_len"))


@rule("V803", "colocated-rollout-budget", enforced_by="vllm", needs_arch=True)
def colocated_rollout_budget(spec: Spec):
    """With colocation, vLLM's memory share plus what the actor leaves behind exceed the GPU.

    vLLM checks at start-up that the GPU's free memory is at least gpu_memory_utilization ×
    its total memory ("ValueError: Free memory on device ... on startup is less than desired
    GPU memory utilization"). By then the engine's own CUDA context is in use (0.51 GiB on an
    H200), and when colocated the offloaded actor still holds its CUDA context and NCCL
    buffers on every GPU.
    Fix: a lower gpu_memory_utilization (the help gives the largest that fits)."""
    plan = memory_plan(spec)
    if plan is None or not spec.train.colocate:
        return
    util = spec.inference.gpu_memory_utilization
    actor = next(t.bytes for t in plan.rollout.phase.terms if t.name == "offloaded actor")
    resident = actor + CUDA_CONTEXT
    if util * plan.gpu_bytes + resident > plan.gpu_bytes:
        best = int((plan.gpu_bytes - resident) / plan.gpu_bytes * 100) / 100
        yield Finding("inference.gpu_memory_utilization",
                      f"gpu_memory_utilization {util} asks {_gib(util * plan.gpu_bytes)} but the "
                      f"colocated actor keeps {_gib(resident)} of {_gib(plan.gpu_bytes)}",
                      help=f"gpu_memory_utilization = {best}")


@rule("V804", "host-memory-fits", enforced_by="vime", needs_arch=True)
def host_memory_fits(spec: Spec):
    """Host memory per node is not enough for CPU Adam, offloaded weights and Ray's store.

    Checked when cluster.host_memory_gib is set. CPU Adam keeps fp32 params, both moments and
    fp32 grads on the host for every GPU of the node; colocated runs also park the actor's
    bf16 weights and the sleeping engine's weights there; Ray's object store takes 30% of
    the memory by default. Running out kills the job through the Linux OOM killer or
    Slurm's memory cgroup ("oom-kill event", "slurmstepd: error: Detected 1 oom_kill event").
    Fix: turn cpu_offload off where GPUs have room (more nodes), or use nodes with more memory."""
    plan = memory_plan(spec)
    if plan is None or plan.host_capacity is None:
        return
    need, have = plan.host_per_node, plan.host_capacity
    if need > have:
        parts = " + ".join(f"{t.name} {t.bytes / GiB:.1f}" for t in plan.host_terms)
        yield Finding("cluster.host_memory_gib", f"each node needs {_gib(need)} of host memory "
                      f"({parts}) but has {_gib(have)}",
                      help="more nodes with cpu_offload = false, or nodes with more memory",
                      related=("train.optimizer.cpu_offload",))
    elif (have - need) / have < HEADROOM_WARNING:
        yield Finding("cluster.host_memory_gib", f"each node needs {_gib(need)} of {_gib(have)} "
                      "host memory: under 10% headroom", severity="warning",
                      help="leave room for the page cache and data loading")


@rule("V810", "resident-fits", enforced_by="megatron", needs_arch=True)
def resident_fits(spec: Spec):
    """train.offload = "never" keeps the actor and the awake engine on a GPU together, and they
    do not fit.

    Resident, the actor holds its weights, gradients, optimizer state and a step's activations
    (the train phase of `vime plan`, without the sleeping engine) while the engine holds all
    of gpu_memory_utilization × the GPU's memory and its CUDA context. vLLM refuses to start
    when the GPU has less free ("ValueError: Free memory on device ... on startup is less than
    desired GPU memory utilization"), or the actor's first step meets "torch.OutOfMemoryError:
    CUDA out of memory" with the engine's KV cache beside it.
    Fix: train.offload = "auto" (they take turns when they do not fit), or a lower
    gpu_memory_utilization (the help gives the largest that fits)."""
    from vime.plan.colocation import largest_resident_utilization, plan_colocation

    memory = memory_plan(spec)
    found = plan_colocation(spec, memory)
    if found is None or found.setting != "never" or found.fits is not False:
        return
    best = largest_resident_utilization(spec, memory)
    fix = (f"gpu_memory_utilization = {best}, or " if best > 0 else "") + 'train.offload = "auto"'
    yield Finding("train.offload",
                  f"the actor and the engine do not fit on {a(spec.cluster.gpu)} together: "
                  f"{found.sums(spec.inference.gpu_memory_utilization)}",
                  help=fix, related=("inference.gpu_memory_utilization",))


@rule("V811", "offload-without-colocation", severity="warning")
def offload_without_colocation(spec: Spec):
    """train.offload is set on a spec that does not colocate: it has no effect.

    train.offload says whether a colocated actor and its engines take turns on their shared
    GPUs (offload and sleep) or stay resident. With train.colocate = false the actor and the
    engines have GPUs of their own and never move.
    Fix: remove train.offload, or set train.colocate = true."""
    if not spec.train.colocate and spec.train.offload != "auto":
        yield Finding("train.offload", f"train.offload = {spec.train.offload!r} has no effect "
                      "with train.colocate = false", help="remove train.offload",
                      related=("train.colocate",))
