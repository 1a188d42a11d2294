"""Memory per GPU for training (Megatron) and rollout (vLLM), and host memory per node.

A closed-form model, term by term, for the most loaded GPU: vime/plan/__init__.py builds the
plan with it, `vime plan` prints its breakdown and vime/check/memory.py judges whether it fits.
Every term carries its Basis (vime/plan/evidence.py). The sources of each term and the
allowances: docs/design.md, "The memory model".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil
from typing import NamedTuple

from vime import flags
from vime.plan import evidence
from vime.plan.evidence import Basis
from vime.plan.placement import actor_layout
from vime.plan.stages import Stage, stages
from vime.plan.torch_memory import TorchMemory, torch_memory, uses_torch_backend  # noqa: F401
from vime.resolve.model import Arch
from vime.resolve.spec import Spec

GiB = 1024**3
# Allowances, per GPU.
# The actor's memory outside torch's caching allocator (CUDA context, cuBLAS workspaces, loaded
# kernels, NCCL's communicators), which neither max_memory_allocated nor max_memory_reserved
# counts: 2.06 GiB measured on every case of vime's own backend step on one H200
# (seven shapes, 4k-24k tokens); a stand-in megatron-core loop held 2.4 GiB on one GPU and
# 3.8-4.4 GiB on each of two, so groups of more than one rank add up to 2.0 GiB (4.4 - 2.4, the
# most seen; docs/memory-validation.md). Not measured beyond two GPUs.
ACTOR_OUTSIDE_TORCH = 2.06 * GiB
ACTOR_NCCL = 2.0 * GiB
FRAGMENTATION = 0.10  # caching-allocator slack (reserved over allocated), measured 2-21%
# A vLLM engine, from its start-up log on an H200 (vLLM 0.26.0, one GPU, 2026-12-01; a tiny
# Qwen3-MoE and a Qwen3-30B-A3B-shaped engine: docs/memory-validation.md). vLLM's budget is
# gpu_memory_utilization × the GPU's memory; the engine's CUDA context is in use before it
# takes the budget (139.29 of 139.8 GiB free at start, both engines) and is not in it, while
# the memory outside torch that appears after its start-up snapshot is (0.22 and 0.24 GiB at
# tp 1). With tp > 1 NCCL's and the custom all-reduce's buffers add to that: not measured.
CUDA_CONTEXT = 0.51 * GiB
VLLM_NON_TORCH = 0.24 * GiB
VLLM_NCCL = 1.0 * GiB
# CUDA graphs: one memory pool for every captured size, captured largest first, so its size
# follows the largest size: a base and bytes per token of it per layer per hidden entry, from
# 0.04 GiB (2 layers, hidden 256, largest 16) and 0.80 GiB (48 layers, hidden 2048, largest
# 512; vLLM's own estimate, which it takes from the budget, was 0.64). vLLM's default sizes go
# up to 2 × max_num_seqs, at most 512.
VLLM_GRAPH_BASE, VLLM_GRAPH_PER_ENTRY = 0.04 * GiB, 16
VLLM_MAX_DEFAULT_CAPTURE = 512
HEADROOM_WARNING = 0.10
# Ray's object store takes 30% of host memory by default (ray start --object-store-memory).
RAY_OBJECT_STORE_FRACTION = 0.30


@dataclass(frozen=True)
class Term:
    name: str
    bytes: float
    note: str = ""
    basis: Basis = evidence.UNMEASURED  # what the term was checked against (vime/plan/evidence.py)
    parts: tuple[Term, ...] = ()  # a sum of parts with bases of their own (the allowance)


@dataclass(frozen=True)
class Phase:
    name: str
    terms: tuple[Term, ...]
    capacity: float  # bytes the phase may use on the GPU

    @property
    def peak(self) -> float:
        return sum(t.bytes for t in self.terms)

    @property
    def headroom(self) -> float:
        return (self.capacity - self.peak) / self.capacity if self.capacity else 0.0

    def by_basis(self) -> dict[str, float]:
        """Bytes of the peak by the kind of their basis (gpu, cpu, estimate); a term made of
        parts counts each part by its own."""
        shares = dict.fromkeys(evidence.KINDS, 0.0)
        for term in self.terms:
            for part in term.parts or (term,):
                shares[part.basis.kind] += part.bytes
        return shares


@dataclass(frozen=True)
class Rollout:
    phase: Phase
    kv_cache_bytes: float
    kv_bytes_per_token: float
    kv_tokens: int  # per data-parallel rank of an engine
    max_len: int
    sequences_at_once: int  # per engine: max-length sequences that fit together
    samples_per_engine: int


@dataclass(frozen=True)
class StageMemory:
    stage: Stage
    peak: float  # bytes of its training step on one of its GPUs


@dataclass(frozen=True)
class MemoryPlan:
    gpu_bytes: float
    train: Phase  # the busiest pipeline stage's (the only stage's at pp = 1)
    rollout: Rollout
    host_terms: tuple[Term, ...] = field(default=())
    host_capacity: float | None = None
    stages: tuple[StageMemory, ...] = ()  # every pipeline stage's peak, first to last
    busiest_stage: int = 0  # the stage whose phase is `train`: the highest peak, the first on a tie

    @property
    def host_per_node(self) -> float:
        return sum(t.bytes for t in self.host_terms)


# -- parameters per GPU --------------------------------------------------------------------

def padded_vocab(vocab: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron's vocab padding (megatron/training/vocab_utils.py)."""
    unit = divisible_by * tp
    return ceil(vocab / unit) * unit


@dataclass(frozen=True)
class ActorShard:
    """Parameters held by one actor GPU, split by how the optimizer shards them."""

    dense: float  # tp-sharded and replicated dense parameters (optimizer shard: dp × cp)
    expert: float  # routed experts (optimizer shard: edp)

    @property
    def total(self) -> float:
        return self.dense + self.expert


def _shard(spec: Spec, layers: float, moe_layers: float, embeddings: int,
           final_norm: bool) -> ActorShard:
    """One GPU's parameters for `layers` decoder layers (`moe_layers` of them MoE), `embeddings`
    vocabulary matrices (word embeddings, output layer) and the final norm where it is held."""
    arch, par = spec.arch, spec.train.parallel
    dense_layers = layers - moe_layers
    vocab = padded_vocab(arch.vocab_size, par.tp)
    tp_sharded = ((arch.attention_params - arch.attention_replicated_params) * layers
                  + arch.dense_mlp_params * dense_layers
                  + arch.shared_expert_params * moe_layers
                  + embeddings * arch.hidden_size * vocab) / par.tp
    replicated = (2 * arch.hidden_size * layers + arch.hidden_size * arch.num_experts * moe_layers
                  + arch.attention_replicated_params * layers
                  + (arch.hidden_size if final_norm else 0))
    expert = arch.expert_params * arch.num_experts * moe_layers / (par.ep * par.etp)
    return ActorShard(dense=tp_sharded + replicated, expert=expert)


def stage_shard(spec: Spec, stage: Stage) -> ActorShard:
    """The parameters of one GPU of pipeline stage `stage`: its own layers, the word embeddings
    on the first stage, the final norm and the output layer on the last (a copy of the
    embeddings when they are tied and pp > 1: megatron-core's embedding group keeps the two in
    step; at pp = 1 tied embeddings are one matrix)."""
    arch, pp = spec.arch, spec.train.parallel.pp
    embeddings = int(stage.embedding) + int(stage.output and (pp > 1 or not arch.tie_word_embeddings))
    return _shard(spec, stage.num_layers, stage.num_moe_layers, embeddings, stage.output)


def actor_shard(spec: Spec) -> ActorShard:
    """The parameters of the actor GPU that holds the most: that of the pipeline stage with the
    most (every stage's with an even split but for the vocabulary matrices and the final
    norm), or layers ÷ pp of each kind where the split is refused (V205, V209)."""
    found = stages(spec)
    if found is None:
        arch, pp = spec.arch, spec.train.parallel.pp
        return _shard(spec, arch.num_layers / pp, arch.num_moe_layers / pp,
                      1 if arch.tie_word_embeddings or pp > 1 else 2, True)
    return max((stage_shard(spec, stage) for stage in found), key=lambda shard: shard.total)


class EngineWeights(NamedTuple):
    """Parameters on one vLLM GPU by how a quantized checkpoint stores them."""

    linear: float  # attention, dense MLP and shared-expert projections
    experts: float  # routed experts' projections
    other: float  # embeddings, output layer, norms, routers: bf16 in every quantized release

    @property
    def total(self) -> float:
        return self.linear + self.experts + self.other


def engine_weights(spec: Spec) -> EngineWeights:
    """Parameters on one vLLM GPU: attention, dense MLPs, shared experts and vocabulary by TP
    (MLA's down projections whole); routed experts by EP (the most loaded rank, redundant
    experts included) or, without EP, by TP × DP."""
    arch, d = spec.arch, spec.derived
    tp = d.vllm_tp
    heads = 1 if arch.tie_word_embeddings else 2
    dense_layers = arch.num_layers - arch.num_moe_layers
    linear = ((arch.attention_params - arch.attention_replicated_params) * arch.num_layers
              + arch.dense_mlp_params * dense_layers
              + arch.shared_expert_params * arch.num_moe_layers) / tp \
        + arch.attention_replicated_params * arch.num_layers
    other = heads * arch.embedding_params / tp + 2 * arch.hidden_size * arch.num_layers \
        + arch.hidden_size * arch.num_experts * arch.num_moe_layers
    if not arch.is_moe:
        experts = 0.0
    elif spec.inference.expert_parallel:
        redundant = spec.inference.eplb.num_redundant_experts if spec.inference.eplb.enabled else 0
        per_gpu = ceil((arch.num_experts + redundant) / d.vllm_ep)
        experts = per_gpu * arch.expert_params * arch.num_moe_layers
    else:
        experts = arch.num_experts * arch.expert_params * arch.num_moe_layers / (
            tp * spec.inference.data_parallel_size)
    return EngineWeights(linear, experts, other)


def vllm_weight_params(spec: Spec) -> float:
    """Parameters on one vLLM GPU (engine_weights, all of them)."""
    return engine_weights(spec).total


# Bytes per weight of a quantized projection, with its scales: FP8 with one fp32 scale per
# 128 × 128 block (DeepSeek-V3's, Kimi-K2's and the -FP8 releases' weight_block_size);
# int4 and other integer widths with a bf16 scale per group of 128 weights (GPTQ's and AWQ's
# group_size 128, slime's OPEN_TRAINING_INT4_GROUP_SIZE 128); MXFP4 with an 8-bit scale per
# 32 (OCP microscaling). Embeddings, the output layer, norms and routers stay bf16.
FP8_WIDTH = 1 + 4 / (128 * 128)
INT4_WIDTH = 0.5 + 2 / 128
MXFP4_WIDTH = 0.5 + 1 / 32


class EngineWidth(NamedTuple):
    linear: float  # bytes per weight of the attention, dense and shared-expert projections
    experts: float  # bytes per weight of the routed experts
    what: str  # in words, for the plan's weights line


def engine_width(spec: Spec) -> EngineWidth:
    """How the engines store their weights: the checkpoint's quantization_config where its
    config.json is read, else inference.quantization, else bf16."""
    config = spec.model_config.values if spec.model_config is not None else {}
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and isinstance(quant.get("quant_method"), str):
        method = quant["quant_method"].lower()
        bits = quant.get("bits") or quant.get("w_bit")
        if method == "compressed-tensors":
            for group in (quant.get("config_groups") or {}).values():
                weights = group.get("weights") if isinstance(group, dict) else None
                if isinstance(weights, dict) and isinstance(weights.get("num_bits"), int):
                    bits = weights["num_bits"]
                    break
        if method == "mxfp4":  # GPT-OSS: the routed experts only
            return EngineWidth(2.0, MXFP4_WIDTH, "MXFP4 experts (quantization_config)")
        if method in ("fp8", "fbgemm_fp8", "ptpc_fp8", "fp8_per_tensor") or bits == 8:
            return EngineWidth(FP8_WIDTH, FP8_WIDTH, f"{method} (quantization_config)")
        if isinstance(bits, int) and not isinstance(bits, bool) and 0 < bits < 16:
            width = bits / 8 + 2 / 128
            return EngineWidth(width, width, f"{method} {bits}-bit (quantization_config)")
    if spec.inference.quantization == "fp8":
        return EngineWidth(FP8_WIDTH, FP8_WIDTH, "FP8 (inference.quantization)")
    if spec.inference.quantization == "int4":
        return EngineWidth(INT4_WIDTH, INT4_WIDTH, "int4 (inference.quantization)")
    return EngineWidth(2.0, 2.0, "bf16")


def vllm_weight_bytes(spec: Spec) -> float:
    """The weights' bytes on one vLLM GPU, each part at the width the engine stores it."""
    params, width = engine_weights(spec), engine_width(spec)
    return params.linear * width.linear + params.experts * width.experts + 2 * params.other


# -- training ------------------------------------------------------------------------------

# runtime/megatron/model.py's switch between the experts' two paths (EXPERTS_ENV there;
# tests/oracle/test_megatron_moe_activations.py keeps the names equal)
EXPERTS_ENV = "VIME_MOE_EXPERTS"
GROUPED_GEMM_ALIGN = 8  # runtime/megatron/grouped_experts.py's _ALIGN: bf16 elements in 16 bytes


class ExpertPath(NamedTuple):
    path: str  # grouped | sequential
    why: str


def expert_path(spec: Spec) -> ExpertPath:
    """The experts the Megatron backend will build, as
    runtime/megatron/model.py's choose_experts decides on the nodes. What the spec shows is
    judged here ([cluster.env]'s VIME_MOE_EXPERTS, grouped_experts.unsupported_reason's widths;
    the backend's weights are bf16 and Qwen3's experts have no bias); the device probe is
    assumed to pass (every card of the planner's table is compute capability 8.0 or newer)."""
    arch, etp = spec.arch, spec.train.parallel.etp
    asked = str(spec.cluster.env.get(EXPERTS_ENV, "auto"))
    if asked == "sequential":
        return ExpertPath("sequential", f"{EXPERTS_ENV} = sequential in [cluster.env]")
    ffn = arch.moe_ffn_hidden_size
    if arch.hidden_size % GROUPED_GEMM_ALIGN or ffn % etp or (ffn // etp) % GROUPED_GEMM_ALIGN:
        return ExpertPath("sequential", f"hidden {arch.hidden_size}, ffn {ffn} ÷ etp {etp}: the "
                                        f"grouped GEMM needs multiples of {GROUPED_GEMM_ALIGN}")
    return ExpertPath("grouped", "torch's grouped GEMM (the backend's default where it runs)")


def routing_imbalance(spec: Spec) -> float:
    """The busiest expert-parallel rank's routed rows over the mean (train.routing_imbalance),
    1 without expert parallelism. Capped where every routed row of a token could go to one
    rank: min(K, experts ÷ ep) of its K rows, against K ÷ ep on average."""
    arch, ep = spec.arch, spec.train.parallel.ep
    if not arch.is_moe or ep == 1:
        return 1.0
    return min(spec.train.routing_imbalance, ep, arch.num_experts / arch.topk)


# Saved for the backward per routed (token, expert) row of an MoE layer, in bytes: the permuted
# input (2·hidden), the fc1 output (4·ffn: gate and up), the SiLU output, the up projection the
# GLU multiplies (+ glu_linear_offset, a new tensor), the GLU product the routing probability
# multiplies, the bf16 weighted product fc2 keeps (2·ffn each), and 24 bytes of routing
# bookkeeping (int64 top-k index and permutation index, fp32 top-k and permuted
# probabilities). Per token of the layer: the router's input (2·hidden, the norm's output) and
# an int64 [tokens, experts] map (8·experts). Counted from megatron-core 0.19's MLP, router and
# alltoall dispatcher and runtime/megatron/grouped_experts.py, and measured equal to the byte
# for SequentialMLP and GroupedMLP on the CPU with a real MoE layer, five shapes
# (tests/oracle/test_megatron_moe_activations.py).
ROUTED_ROW_HIDDEN_BYTES, ROUTED_ROW_FFN_BYTES, ROUTED_ROW_BYTES = 2, 12, 24
ROUTER_EXPERT_BYTES = 8
# A dense MLP per token: fc1's output, the SiLU output, the up projection and the GLU product
# fc2 keeps (4 + 2 + 2 + 2 bytes per ffn entry), its input being the norm's output; measured on
# the CPU (same test).
DENSE_FFN_BYTES = 10


def _layer_activation_bytes_per_token(arch: Arch, spec: Spec, moe: bool,
                                      imbalance: float = 1.0) -> float:
    """Bytes one token leaves in one layer for the backward pass (bf16, flash attention).

    Attention: the layer-norm input and output (split over tp with sequence parallelism),
    q/k/v, their q/k-norm and RoPE outputs, the attention output and its fp32 log-sum-exp
    (the attention part as calibrated on an H200: docs/memory-validation.md). MLP: the
    pre-MLP norm input and output, then the dense MLP's or the MoE layer's own tensors (the
    constants above). With sequence parallelism each TP rank routes its own slice of the
    tokens; with etp > 1 the dispatcher gathers the rows of the etp group, so each rank
    processes etp times its slice's routed rows at ffn ÷ etp (every rank of etp 2 processed all
    T·K rows on an H200: docs/memory-validation.md); `imbalance` scales the routed rows of the busiest EP rank.
    """
    par = spec.train.parallel
    h, d, tp = arch.hidden_size, arch.head_dim, par.tp
    seq_split = tp if par.sequence_parallel else 1
    q, kv = arch.num_attention_heads * d, arch.num_kv_heads * d
    attention = (4 * h / seq_split + 2 * (q + 2 * kv) / tp + 4 * (q + kv) / tp + 2 * q / tp
                 + 4 * arch.num_attention_heads / tp)
    if spec.train.recompute == "selective":
        attention -= 2 * q / tp  # core attention output is recomputed
    if moe:
        local = 1 / seq_split
        rows = local * arch.topk * par.etp * imbalance  # routed rows per token of the batch
        ffn = arch.moe_ffn_hidden_size / par.etp
        mlp = (4 * h / seq_split + local * ROUTER_EXPERT_BYTES * arch.num_experts
               + rows * (ROUTED_ROW_HIDDEN_BYTES * h + ROUTED_ROW_FFN_BYTES * ffn
                         + ROUTED_ROW_BYTES))
    else:
        mlp = 4 * h / seq_split + DENSE_FFN_BYTES * arch.ffn_hidden_size / tp
    return attention + mlp


def _stored_activations(spec: Spec, tokens: int, imbalance: float, stage: Stage) -> float:
    """What `stage` keeps for the backward: its layers' activations for each of the
    micro-batches it holds at the schedule's peak (stage.in_flight, 1 without a pipeline)."""
    arch, par = spec.arch, spec.train.parallel
    layers = stage.num_layers
    moe_share = stage.num_moe_layers / layers
    per_layer = (moe_share * _layer_activation_bytes_per_token(arch, spec, True, imbalance)
                 + (1 - moe_share) * _layer_activation_bytes_per_token(arch, spec, False))
    if spec.train.recompute == "full":
        # uniform recompute of 1 layer: each layer keeps its input; one layer is recomputed
        # (and its activations live) at a time during the backward pass
        seq_split = par.tp if par.sequence_parallel else 1
        return tokens * (2 * arch.hidden_size / seq_split * layers * stage.in_flight + per_layer)
    return tokens * per_layer * layers * stage.in_flight


def expert_stacks(spec: Spec) -> float:
    """GroupedMLP's transient (runtime/megatron/grouped_experts.py): each grouped GEMM stacks
    its projection's local expert weights, and the backward's weight gradient comes stacked
    [E, out, in] until every expert's part is added to its main gradient. The largest is fc1's,
    2·ffn ÷ etp × hidden bf16 per local expert; one at a time (0.83-0.92 of this measured above
    SequentialMLP's peak on the CPU, tests/oracle/test_megatron_moe_activations.py)."""
    arch, par = spec.arch, spec.train.parallel
    return expert_stack_bytes(arch.num_experts / par.ep, arch.moe_ffn_hidden_size / par.etp,
                              arch.hidden_size)


def expert_stack_bytes(local_experts: float, ffn: float, hidden: int) -> float:
    """One stacked bf16 copy of the local experts' fc1 weights ([E, 2·ffn, hidden])."""
    return 2 * local_experts * 2 * ffn * hidden


# torch's AdamW, where megatron-core falls back to it (neither Transformer Engine's nor Apex's
# FusedAdam imports: megatron/core/optimizer/__init__.py). Charged unless train.transformer_impl
# = "transformer_engine", which makes TE import on every node; "auto" and "local" may run where
# neither does, so they keep the conservative number. On CUDA its default foreach path
# (torch/optim/adam.py, _multi_tensor_adam) takes the square root of every second moment of a
# param group into a new fp32 list, 4 bytes per parameter of the group, freed when the step
# ends. Measured: 4.00 bytes per parameter above the resident state on an H200
# (docs/data/h200-megatron-memory-2026-11-29.jsonl, peak_step_gib - resident_gib). vime's
# Megatron backend switches that AdamW to torch's fused kernel on the GPU (megatron_train.py,
# _fuse_adam; VIME_ADAM=foreach keeps foreach), which updates in place: still charged, as an
# upper bound, until its step's peak is measured.
ADAM_STEP_BYTES = 4


def adam_step_transient(spec: Spec, shard: ActorShard | None = None) -> float:
    """Bytes the optimizer step adds on the GPU for a moment, after the backward has freed the
    activations, for the parameters of `shard` (the actor GPU that holds the most by default).
    megatron-core builds one optimizer for expert parameters and one for the rest
    when experts are marked allreduce=False (ep > 1, or etp ≠ tp: tensor_parallel/layers.py)
    and steps them one after the other (ChainedOptimizer), so the larger shard counts; with one
    optimizer, every parameter of this rank's shard."""
    par, opt, d = spec.train.parallel, spec.train.optimizer, spec.derived
    if opt.cpu_offload:
        return 0.0  # HybridDeviceOptimizer: the whole optimizer steps on the host
    if spec.train.transformer_impl == "transformer_engine":
        # TE imports on every node, so megatron-core steps with TE's FusedAdam, whose
        # multi_tensor_adam updates params and moments in place: no per-parameter transient
        # (transformer_engine/pytorch/optimizers/fused_adam.py; not measured)
        return 0.0
    shard = shard or actor_shard(spec)
    dense = shard.dense / (d.dp * par.cp if opt.distributed else 1)
    expert = shard.expert / (d.edp if opt.distributed else 1)
    chained = par.ep > 1 or par.etp != par.tp
    return ADAM_STEP_BYTES * (max(dense, expert) if chained else dense + expert)


def _adam_step_basis(spec: Spec) -> Basis:
    par = spec.train.parallel
    if spec.train.optimizer.cpu_offload:
        return evidence.NO_ADAM_STEP
    if spec.train.transformer_impl == "transformer_engine":
        return evidence.TE_ADAM_STEP
    return evidence.ADAM_STEP_CHAINED if par.ep > 1 or par.etp != par.tp else evidence.ADAM_STEP


# The layer shapes the H200 measured (Qwen3-30B-A3B's): outside them, or at another layout, the
# activation term is an estimate (other shapes were over-predicted: docs/memory-validation.md).
MEASURED_LAYER = {"hidden_size": 2048, "num_attention_heads": 32, "num_kv_heads": 4,
                  "head_dim": 128, "num_experts": 128, "topk": 8, "moe_ffn_hidden_size": 768}


def _activations_basis(spec: Spec, path: str | None) -> Basis:
    arch, par = spec.arch, spec.train.parallel
    measured = (arch.is_moe and all(getattr(arch, k) == v for k, v in MEASURED_LAYER.items())
                and par.tp == par.cp == par.ep == par.etp == 1)
    if not measured:
        return evidence.ACTIVATIONS_UNMEASURED
    return evidence.ACTIVATIONS_GROUPED if path == "grouped" else evidence.ACTIVATIONS_SEQUENTIAL


class OutsideTorch(NamedTuple):
    bytes: float
    basis: Basis


def actor_outside_torch(spec: Spec) -> OutsideTorch:
    """The actor process's memory outside torch's allocator on one GPU, and its basis."""
    gpus = spec.train.num_gpus
    if gpus == 1:
        return OutsideTorch(ACTOR_OUTSIDE_TORCH, evidence.OUTSIDE_TORCH_ONE_GPU)
    basis = evidence.OUTSIDE_TORCH_TWO_GPUS if gpus == 2 else evidence.OUTSIDE_TORCH_MORE_GPUS
    return OutsideTorch(ACTOR_OUTSIDE_TORCH + ACTOR_NCCL, basis)


# The loss head (runtime/core/loss_head.py): the log-probs and entropy from the final
# hidden states and the output weight, a chunk of tokens at a time, with no [tokens, vocab]
# tensor (the whole-vocabulary fp32 log-softmax it replaced held 16 bytes per token per
# vocabulary entry, 14.9 measured on an H200: docs/memory-validation.md). What it holds:
# - per token, the hidden states it keeps for the backward (gathered over tp), their gradient
#   and the picked responses' copy, bf16 (3 × 2 bytes per hidden entry), and a few fp32 numbers;
# - one chunk's temporaries: chunk_rows tokens × vocab ÷ tp (× vocab with top-p, whose cut needs
#   the whole row) × the bytes per entry below;
# - during the backward, per entry of this rank's [vocab ÷ tp, hidden] weight: its gradient in
#   bf16 (the backward goes over the vocabulary a chunk of columns at a time), or with top-p
#   (whose backward goes by tokens) that gradient summed over chunks in fp32 and the bf16 chunk
#   product added to it; and without top-p, per token per hidden entry, the hidden states'
#   gradient summed over the columns' chunks in fp32 and one chunk's bf16 share.
# The constants are the runtime's (tests/test_memory.py keeps them equal), its chunk
# temporaries measured on the CPU (tests/runtime/test_loss_head.py); the whole step on an H200
# (docs/memory-validation.md's grid, before the backward went by columns).
LOSS_HEAD_CHUNK_ENTRIES = 2**26
LOSS_HEAD_NUCLEUS_CHUNK_ENTRIES = 2**24
LOSS_HEAD_CHUNK_BYTES = 8
LOSS_HEAD_NUCLEUS_CHUNK_BYTES = 34
LOSS_HEAD_WEIGHT_GRAD_BYTES = 6  # with top-p
LOSS_HEAD_PLAIN_WEIGHT_GRAD_BYTES = 2  # without
LOSS_HEAD_HIDDEN_BYTES = 6  # per token per hidden entry
LOSS_HEAD_PLAIN_HIDDEN_GRAD_BYTES = 6  # per token per hidden entry, without top-p
LOSS_HEAD_TOKEN_BYTES = 64  # per token: fp32 log-prob, entropy, normalisers, int64 target ...


class LossHead(NamedTuple):
    bytes: float
    token_bytes: float  # the part that grows with the tokens
    note: str


def loss_head(spec: Spec, tokens: int) -> LossHead:
    """The loss head's bytes for `tokens` tokens on one GPU."""
    arch, par = spec.arch, spec.train.parallel
    vocab = padded_vocab(arch.vocab_size, par.tp)
    local = vocab // par.tp
    cut = spec.rollout.top_p < 1 and spec.rollout.temperature > 0  # sampling_top_p's rule
    width, entries, per_entry = ((vocab, LOSS_HEAD_NUCLEUS_CHUNK_ENTRIES,
                                  LOSS_HEAD_NUCLEUS_CHUNK_BYTES) if cut else
                                 (local, LOSS_HEAD_CHUNK_ENTRIES, LOSS_HEAD_CHUNK_BYTES))
    rows = min(max(1, entries // width), tokens)  # tokens per chunk
    chunk = rows * width * per_entry
    weight_grad = (LOSS_HEAD_WEIGHT_GRAD_BYTES if cut else LOSS_HEAD_PLAIN_WEIGHT_GRAD_BYTES) \
        * local * arch.hidden_size
    hidden = LOSS_HEAD_HIDDEN_BYTES + (0 if cut else LOSS_HEAD_PLAIN_HIDDEN_GRAD_BYTES)
    per_token = hidden * arch.hidden_size + LOSS_HEAD_TOKEN_BYTES
    over = f"vocab {vocab}" + ("" if cut else f" ÷ tp {par.tp}")
    note = (f"{'top-p ' if cut else ''}chunk {rows} × {over} × {per_entry} B"
            f" + wgrad {weight_grad / GiB:.2f} + {tokens} × {per_token / 1024:.0f} KiB")
    return LossHead(chunk + weight_grad + tokens * per_token, tokens * per_token, note)


class MicroBatchTokens(NamedTuple):
    tokens: int
    why: str  # how the number was found


def micro_batch_tokens(spec: Spec) -> MicroBatchTokens:
    """Tokens a GPU processes in one micro-batch."""
    train, par = spec.train, spec.train.parallel
    if train.dynamic_batch:
        return MicroBatchTokens(train.max_tokens_per_gpu,
                                f"max_tokens_per_gpu {train.max_tokens_per_gpu}")
    seq = spec.rollout.max_prompt_len + spec.rollout.sample_tokens
    return MicroBatchTokens(train.micro_batch_size * seq // par.cp,
                            f"micro batch {train.micro_batch_size} × {seq} tokens ÷ cp {par.cp}")


# the terms live together at the backward's peak; the optimizer step comes after them
BACKWARD_TERMS = ("activations", "uneven routing", "expert stacks", "logits")


def stage_phase(spec: Spec, gpu_bytes: float, stage: Stage) -> Phase:
    """The training step's memory on one GPU of pipeline stage `stage` (the whole model at
    pp = 1): its own parameters, its layers' activations for the micro-batches it holds at
    once, and the loss head on the last stage only."""
    arch, par, opt, train = spec.arch, spec.train.parallel, spec.train.optimizer, spec.train
    d = spec.derived
    shard = stage_shard(spec, stage)
    dense_shards = d.dp * par.cp if opt.distributed else 1
    expert_shards = d.edp if opt.distributed else 1
    optimizer_state = 12 * (shard.dense / dense_shards + shard.expert / expert_shards)
    static = evidence.STATIC_STATE
    terms = [
        Term("weights", 2 * shard.total, f"bf16, {shard.total / 1e9:.2f} B params on this GPU",
             static),
        Term("gradients", 4 * shard.total, "fp32 main-grad buffer", static),
    ]
    if opt.cpu_offload:
        terms.append(Term("optimizer", 0.0, "fp32 params + Adam moments on the host (CPU Adam)",
                          evidence.CPU_ADAM))
    else:
        where = (f"sharded over dp×cp = {dense_shards} (dense) and edp = {expert_shards} (experts)"
                 if opt.distributed else "not sharded (no distributed optimizer)")
        terms.append(Term("optimizer", optimizer_state, f"fp32 params + 2 moments, {where}",
                          static))

    tokens, token_note = micro_batch_tokens(spec)
    path = expert_path(spec).path if arch.is_moe else None
    imbalance = routing_imbalance(spec)
    balanced = _stored_activations(spec, tokens, 1.0, stage)
    how = ("full recompute: layer inputs + one layer" if train.recompute == "full"
           else f"{train.recompute} recompute, {stage.num_layers:g} layers")
    if stage.in_flight > 1:
        how += f", {stage.in_flight} micro-batches in flight (1F1B)"
    experts = f", {path} experts" if path and stage.num_moe_layers else ""
    backward = [Term("activations", balanced, f"{token_note}{experts}; {how}",
                     _activations_basis(spec, path))]
    if imbalance > 1 and stage.num_moe_layers:
        backward.append(Term("uneven routing",
                             _stored_activations(spec, tokens, imbalance, stage) - balanced,
                             f"busiest EP rank routes {imbalance:g}× the mean rows "
                             "(train.routing_imbalance)", evidence.UNEVEN_ROUTING))
    if path == "grouped" and stage.num_moe_layers:
        backward.append(Term("expert stacks", expert_stacks(spec),
                             f"{arch.num_experts // par.ep} local experts' fc1 weights and "
                             "gradient, stacked", evidence.EXPERT_STACKS))
    if stage.output:
        # the loss head (the term keeps its name, "logits", for readers of plan.json)
        head = loss_head(spec, tokens)
        backward.append(Term("logits", head.bytes, head.note, evidence.LOSS_HEAD))
    terms += backward
    # the step comes after the backward has freed the terms above: it adds what it needs beyond
    step = adam_step_transient(spec, shard)
    working = sum(t.bytes for t in backward)
    if opt.cpu_offload:
        step_note = "CPU Adam: on the host"
    elif train.transformer_impl == "transformer_engine":
        step_note = "TE's FusedAdam (transformer_impl = transformer_engine): updates in place"
    else:
        step_note = (f"AdamW as foreach, {ADAM_STEP_BYTES} B per param: {step / GiB:.1f} GiB at "
                     f"the step, less the backward's {working / GiB:.1f} freed by then; the "
                     "backend's fused AdamW holds none by its code (not measured)")
    terms.append(Term("optimizer step", max(step - working, 0.0), step_note,
                      _adam_step_basis(spec)))
    allocated = sum(t.bytes for t in terms)
    outside = actor_outside_torch(spec)
    parts = (Term("outside torch", outside.bytes, "CUDA context, cuBLAS, NCCL", outside.basis),
             Term("fragmentation", FRAGMENTATION * allocated,
                  f"{FRAGMENTATION:.0%} of the allocated", evidence.FRAGMENTATION))
    terms.append(Term("allowance", sum(p.bytes for p in parts),
                      f"outside torch {outside.bytes / GiB:.2f} GiB (CUDA context, NCCL) "
                      f"+ {FRAGMENTATION:.0%} fragmentation",
                      evidence.weakest(p.basis for p in parts), parts))
    if train.colocate:
        terms.append(Term("sleeping engine", _engine_residual(spec, gpu_bytes),
                          "vLLM asleep (level 1): weights on the host, KV cache freed; "
                          "context and CUDA graphs stay", evidence.SLEEPING_ENGINE))
    return Phase("train", tuple(terms), gpu_bytes)


def train_phases(spec: Spec, gpu_bytes: float, found: tuple[Stage, ...]) -> tuple[Phase, ...]:
    """stage_phase of every stage; stages alike in layers, vocabulary matrices and micro-batches
    in flight share one (a pipeline of thousands of stages has a few kinds)."""
    phases: dict[tuple, Phase] = {}
    out = []
    for stage in found:
        kind = (stage.num_layers, stage.num_moe_layers, stage.embedding, stage.output,
                stage.in_flight)
        if kind not in phases:
            phases[kind] = stage_phase(spec, gpu_bytes, stage)
        out.append(phases[kind])
    return tuple(out)


# -- rollout -------------------------------------------------------------------------------

def _engine_args(spec: Spec) -> list[flags.Arg]:
    """inference.extra_args as vLLM's parser reads them (vime.flags.split: `--max_num_seqs`
    is `--max-num-seqs`)."""
    return [flags.split(arg) for arg in spec.inference.extra_args]


def _engine_int(spec: Spec, flag: str, default: int) -> int:
    """The last `flag=N` of extra_args (the last one wins, as in vLLM's parser), else default."""
    values = [a.value for a in _engine_args(spec) if a.name == flag and a.value is not None]
    return int(values[-1]) if values and values[-1].isdigit() else default


def max_num_seqs(spec: Spec, gpu_bytes: float) -> int:
    """vLLM's max_num_seqs: extra_args', else its default for the offline LLM class by device
    memory (vllm.md §3.1, beside max_num_batched_tokens)."""
    return _engine_int(spec, "--max-num-seqs", 1024 if gpu_bytes >= 70 * GiB else 256)


def _graph_bytes(spec: Spec, gpu_bytes: float) -> float:
    eager = [a.name for a in _engine_args(spec)
             if a.name in ("--enforce-eager", "--no-enforce-eager")]
    if eager and eager[-1] == "--enforce-eager":
        return 0.0
    sizes = spec.inference.cudagraph_capture_sizes
    largest = max(sizes) if sizes else min(2 * max_num_seqs(spec, gpu_bytes),
                                           VLLM_MAX_DEFAULT_CAPTURE)
    arch = spec.arch
    return VLLM_GRAPH_BASE + VLLM_GRAPH_PER_ENTRY * largest * arch.num_layers * arch.hidden_size


def _engine_non_torch(spec: Spec) -> float:
    """Inside vLLM's budget: what its start-up profile sees outside torch."""
    return VLLM_NON_TORCH + (VLLM_NCCL if spec.derived.vllm_tp > 1 else 0.0)


def _engine_residual(spec: Spec, gpu_bytes: float) -> float:
    return CUDA_CONTEXT + _graph_bytes(spec, gpu_bytes)


def _actor_residual(spec: Spec) -> float:
    """What the offloaded actor leaves on a GPU while the engines generate: its memory outside
    torch's allocator (the CUDA context and NCCL's buffers stay)."""
    return actor_outside_torch(spec).bytes


def max_num_batched_tokens(spec: Spec, gpu_bytes: float) -> int:
    """vLLM's max_num_batched_tokens: extra_args', else its default for the offline LLM class
    by device memory (vllm.md §3.1)."""
    return _engine_int(spec, "--max-num-batched-tokens",
                       16384 if gpu_bytes >= 70 * GiB else 8192)


def kv_bytes_per_token(arch: Arch, vllm_tp: int) -> int:
    """bf16 KV cache of one token on one engine GPU. Attention keeps K and V of its KV heads
    (split over TP, at least one head a GPU); MLA keeps one compressed latent of
    kv_lora_rank + qk_rope_head_dim per layer, whole on every TP rank (vLLM's MLA backends,
    vllm/model_executor/layers/attention/mla_attention.py: head_size = kv_lora_rank +
    qk_rope_head_dim, num_kv_heads = 1). Gated DeltaNet layers (Qwen3-Next's linear
    attention) keep no KV: each sequence holds a fixed recurrent state there instead (vLLM's
    mamba-style cache), which is not per token and not counted here."""
    layers = arch.num_layers - arch.num_linear_layers
    if arch.is_mla:
        return layers * (arch.kv_lora_rank + arch.qk_rope_head_dim) * 2
    return 2 * layers * max(1, arch.num_kv_heads // vllm_tp) * arch.head_dim * 2


def rollout_phase(spec: Spec, gpu_bytes: float) -> Rollout:
    arch, d, inf = spec.arch, spec.derived, spec.inference
    weights = vllm_weight_bytes(spec)
    batched = max_num_batched_tokens(spec, gpu_bytes)
    seqs = max_num_seqs(spec, gpu_bytes)
    h = arch.hidden_size
    experts_active = arch.topk if arch.is_moe else 1
    ffn = arch.moe_ffn_hidden_size if arch.is_moe else arch.ffn_hidden_size / d.vllm_tp
    # profile run: one forward pass of max_num_batched_tokens (hidden states, qkv, MoE
    # workspaces of top-k copies) and the sampler over the vocabulary for max_num_seqs rows
    activation = batched * (12 * h + experts_active * (4 * h + 6 * ffn)) \
        + seqs * arch.vocab_size * 8
    graphs = _graph_bytes(spec, gpu_bytes)
    non_torch = _engine_non_torch(spec)
    budget = ceil(gpu_bytes * inf.gpu_memory_utilization)
    kv = budget - weights - activation - graphs - non_torch  # the context is not in the budget
    kv_per_token = kv_bytes_per_token(arch, d.vllm_tp)
    kv_tokens = max(int(kv // kv_per_token), 0)
    max_len = spec.max_model_len
    engines = max(d.num_engines, 1)
    # measured for engines of one GPU (the start-up log); with tp or ep > 1 an estimate
    one_gpu = d.vllm_tp == 1 and not inf.expert_parallel

    def basis(measured: evidence.Basis) -> evidence.Basis:
        return measured if one_gpu else evidence.VLLM

    terms = [
        Term("weights", weights, f"{engine_width(spec).what}, TP {d.vllm_tp}, EP {d.vllm_ep}",
             basis(evidence.VLLM_WEIGHTS)),
        Term("activations", activation,
             f"profile run of {batched} tokens + sampler of {seqs} sequences",
             basis(evidence.VLLM_ACTIVATIONS)),
        Term("cuda graphs", graphs, f"{len(inf.cudagraph_capture_sizes or ()) or 'default'} sizes",
             basis(evidence.VLLM_GRAPHS)),
        Term("context + NCCL", non_torch + CUDA_CONTEXT,
             f"context {CUDA_CONTEXT / GiB:.2f} GiB (not in vLLM's budget) + outside torch "
             f"{non_torch / GiB:.2f}", basis(evidence.VLLM_OUTSIDE)),
        Term("kv cache", max(kv, 0.0), f"{kv_tokens} tokens per DP rank", basis(evidence.VLLM_KV)),
    ]
    if spec.train.colocate:
        terms.append(Term("offloaded actor", _actor_residual(spec),
                          "actor state on the host; its CUDA context and NCCL stay",
                          actor_outside_torch(spec).basis))
    phase = Phase("rollout", tuple(terms), gpu_bytes)
    return Rollout(phase, kv, kv_per_token, kv_tokens, max_len,
                   sequences_at_once=(kv_tokens // max_len) * inf.data_parallel_size,
                   samples_per_engine=ceil(d.samples_per_rollout / engines))


# -- host ----------------------------------------------------------------------------------

def host_terms(spec: Spec) -> tuple[Term, ...]:
    d, opt = spec.derived, spec.train.optimizer
    gpn = spec.cluster.gpus_per_node
    shard = actor_shard(spec)
    actor_gpus_per_node = min(gpn, spec.train.num_gpus)
    terms = []
    if opt.cpu_offload:
        dense_shards = d.dp * spec.train.parallel.cp
        state = 16 * (shard.dense / dense_shards + shard.expert / d.edp)
        terms.append(Term("CPU Adam", state * actor_gpus_per_node,
                          "fp32 params, 2 moments and fp32 grads, per GPU × GPUs on the node",
                          evidence.HOST))
    if spec.train.colocate:
        terms.append(Term("offloaded actor weights", 2 * shard.total * actor_gpus_per_node,
                          "bf16 copy while the engines generate", evidence.HOST))
        terms.append(Term("sleeping engine weights", vllm_weight_bytes(spec) * gpn,
                          "vLLM sleep level 1 keeps weights on the host", evidence.HOST))
    if spec.algorithm.kl_loss_coef > 0:
        terms.append(Term("reference model", 2 * shard.total * actor_gpus_per_node,
                          "bf16 reference weights for the KL term", evidence.HOST))
    return tuple(terms)


def memory_plan(spec: Spec) -> MemoryPlan | None:
    """None when the GPU's memory, the model or a valid layout is missing (other rules say
    why), and for the torch backends: this model is of Megatron's and vLLM's memory (bf16
    weights, KV cache, CUDA graphs, sleep mode), which they do not have (torch_memory)."""
    d = spec.derived
    if spec.arch is None or d.gpu_memory_gib is None or min(d.dp, d.edp, d.num_engines) < 1:
        return None
    if uses_torch_backend(spec):
        return None
    if actor_layout(spec).problems():
        return None
    found = stages(spec)
    if found is None:
        return None
    gpu_bytes = spec.derived.gpu_memory_gib * GiB
    host = spec.cluster.host_memory_gib
    terms = host_terms(spec)
    if host is not None:
        terms += (Term("Ray object store", RAY_OBJECT_STORE_FRACTION * host * GiB,
                       "30% of host memory, Ray's default", evidence.HOST),)
    phases = train_phases(spec, gpu_bytes, found)
    busiest = max(range(len(phases)), key=lambda index: (phases[index].peak, -index))
    return MemoryPlan(gpu_bytes, phases[busiest], rollout_phase(spec, gpu_bytes),
                      terms, host * GiB if host is not None else None,
                      tuple(StageMemory(stage, phase.peak) for stage, phase in zip(
                          found, phases, strict=True)), busiest)
