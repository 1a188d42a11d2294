"""V5xx: the rollout engines (vLLM)."""

from __future__ import annotations

from vime import flags
from vime.check.engine_flags import VIME_VLLM_FLAGS, parse
from vime.check.layout import divisors
from vime.check.registry import Finding, rule
from vime.plan.placement import engine_gpus
from vime.resolve.spec import Spec


@rule("V501", "engine-gpus-divide-by-dp", enforced_by="vime")
def engine_gpus_divide_by_dp(spec: Spec):
    """An engine's GPUs must split evenly into vLLM data-parallel ranks.

    vLLM runs data_parallel_size attention replicas of TP = gpus_per_engine ÷
    data_parallel_size GPUs each; vLLM itself is given TP and DP and would simply use
    fewer GPUs than the plan reserved (or fail to place its workers in the engine's
    placement group).
    Fix: a data_parallel_size that divides gpus_per_engine."""
    inf = spec.inference
    if inf.gpus_per_engine % inf.data_parallel_size:
        fits = [d for d in divisors(inf.gpus_per_engine) if d <= inf.data_parallel_size]
        yield Finding("inference.data_parallel_size",
                      f"gpus_per_engine = {inf.gpus_per_engine} does not split into "
                      f"data_parallel_size = {inf.data_parallel_size} equal ranks",
                      help=f"data_parallel_size = {max(fits)}",
                      related=("inference.gpus_per_engine",))


@rule("V502", "engine-on-whole-nodes", enforced_by="vime")
def engine_on_whole_nodes(spec: Spec):
    """An engine that spans nodes must take whole nodes; a smaller one must fit in one node.

    A multi-node engine runs its TP/DP workers through Ray across nodes; an engine whose
    GPUs start mid-node and spill into the next node shares a node with another engine's
    NCCL group, puts a TP group across the slow inter-node link, and cannot be expressed
    as a Ray placement group that vLLM's Ray executor accepts per node.
    Fix: gpus_per_engine a divisor of gpus_per_node or a multiple of it, and (not
    colocated) train.num_gpus a multiple of gpus_per_engine or of gpus_per_node."""
    gpn = spec.cluster.gpus_per_node
    # engine e starts at GPU (start + e × gpus_per_engine) % gpn of its node, a position that
    # repeats within gpn engines: if any engine straddles nodes, one of the first gpn does (a
    # plan of 262,144 one-GPU engines checks 64, not all of them)
    for index, gpus in enumerate(engine_gpus(spec, count=gpn)):
        nodes = sorted({node for node, _ in gpus})
        if len(nodes) > 1 and not (gpus[0][1] == 0 and len(gpus) % gpn == 0):
            yield Finding(
                "inference.gpus_per_engine",
                f"engine {index} would take node {gpus[0][0]} GPU {gpus[0][1]} to node "
                f"{gpus[-1][0]} GPU {gpus[-1][1]}: {len(gpus)} GPUs straddling nodes "
                f"{', '.join(map(str, nodes))} ({gpn} GPUs per node)",
                help=f"gpus_per_engine should divide {gpn} or be a multiple of it, starting on "
                "a node boundary",
                related=("train.num_gpus",))
            return


@rule("V503", "rollout-gpus-hold-engines", enforced_by="vime")
def rollout_gpus_hold_engines(spec: Spec):
    """The rollout GPUs must be a whole number of engines.

    slime starts rollout_num_gpus ÷ rollout_num_gpus_per_engine engines and leaves the
    remainder idle (or fails to build the placement group for the last engine).
    Fix: gpus_per_engine dividing the rollout's GPU count."""
    inf = spec.inference
    if inf.num_gpus > 0 and inf.num_gpus % inf.gpus_per_engine:
        yield Finding("inference.gpus_per_engine",
                      f"{inf.num_gpus} rollout GPUs are not a whole number of engines of "
                      f"{inf.gpus_per_engine} GPUs",
                      help=f"gpus_per_engine = one of {divisors(inf.num_gpus)}",
                      related=("inference.num_gpus",))


@rule("V504", "vllm-tp-divides-heads", enforced_by="vllm", needs_arch=True)
def vllm_tp_divides_heads(spec: Spec):
    """vLLM's tensor parallelism must divide the attention heads.

    vLLM's ModelConfig.verify_with_parallel_config raises "ValueError: Total number of
    attention heads (H) must be divisible by tensor parallel size (TP)." at engine start.
    vLLM's TP is gpus_per_engine ÷ data_parallel_size.
    Fix: a larger data_parallel_size (attention data parallel) or smaller engines."""
    heads, tp = spec.arch.num_attention_heads, spec.derived.vllm_tp
    if heads % tp:
        yield Finding("inference.gpus_per_engine",
                      f"vLLM TP = gpus_per_engine ÷ data_parallel_size = {tp} does not divide "
                      f"the model's {heads} attention heads",
                      help="raise data_parallel_size so that TP divides "
                      f"{heads} (e.g. TP = {max(d for d in divisors(heads) if d <= tp)})",
                      related=("inference.data_parallel_size",))


@rule("V505", "vllm-tp-vs-kv-heads", enforced_by="vllm", needs_arch=True)
def vllm_tp_vs_kv_heads(spec: Spec):
    """vLLM's TP must divide the KV heads, or be a multiple of them (replicated KV).

    QKVParallelLinear (vllm/model_executor/layers/linear.py) replicates KV heads when
    TP ≥ KV heads (TP % KV must be 0) and shards them otherwise (KV % TP must be 0); a
    mismatch fails with "AssertionError: N is not divisible by D" from
    distributed/utils.divide while loading the model.
    Fix: change gpus_per_engine or data_parallel_size."""
    kv, tp = spec.arch.num_kv_heads, spec.derived.vllm_tp
    if (tp >= kv and tp % kv) or (tp < kv and kv % tp):
        yield Finding("inference.gpus_per_engine",
                      f"vLLM TP = {tp} is neither a multiple nor a divisor of the model's {kv} "
                      "KV heads", help=f"a TP of {kv}, a divisor of {kv} or a multiple of it",
                      related=("inference.data_parallel_size",))


@rule("V506", "context-fits-model", enforced_by="vllm", needs_arch=True)
def context_fits_model(spec: Spec):
    """Prompt plus response must fit the model's context length.

    vime gives vLLM max_model_len = max_prompt_len + the longest max_response_len of the
    rollout (with a rollout function, max_total_tokens: every turn and tool output) and of
    the evaluation datasets ([[eval.datasets]]). vLLM raises
    "ValueError: User-specified max_model_len (X) is greater than the derived
    max_model_len (max_position_embeddings=Y ...)" at engine start unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set.
    Fix: shorter max_prompt_len or max_response_len (the rollout's or the evaluation's), or
    a model with a longer context."""
    roll, limit = spec.rollout, spec.arch.max_position_embeddings
    # a rollout function's samples are max_total_tokens long after the prompt
    own = ("rollout.max_total_tokens" if roll.sample_tokens != roll.max_response_len
           else "rollout.max_response_len")
    lengths = [(own, roll.sample_tokens)] + [
        (f"eval.datasets[{i}].max_response_len", d.max_response_len)
        for i, d in enumerate(spec.eval.datasets)]
    for key, response in lengths:
        total = roll.max_prompt_len + response
        if total > limit:
            yield Finding(key,
                          f"max_prompt_len + {key.split('.', 1)[0]} "
                          f"{key.rsplit('.', 1)[1]} = "
                          f"{roll.max_prompt_len} + {response} = {total} exceeds the model's "
                          f"max_position_embeddings {limit}" + (
                              " (vime's default: nothing gives it, V104)" if spec.origins.get(
                                  "model.arch.max_position_embeddings") else ""),
                          help=f"{key.rsplit('.', 1)[1]} = "
                          f"{max(limit - roll.max_prompt_len, 1)}",
                          related=("rollout.max_prompt_len",))


def _vime_flag_of(arg: str) -> str | None:
    """The flag of VIME_VLLM_FLAGS that arg sets under another spelling (--tensor_parallel_size,
    --no-enable-sleep-mode, an abbreviation), by vLLM's flag catalog; None if none."""
    dest = parse((arg,))[0].dest
    if dest is None:
        return None
    cat = flags.catalog("vllm")
    return next((option for option in VIME_VLLM_FLAGS
                 if any(e["dest"] == dest for e in cat.entries(option).values())), None)


@rule("V507", "extra-args-contradict-plan", enforced_by="vime")
def extra_args_contradict_plan(spec: Spec):
    """inference.extra_args sets a flag that vime derives from the spec.

    vime passes extra_args after its own flags, so vLLM takes the last value and the engine
    does not match the plan (placement groups, memory and expert counts computed for
    another layout); pipeline parallelism inside an engine is not supported by vime at all.
    Fix: set the spec key instead (inference.gpus_per_engine, data_parallel_size,
    expert_parallel, [inference.eplb], gpu_memory_utilization, cudagraph_capture_sizes,
    moe_backend)."""
    for index, arg in enumerate(spec.inference.extra_args):
        written = arg.split("=", 1)[0]
        flag = written if written in VIME_VLLM_FLAGS else _vime_flag_of(arg)
        if flag in VIME_VLLM_FLAGS:
            key = VIME_VLLM_FLAGS[flag]
            shown = written if written == flag else f"{written} ({flag})"
            yield Finding(f"inference.extra_args[{index}]",
                          f"extra_args sets {shown}, which vime derives from the spec",
                          help=f"remove it and set {key} instead" if key else
                          "remove it: vime runs no pipeline parallelism inside an engine, "
                          "and no spec key sets it")


@rule("V508", "routing-replay-keeps-prefix-cache", enforced_by="vllm")
def routing_replay_keeps_prefix_cache(spec: Spec):
    """Returning routed experts (R3) needs vLLM's prefix caching.

    vLLM's config/vllm.py `_verify_aux_output_compatibility` rejects
    --enable-return-routed-experts unless prefix caching is on (and the model runner V2 is
    used, which the runtime sets with VLLM_USE_V2_MODEL_RUNNER=1).
    Fix: remove --no-enable-prefix-caching (0.33: also --disable-prefix-caching) from
    inference.extra_args, or routing_replay = false."""
    if not spec.train.routing_replay:
        return
    for p in parse(spec.inference.extra_args):
        if p.dest == "enable_prefix_caching" and p.is_false:
            yield Finding(f"inference.extra_args[{p.index}]",
                          "routing_replay needs prefix caching, which this flag turns off",
                          help=f"remove {p.arg.name}", related=("train.routing_replay",))


@rule("V509", "vllm-dp-needs-moe", enforced_by="vllm", needs_arch=True)
def vllm_dp_needs_moe(spec: Spec):
    """vLLM data parallelism inside one engine is for MoE models.

    For a dense model each DP rank runs as an independent engine and the offline path
    raises "ValueError: Offline data parallel mode is not supported/useful for dense
    models." (vllm/config/parallel.py).
    Fix: data_parallel_size = 1 and more, smaller engines (gpus_per_engine = TP)."""
    if not spec.arch.is_moe and spec.inference.data_parallel_size > 1:
        yield Finding("inference.data_parallel_size",
                      f"data_parallel_size = {spec.inference.data_parallel_size} on a dense model",
                      help=f"data_parallel_size = 1 and gpus_per_engine = {spec.derived.vllm_tp}")


@rule("V510", "vllm-tp-divides-expert-ffn", enforced_by="vllm", needs_arch=True)
def vllm_tp_divides_expert_ffn(spec: Spec):
    """Without expert parallelism vLLM splits every expert over all the engine's GPUs.

    Then each expert's FFN is tensor-parallel over TP × DP GPUs and vLLM asserts
    moe_intermediate_size % (TP × DP × PCP) == 0 (FusedMoEConfig.__post_init__,
    model_executor/layers/fused_moe/config.py).
    Fix: expert_parallel = true, or an engine size that divides the expert FFN size."""
    inf, arch = spec.inference, spec.arch
    if arch.is_moe and not inf.expert_parallel:
        ways = spec.derived.vllm_tp * inf.data_parallel_size
        if arch.moe_ffn_hidden_size % ways:
            yield Finding("inference.expert_parallel",
                          f"expert FFN size {arch.moe_ffn_hidden_size} does not split over TP × DP "
                          f"= {ways} GPUs", help="expert_parallel = true",
                          related=("inference.gpus_per_engine",))


@rule("V523", "eval-interval-without-datasets", severity="warning", enforced_by="vime")
def eval_interval_without_datasets(spec: Spec):
    """An evaluation interval with no dataset to evaluate.

    eval.interval (upstream's --eval-interval) says when to evaluate; the datasets are the
    [[eval.datasets]] tables (--eval-prompt-data NAME PATH). Without one, nothing is
    evaluated and no eval/ metric appears.
    Fix: add an [[eval.datasets]] table with name and prompt_data, or remove eval.interval."""
    if spec.eval.interval is not None and not spec.eval.datasets:
        yield Finding("eval.interval",
                      f"eval.interval = {spec.eval.interval} but no [[eval.datasets]] table",
                      help='add [[eval.datasets]] with name = "..." and prompt_data = "...", '
                      "or remove eval.interval")


@rule("V524", "eval-names-differ", enforced_by="vime")
def eval_names_differ(spec: Spec):
    """Two evaluation datasets share a name.

    Each dataset's metrics are logged as eval/<name>/...; two datasets of one name would
    write the same metrics and one would hide the other.
    Fix: a different name for each [[eval.datasets]] table."""
    seen: dict[str, int] = {}
    for index, dataset in enumerate(spec.eval.datasets):
        if dataset.name in seen:
            yield Finding(f"eval.datasets[{index}].name",
                          f"eval dataset name {dataset.name!r} is also dataset {seen[dataset.name]}'s",
                          help=f'name = "{dataset.name}-{index}"',
                          related=(f"eval.datasets[{seen[dataset.name]}].name",))
        seen.setdefault(dataset.name, index)
