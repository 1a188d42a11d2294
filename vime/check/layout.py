"""V1xx model and V2xx Megatron layout and optimizer rules."""

from __future__ import annotations

import math

from vime import schema
from vime.check.model import unsupported_features
from vime.check.registry import Finding, rule
from vime.plan.stages import (
    bubble_fraction,
    describe_split,
    micro_batches_per_step,
    most_micro_batches,
    spec_split,
    split_layers,
)
from vime.resolve.spec import Spec
from vime.words import plural


def divisors(n: int) -> list[int]:
    """The divisors of n in increasing order, in O(√n): n is at most a schema maximum
    (2**24 for model sizes), so a suggestion never walks a range as long as the value
    (`cp = 10**12` answers at once: tests/test_properties.py)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@rule("V101", "model-architecture", enforced_by="vime")
def model_architecture(spec: Spec):
    """The model's architecture could not be determined.

    vime reads layers, heads, experts and sizes from `config.json` in
    `model.hf_checkpoint`. When that folder is not readable on the machine that plans (a
    laptop, a login node), a built-in preset (`model.preset = "qwen3-30b-a3b"`) or a
    `[model.arch]` table with the config.json keys gives the same numbers. Without an
    architecture no layout rule about heads, layers or experts can be checked; at run time
    Megatron would fail in its checkpoint loader or on the first mismatched tensor.
    Fix: set model.preset, or point model.hf_checkpoint at a folder with config.json, or
    correct the config.json key named in the message."""
    # a config.json of another architecture (a multimodal model without the text keys at
    # its top level) is V102's to report: its keys are missing because it is not a Qwen3
    if spec.arch is None and spec.arch_problem is not None and not unsupported_features(spec):
        key, problem = spec.arch_problem
        yield Finding(key, problem,
                      help='set model.preset = "qwen3-30b-a3b" (or another preset) to plan '
                      "without the weights, or add a [model.arch] table")


def _tp_fits_model(spec: Spec, tp: int) -> bool:
    arch = spec.arch
    return arch is None or (arch.num_attention_heads % tp == 0
                            and (arch.num_kv_heads % tp == 0 or tp % arch.num_kv_heads == 0))


def tp_fix(spec: Spec) -> int | None:
    """The one tp that clears V201, V203 and V204 together (tests/test_consistent_fixes.py:
    tp = 3 gets one suggestion, not one per rule): it divides the heads,
    is a multiple or divisor of the KV heads, and whole replicas of tp × cp × pp fill the
    actor's GPUs. The closest to the written tp; on a tie the larger (more memory room)."""
    par = spec.train.parallel
    gpus = spec.train.num_gpus
    rest = par.cp * par.pp
    if gpus <= 0 or gpus % rest:
        return None
    fits = [tp for tp in divisors(gpus // rest) if tp != par.tp and _tp_fits_model(spec, tp)]
    return min(fits, key=lambda tp: (abs(math.log(tp / par.tp)), -tp)) if fits else None


def _megatron_pp_fix(spec: Spec, fits) -> str | None:
    """pp = 1 where vime's Megatron backend runs (it has no pipeline schedule, V905) and
    pp = 1 clears the rule: a fix that leaves pp > 1 would meet V905 next."""
    if spec.train.backend == "megatron" and spec.train.parallel.pp > 1 and fits(1):
        return "pp = 1 (vime's Megatron backend runs no pipeline parallelism, V905)"
    return None


def _replica_help(spec: Spec, replica: int) -> str:
    gpn, nodes = spec.cluster.gpus_per_node, spec.cluster.nodes
    par = spec.train.parallel
    gpus = spec.train.num_gpus
    if not _tp_fits_model(spec, par.tp):  # tp itself is wrong (V203/V204): their one fix
        fixed = tp_fix(spec)
        return f"tp = {fixed}" if fixed else "make the actor's GPU count a multiple of it"
    pp_fix = _megatron_pp_fix(spec, lambda pp: gpus % (par.tp * par.cp * pp) == 0)
    if pp_fix:
        return pp_fix
    options = []
    if spec.train.colocate:
        # the next node count whose GPUs hold whole replicas: a multiple of this step
        step = replica // math.gcd(replica, gpn)
        more = (nodes // step + 1) * step
        if more <= schema.node(("cluster", "nodes"))["maximum"]:
            options.append(f"use {more} nodes ({more * gpn} GPUs)")
    gpus = spec.train.num_gpus
    for axis in ("tp", "cp"):
        other = par.cp if axis == "tp" else par.tp
        for value in sorted(divisors(max(gpus, 1)), reverse=True):
            if value * other * par.pp <= gpus and gpus % (value * other * par.pp) == 0 and (
                    value != getattr(par, axis)) and (axis != "tp" or _tp_fits_model(spec, value)):
                options.append(f"{axis} = {value}")
                break
    return ", or ".join(options) if options else "make the actor's GPU count a multiple of it"


@rule("V201", "actor-gpus-hold-replicas", enforced_by="megatron")
def actor_gpus_hold_replicas(spec: Spec):
    """The actor's GPUs are not a whole number of model replicas of tp × cp × pp GPUs.

    Megatron-core splits the actor's world into data-parallel replicas of
    tp × cp × pp × gtp GPUs. `validate_args` (megatron/training/arguments.py) asserts
    "world size (W) is not divisible by total_model_size (total_model_size=M)" and
    `initialize_model_parallel` (megatron/core/parallel_state.py) raises
    "RuntimeError: world_size (W) is not divisible by M" — after the queue wait and the
    Ray start-up. Note that data parallelism excludes cp: dp = W ÷ (tp × cp × pp).
    Fix: change tp, cp or pp, or the number of actor GPUs (nodes, or train.num_gpus when
    not colocated), so that W is a multiple of tp × cp × pp."""
    par = spec.train.parallel
    replica = spec.derived.layout.replica
    gpus = spec.train.num_gpus
    if gpus > 0 and gpus % replica:
        yield Finding(
            "train.parallel.tp",
            f"train.parallel: {gpus} actor GPUs cannot hold whole model replicas of "
            f"tp × cp × pp = {par.tp} × {par.cp} × {par.pp} = {replica} GPUs",
            help=_replica_help(spec, replica),
            related=("train.parallel.cp", "train.parallel.pp", "train.num_gpus"))


@rule("V202", "actor-gpus-hold-expert-grid", enforced_by="megatron")
def actor_gpus_hold_expert_grid(spec: Spec):
    """The actor's GPUs are not a multiple of etp × ep × pp (Megatron's expert grid).

    Megatron-core lays the MoE layers over a second grid of the same ranks: expert tensor
    parallel × expert parallel × pipeline, the rest being expert data parallel.
    `initialize_model_parallel` raises "RuntimeError: world_size (W) is not divisible by
    expert_tensor_model_pipeline_parallel size (E)". EP does not have to divide dp: expert
    ranks may span tensor- and context-parallel ranks ("MoE parallel folding").
    Fix: choose ep and etp so that etp × ep × pp divides the actor's GPU count."""
    par = spec.train.parallel
    grid = spec.derived.layout.expert_grid
    gpus = spec.train.num_gpus
    if gpus > 0 and gpus % grid:
        fits = [e for e in divisors(gpus // max(par.etp * par.pp, 1) or 1)
                if gpus % (par.etp * e * par.pp) == 0]
        pp_fix = _megatron_pp_fix(spec, lambda pp: gpus % (par.etp * par.ep * pp) == 0)
        yield Finding(
            "train.parallel.ep",
            f"train.parallel: {gpus} actor GPUs are not a multiple of etp × ep × pp = "
            f"{par.etp} × {par.ep} × {par.pp} = {grid}",
            help=pp_fix or (f"ep = {max(fits)}" if fits else "lower etp or pp"),
            related=("train.parallel.etp", "train.parallel.pp", "train.num_gpus"))


@rule("V203", "tp-divides-heads", enforced_by="megatron", needs_arch=True)
def tp_divides_heads(spec: Spec):
    """Megatron's tensor parallelism must divide the attention heads.

    Each TP rank holds heads ÷ tp query heads. `TransformerConfig.__post_init__`
    (megatron/core/transformer/transformer_config.py) raises "ValueError:
    num_attention_heads (H) must be a multiple of tensor_model_parallel_size (TP)."
    Fix: a tp that divides the number of heads."""
    heads, tp = spec.arch.num_attention_heads, spec.train.parallel.tp
    if heads % tp:
        fixed = tp_fix(spec)
        yield Finding("train.parallel.tp",
                      f"tp = {tp} does not divide the model's {heads} attention heads",
                      help=f"tp = {fixed or max(d for d in divisors(heads) if d < tp)}")


@rule("V204", "tp-vs-kv-heads", enforced_by="megatron", needs_arch=True)
def tp_vs_kv_heads(spec: Spec):
    """Megatron's tensor parallelism must be a multiple or a divisor of the KV heads.

    With grouped-query attention each TP rank needs whole KV groups, or a whole number of
    ranks per group. megatron-core 0.16+ (`TransformerConfig.__post_init__`) raises
    "ValueError: num_query_groups (G) must be a multiple or divisor of
    tensor_model_parallel_size (TP)."; 0.14–0.15 required G % TP == 0 ("must be a
    multiple of"). vime assumes megatron-core ≥ 0.16 (target 0.19).
    Fix: a tp that divides the KV heads or is a multiple of them."""
    kv, tp = spec.arch.num_kv_heads, spec.train.parallel.tp
    if kv % tp and tp % kv:
        yield Finding("train.parallel.tp",
                      f"tp = {tp} is neither a multiple nor a divisor of the model's "
                      f"{kv} KV heads",
                      help=f"tp = {tp_fix(spec)}" if tp_fix(spec) else f"tp = {kv} or a divisor of it")


def _uneven_fix(spec: Spec) -> str | None:
    """The written first/last stage key changed as little as makes the split valid, else (no
    key written) the last stage given the rest after ⌈layers ÷ pp⌉ on every other stage."""
    par, layers = spec.train.parallel, spec.arch.num_layers
    first, last = par.first_stage_layers, par.last_stage_layers
    options = []  # (distance from the written value, key, value, split)
    if first is None and last is None:
        each = -(-layers // par.pp)
        rest = layers - each * (par.pp - 1)
        split = split_layers(layers, par.pp, None, rest) if rest >= 1 else None
        if split is not None and not split.problem:
            options.append((0, "last_stage_layers", rest, split))
    for key, written in (("first_stage_layers", first), ("last_stage_layers", last)):
        if written is None:
            continue
        for value in range(1, layers):
            split = split_layers(layers, par.pp, value if key == "first_stage_layers" else first,
                                 value if key == "last_stage_layers" else last)
            if not split.problem:
                options.append((abs(value - written), key, value, split))
    if not options:
        return None
    _, key, value, split = min(options, key=lambda o: (o[0], o[1] != "last_stage_layers", -o[2]))
    return f"{key} = {value} ({describe_split(split.layers)} layers)"


@rule("V205", "pp-divides-layers", enforced_by="megatron", needs_arch=True)
def pp_divides_layers(spec: Spec):
    """The pipeline's stages must split the decoder layers.

    Without train.parallel.first_stage_layers / last_stage_layers every stage builds
    layers ÷ pp: `validate_args` asserts "Number of layers should be divisible by the
    pipeline-model-parallel size". With either (--decoder-first-pipeline-num-layers,
    --decoder-last-pipeline-num-layers) those stages build what is given and the layers left
    split evenly over the stages between, at least one each; with no stage between, first and
    last add up to the layers. megatron-core 0.19.2's `TransformerConfig.__post_init__` raises
    "ValueError: number of layers at middle stage: N must be divisible bythe middle pipeline
    model parallel size M" or "ValueError: Mismatch: N middle layers remaining but M middle PP
    stages available." when the actors build the model, after the queue wait; a first + last
    beyond the layers may pass its modulo (94 − 97 = −3 over 3 middle stages) and build no
    model. vime emits neither --account-for-embedding/loss-in-pipeline-split nor
    --pipeline-model-parallel-layout (which Megatron refuses beside the uneven stages) nor a
    virtual pipeline.
    Fix: a pp that divides the layers, or an uneven first or last stage whose rest splits
    evenly: 94 layers over pp = 4 as 24 + 24 + 24 + 22 is last_stage_layers = 22."""
    par = spec.train.parallel
    layers, pp = spec.arch.num_layers, par.pp
    uneven = par.first_stage_layers is not None or par.last_stage_layers is not None
    if uneven and pp < 2:
        return  # V209's
    split = spec_split(spec)
    if not split.problem:
        return
    fixes = [_megatron_pp_fix(spec, lambda _: True)] if not uneven else []
    if not uneven:
        good = [d for d in divisors(layers) if d < pp]
        fixes.append(f"pp = {max(good)}" if good else "pp = 1")
    fixes.append(_uneven_fix(spec))
    help_line = "; or ".join(dict.fromkeys(f for f in fixes if f)) or "pp = 1"
    if not uneven:
        yield Finding("train.parallel.pp", f"pp = {pp} does not divide the model's {layers} layers",
                      help=help_line)
        return
    written = [f"train.parallel.{name}" for name in ("first_stage_layers", "last_stage_layers")
               if getattr(par, name) is not None]
    yield Finding(written[0], f"the pipeline's stages do not split the model's layers: "
                  f"{split.problem}", help=help_line,
                  related=("train.parallel.pp", *written[1:]))


@rule("V209", "uneven-stages-need-pp", enforced_by="megatron")
def uneven_stages_need_pp(spec: Spec):
    """train.parallel.first_stage_layers and last_stage_layers need a pipeline (pp ≥ 2).

    They set the layers of the first and last pipeline stage (--decoder-first-pipeline-num-
    layers, --decoder-last-pipeline-num-layers). With pp = 1 the one stage is both, and
    megatron-core 0.19.2's `TransformerConfig.__post_init__` raises "ValueError: Mismatch: N
    middle layers remaining but 0 middle PP stages available." unless the count given is every
    layer, when the key does nothing.
    Fix: remove first_stage_layers and last_stage_layers, or set train.parallel.pp ≥ 2."""
    par = spec.train.parallel
    if par.pp >= 2:
        return
    for name in ("first_stage_layers", "last_stage_layers"):
        if getattr(par, name) is not None:
            yield Finding(f"train.parallel.{name}",
                          f"{name} = {getattr(par, name)} with pp = {par.pp}: there is one "
                          "pipeline stage, so no first or last stage to size",
                          help=f"remove train.parallel.{name}, or set train.parallel.pp ≥ 2",
                          related=("train.parallel.pp",))


@rule("V206", "sequence-parallel-needs-tp", severity="warning", enforced_by="megatron")
def sequence_parallel_needs_tp(spec: Spec):
    """Sequence parallelism is on with tp = 1, where it does nothing.

    Sequence parallelism splits the layer-norm and dropout activations over the TP group;
    with tp = 1 there is nothing to split. `validate_args` turns it off with the warning
    "Disabling sequence parallelism because tensor model parallelism is disabled";
    `ModelParallelConfig` alone raises "Cannot use sequence parallelism without tensor
    parallelism".
    Fix: remove sequence_parallel, or raise tp."""
    par = spec.train.parallel
    if par.sequence_parallel and par.tp == 1:
        yield Finding("train.parallel.sequence_parallel",
                      "sequence_parallel = true has no effect with tp = 1",
                      help="set sequence_parallel = false, or tp > 1")


@rule("V207", "ep-with-tp-needs-sp", severity="warning", enforced_by="megatron")
def ep_with_tp_needs_sp(spec: Spec):
    """Expert parallelism with tensor parallelism should use sequence parallelism.

    megatron-core 0.15+ warns "When using expert parallelism and tensor parallelism for
    training, sequence parallelism must be used" (ModelParallelConfig.__post_init__);
    0.14 raised a ValueError. Without it the MoE dispatcher handles tp copies of every
    token, costing memory and all-to-all bandwidth.
    Fix: sequence_parallel = true."""
    par = spec.train.parallel
    if par.ep > 1 and par.tp > 1 and not par.sequence_parallel:
        yield Finding("train.parallel.sequence_parallel",
                      f"ep = {par.ep} with tp = {par.tp} but sequence_parallel is off",
                      help="set sequence_parallel = true", related=("train.parallel.ep",))


@rule("V211", "cpu-offload-needs-precision-aware", enforced_by="megatron")
def cpu_offload_needs_precision_aware(spec: Spec):
    """CPU Adam (optimizer cpu_offload) needs the precision-aware optimizer.

    `validate_args` asserts "The optimizer cpu offload must be used in conjunction with
    `--use-precision-aware-optimizer`, as the hybrid device optimizer reuses the code path
    of this flag." (megatron/training/arguments.py, 0.14 to 0.19).
    Fix: precision_aware = true (and distributed = true, which it needs in turn)."""
    opt = spec.train.optimizer
    if opt.cpu_offload and not opt.precision_aware:
        yield Finding("train.optimizer.cpu_offload",
                      "cpu_offload = true needs precision_aware = true",
                      help="set train.optimizer.precision_aware = true",
                      related=("train.optimizer.precision_aware",))


@rule("V212", "precision-aware-needs-distributed", enforced_by="megatron")
def precision_aware_needs_distributed(spec: Spec):
    """The precision-aware optimizer needs Megatron's distributed optimizer.

    megatron/core/optimizer/__init__.py raises "ValueError: --use-precision-aware-optimizer
    only supported with distributed optimizer" (an assert in OptimizerConfig in 0.14).
    Fix: distributed = true."""
    opt = spec.train.optimizer
    if opt.precision_aware and not opt.distributed:
        yield Finding("train.optimizer.precision_aware",
                      "precision_aware = true needs the distributed optimizer",
                      help="set train.optimizer.distributed = true",
                      related=("train.optimizer.distributed",))


@rule("V213", "overlap-needs-cpu-offload", severity="warning", enforced_by="vime")
def overlap_needs_cpu_offload(spec: Spec):
    """overlap_cpu_optimizer_d2h_h2d only matters with CPU Adam.

    The flag overlaps the device-to-host and host-to-device copies of the hybrid CPU
    optimizer; without cpu_offload Megatron accepts it and ignores it, which usually means
    the spec meant to turn CPU Adam on (or forgot to remove this line when turning it off,
    as the seed does on two nodes).
    Fix: set cpu_offload = true, or remove overlap_cpu_optimizer_d2h_h2d."""
    opt = spec.train.optimizer
    if opt.overlap_cpu_optimizer_d2h_h2d and not opt.cpu_offload:
        yield Finding("train.optimizer.overlap_cpu_optimizer_d2h_h2d",
                      "overlap_cpu_optimizer_d2h_h2d is on but cpu_offload is off",
                      help="remove it, or set cpu_offload = true",
                      related=("train.optimizer.cpu_offload",))


@rule("V215", "megatron-backend-shards-the-optimizer", severity="warning", enforced_by="vime")
def megatron_backend_shards_the_optimizer(spec: Spec):
    """vime's Megatron backend always uses the distributed optimizer.

    runtime/backends/megatron_train.py builds megatron-core's DistributedDataParallel and
    optimizer with use_distributed_optimizer = True: its checkpoints (the dp_reshardable
    optimizer layout), the Adam step-count restore and the offloaded export are written for
    that optimizer and have not run without it. distributed = false would be planned with
    the optimizer state whole on every data-parallel rank and run sharded.
    Fix: remove train.optimizer.distributed (its default is true)."""
    if spec.train.backend == "megatron" and not spec.train.optimizer.distributed:
        yield Finding("train.optimizer.distributed",
                      "vime's Megatron backend always shards the optimizer state over the "
                      "data-parallel ranks: distributed = false is planned unsharded but would "
                      "run sharded", help="remove train.optimizer.distributed (default true)")


@rule("V208", "cp-divides-sequence", enforced_by="megatron")
def cp_divides_sequence(spec: Spec):
    """With context parallelism the sequence length must be a multiple of 2 × cp.

    Context parallelism splits each sequence into 2 × cp chunks (load-balanced causal
    attention). `validate_args` asserts "seq-length should be a multiple of 2 *
    context-parallel-size if context-parallel-size > 1." vime passes --seq-length =
    max_prompt_len + max_response_len.
    Fix: lengths whose sum is a multiple of 2 × cp."""
    cp = spec.train.parallel.cp
    seq = spec.rollout.max_prompt_len + spec.rollout.max_response_len
    if cp > 1 and seq % (2 * cp):
        response = seq - seq % (2 * cp) - spec.rollout.max_prompt_len
        if response >= 1:
            fix = f"max_response_len = {response}"
        else:  # 2 × cp is longer than the sequence: only a smaller cp helps
            fits = [d for d in divisors(seq // 2) if d < cp] if seq % 2 == 0 else []
            fix = f"cp = {max(fits)}" if fits else "cp = 1, or an even max_prompt_len + max_response_len"
        yield Finding("rollout.max_response_len",
                      f"max_prompt_len + max_response_len = {seq} is not a multiple of "
                      f"2 × cp = {2 * cp}", help=fix,
                      related=("train.parallel.cp", "rollout.max_prompt_len"))


@rule("V214", "precision-aware-without-offload-needs-te", severity="warning", enforced_by="megatron")
def precision_aware_without_offload_needs_te(spec: Spec):
    """The precision-aware optimizer without CPU offload runs on Transformer Engine's FusedAdam.

    megatron-core's OptimizerConfig raises "RuntimeError: --use-precision-aware-optimizer
    requires FusedAdam from TransformerEngine, but not found." when TE is not installed
    (megatron/core/optimizer/optimizer_config.py, 0.19.2); with cpu_offload the check is
    skipped (CPU Adam is used instead). vime's Megatron backend passes the flag on as the
    spec writes it (runtime/backends/megatron_train.py). With train.transformer_impl =
    "transformer_engine" the job already needs TE on every node (the backend stops at start
    without it), so this rule says nothing. With "auto" (TE's layer spec where it imports,
    the local one elsewhere) or "local" (whose layers need no TE, though FusedAdam still
    does) the compiler cannot see whether the job's nodes have TE, hence a warning.
    Fix: set train.transformer_impl = "transformer_engine" (which silences this), or make
    sure the job's image has transformer-engine, or set precision_aware = false."""
    opt, impl = spec.train.optimizer, spec.train.transformer_impl
    if opt.precision_aware and not opt.cpu_offload and impl != "transformer_engine":
        why = ("falls back to the local layer spec where TE does not import" if impl == "auto"
               else "needs no TE for the layers")
        yield Finding("train.optimizer.precision_aware",
                      "precision_aware = true without cpu_offload needs Transformer Engine's "
                      f'FusedAdam on every node; transformer_impl = "{impl}" {why}',
                      help='set train.transformer_impl = "transformer_engine" to require TE on '
                      "every node, install transformer-engine in the job's environment, or set "
                      "precision_aware = false",
                      related=("train.optimizer.cpu_offload", "train.transformer_impl"))


def _micro_batch_fix(spec: Spec, pp: int) -> str:
    """A micro_batch_size that gives every stage work, else the global batch that does."""
    train, dp = spec.train, spec.derived.dp
    per_rank = train.global_batch_size // dp
    fits = [size for size in divisors(per_rank) if per_rank // size >= pp]
    if fits and not train.dynamic_batch:
        size = max(fits)
        return (f"micro_batch_size = {size} ({per_rank // size} micro-batches of the "
                f"{per_rank} samples per dp rank)")
    return (f"a global batch of at least pp × dp = {pp} × {dp} = {pp * dp} samples "
            "(fewer steps_per_rollout, or more rollout.batch_size), or a smaller pp")


@rule("V216", "micro-batches-fill-the-pipeline", severity="warning", enforced_by="vime")
def micro_batches_fill_the_pipeline(spec: Spec):
    """A step has fewer micro-batches than pipeline stages: some stages idle.

    Megatron's 1F1B schedule (megatron/core/pipeline_parallel/schedules.py) passes each
    micro-batch through the pp stages one after the other; a step of m micro-batches on each
    data-parallel rank (global batch ÷ (micro_batch_size × dp)) keeps the stages idle
    (pp − 1) ÷ (m + pp − 1) of its time, and with m < pp some stages never work beside the
    others. Megatron runs it without a word. With dynamic_batch each step packs its own
    count (at most one micro-batch a sample), so this warns only when even one sample a
    micro-batch leaves stages idle; `vime plan` states the count at full length.
    Fix: more micro-batches per step: a smaller micro_batch_size, a larger global batch
    (fewer train.steps_per_rollout, a larger rollout.batch_size), or a smaller pp."""
    pp = spec.train.parallel.pp
    if pp < 2 or spec.derived.dp < 1:
        return
    static = micro_batches_per_step(spec)
    train = spec.train
    if static is not None and train.global_batch_size % (train.micro_batch_size * spec.derived.dp):
        return  # V402's: the batch does not split into micro-batches at all
    count = static if static is not None else most_micro_batches(spec)
    if count >= pp:
        return
    bubble = bubble_fraction(pp, count)
    what = (plural(count, "micro-batch", "micro-batches") + " per step" if static is not None
            else plural(count, "sample") + " per step, at most one micro-batch each "
            "(dynamic_batch),")
    yield Finding("train.micro_batch_size" if static is not None else "train.global_batch_size",
                  f"{what} on each dp rank for pp = {pp} stages: the pipeline idles "
                  f"(pp − 1) ÷ (m + pp − 1) = {pp - 1} ÷ {count + pp - 1} = {bubble:.0%} of "
                  "each step", help=_micro_batch_fix(spec, pp),
                  related=("train.parallel.pp", "train.global_batch_size" if static is not None
                           else "train.dynamic_batch"))
