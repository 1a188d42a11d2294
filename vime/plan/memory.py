"""Memory per GPU for training (Megatron) and rollout (vLLM), and host memory per node.

A closed-form model, term by term, for the most loaded GPU (the first pipeline stage, which
also holds the output layer when pp = 1). Each term names what it counts so `vime plan`
can print the breakdown and a user can argue with any line. Sources:
- weights and optimizer: megatron/training/theoretical_memory_usage.py (0.18+ MoE-aware form)
  with the distributed optimizer sharding dense state over dp × cp and expert state over
  edp (shared/reference/megatron.md §3.2, §2.7); precision-aware CPU offload moves the
  fp32 main params and both Adam moments to the host;
- activations: Korthikanti et al. (arXiv 2205.05198) per-token terms, rewritten for flash
  attention (no s² term), grouped-query attention, SwiGLU and top-k MoE dispatch, plus the
  loss head, which computes the log-probs a chunk of tokens at a time (runtime/core/loss_head.py);
- vLLM: the KV-cache budget of v1/worker/gpu_worker.py `determine_available_memory`
  (shared/reference/vllm.md §3.3).
The allowances (CUDA context, NCCL, allocator fragmentation, CUDA graphs) are stated
constants, validated against measurements in docs/memory-validation.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil

from vime.plan.placement import actor_layout
from vime.resolve.model import Arch
from vime.resolve.spec import Spec

GiB = 1024**3
# Allowances, per GPU.
CUDA_CONTEXT = 0.6 * GiB  # CUDA context + cuBLAS/cuDNN workspaces
NCCL_BUFFERS = 1.0 * GiB  # communicators of the tp/dp/ep/pp groups
FRAGMENTATION = 0.10  # caching-allocator slack (reserved over allocated), measured 3-15%
VLLM_NON_TORCH = 1.0 * GiB  # NCCL + custom all-reduce buffers inside a vLLM worker
VLLM_GRAPH_BASE, VLLM_GRAPH_EACH = 0.25 * GiB, 24 * 1024**2  # CUDA graphs: pool + per captured size
VLLM_DEFAULT_CAPTURE_SIZES = 67  # vLLM's default list up to 512 (1, 2, 4, 8..256 by 8, 272..512 by 16)
HEADROOM_WARNING = 0.10
# Ray's object store takes 30% of host memory by default (ray start --object-store-memory).
RAY_OBJECT_STORE_FRACTION = 0.30


@dataclass(frozen=True)
class Term:
    name: str
    bytes: float
    note: str = ""


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
class MemoryPlan:
    gpu_bytes: float
    train: Phase
    rollout: Rollout
    host_terms: tuple[Term, ...] = field(default=())
    host_capacity: float | None = None

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
    """Parameters held by the most loaded actor GPU, split by how the optimizer shards them."""

    dense: float  # tp-sharded and replicated dense parameters (optimizer shard: dp × cp)
    expert: float  # routed experts (optimizer shard: edp)

    @property
    def total(self) -> float:
        return self.dense + self.expert


def actor_shard(spec: Spec) -> ActorShard:
    arch, par = spec.arch, spec.train.parallel
    layers = arch.num_layers / par.pp
    moe_layers = arch.num_moe_layers / par.pp
    dense_layers = layers - moe_layers
    vocab = padded_vocab(arch.vocab_size, par.tp)
    embeddings = (1 if arch.tie_word_embeddings or par.pp > 1 else 2) * arch.hidden_size * vocab
    tp_sharded = (arch.attention_params * layers + arch.dense_mlp_params * dense_layers
                  + embeddings) / par.tp
    replicated = (2 * arch.hidden_size * layers + arch.hidden_size * arch.num_experts * moe_layers
                  + arch.hidden_size)
    expert = arch.expert_params * arch.num_experts * moe_layers / (par.ep * par.etp)
    return ActorShard(dense=tp_sharded + replicated, expert=expert)


def vllm_weight_params(spec: Spec) -> float:
    """Parameters on one vLLM GPU: attention, dense MLPs and vocabulary by TP; routed experts
    by EP (the most loaded rank, redundant experts included) or, without EP, by TP × DP."""
    arch, d = spec.arch, spec.derived
    tp = d.vllm_tp
    heads = 1 if arch.tie_word_embeddings else 2
    dense_layers = arch.num_layers - arch.num_moe_layers
    sharded = (arch.attention_params * arch.num_layers + arch.dense_mlp_params * dense_layers
               + heads * arch.embedding_params) / tp
    replicated = (2 * arch.hidden_size * arch.num_layers
                  + arch.hidden_size * arch.num_experts * arch.num_moe_layers)
    if not arch.is_moe:
        experts = 0.0
    elif spec.inference.expert_parallel:
        redundant = spec.inference.eplb.num_redundant_experts if spec.inference.eplb.enabled else 0
        per_gpu = ceil((arch.num_experts + redundant) / d.vllm_ep)
        experts = per_gpu * arch.expert_params * arch.num_moe_layers
    else:
        experts = arch.num_experts * arch.expert_params * arch.num_moe_layers / (
            tp * spec.inference.data_parallel_size)
    return sharded + replicated + experts


# -- training ------------------------------------------------------------------------------

def _layer_activation_bytes_per_token(arch: Arch, spec: Spec, moe: bool) -> float:
    """Bytes one token leaves in one layer for the backward pass (bf16, flash attention).

    Attention: the layer-norm input and output (split over tp with sequence parallelism),
    q/k/v, their q/k-norm and RoPE outputs, the attention output and its fp32 log-sum-exp.
    MoE: the pre-MLP norm input and output, fp32 router logits and probabilities, and per
    routed copy (top-k): the permuted input, fc1 output (gate and up), the SwiGLU output and
    the fc2 output kept for the probability-weighted unpermute. Calibrated against megatron-core
    on an H200 (docs/memory-validation.md: 155 KiB measured per token per Qwen3-30B-A3B layer).
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
        # with SP each TP rank dispatches its own slice of the tokens
        local = 1 / seq_split
        fm = arch.moe_ffn_hidden_size / par.etp
        mlp = 4 * h / seq_split + local * (8 * arch.num_experts + arch.topk * (4 * h + 6 * fm))
    else:
        mlp = 4 * h / seq_split + 6 * arch.ffn_hidden_size / tp
    return attention + mlp


# The loss head (runtime/core/loss_head.py, issue 18): the log-probs and entropy from the final
# hidden states and the output weight, a chunk of tokens at a time, with no [tokens, vocab]
# tensor (the whole-vocabulary fp32 log-softmax it replaced held 16 bytes per token per
# vocabulary entry, 14.9 measured on an H200: docs/memory-validation.md). What it holds:
# - per token, the hidden states it keeps for the backward (gathered over tp), their gradient
#   and the picked responses' copy, bf16 (3 × 2 bytes per hidden entry), and a few fp32 numbers;
# - one chunk's temporaries: chunk_rows tokens × vocab ÷ tp (× vocab with top-p, whose cut needs
#   the whole row) × the bytes per entry below;
# - during the backward, the output weight's gradient summed over chunks in fp32 and the bf16
#   chunk product added to it, per entry of this rank's [vocab ÷ tp, hidden] weight.
# The constants are the runtime's (tests/test_memory.py keeps them equal), its chunk
# temporaries measured on the CPU (tests/runtime/test_loss_head.py); not yet on a GPU.
LOSS_HEAD_CHUNK_ENTRIES = 2**26
LOSS_HEAD_NUCLEUS_CHUNK_ENTRIES = 2**24
LOSS_HEAD_CHUNK_BYTES = 8
LOSS_HEAD_NUCLEUS_CHUNK_BYTES = 34
LOSS_HEAD_WEIGHT_GRAD_BYTES = 6
LOSS_HEAD_HIDDEN_BYTES = 6  # per token per hidden entry
LOSS_HEAD_TOKEN_BYTES = 64  # per token: fp32 log-prob, entropy, normalisers, int64 target ...


def loss_head(spec: Spec, tokens: int) -> tuple[float, float, str]:
    """(bytes, of which per token, note) of the loss head for `tokens` tokens on one GPU."""
    arch, par = spec.arch, spec.train.parallel
    vocab = padded_vocab(arch.vocab_size, par.tp)
    local = vocab // par.tp
    cut = spec.rollout.top_p < 1 and spec.rollout.temperature > 0  # sampling_top_p's rule
    width, entries, per_entry = ((vocab, LOSS_HEAD_NUCLEUS_CHUNK_ENTRIES,
                                  LOSS_HEAD_NUCLEUS_CHUNK_BYTES) if cut else
                                 (local, LOSS_HEAD_CHUNK_ENTRIES, LOSS_HEAD_CHUNK_BYTES))
    rows = min(max(1, entries // width), tokens)  # tokens per chunk
    chunk = rows * width * per_entry
    weight_grad = LOSS_HEAD_WEIGHT_GRAD_BYTES * local * arch.hidden_size
    per_token = LOSS_HEAD_HIDDEN_BYTES * arch.hidden_size + LOSS_HEAD_TOKEN_BYTES
    over = f"vocab {vocab}" + ("" if cut else f" ÷ tp {par.tp}")
    note = (f"{'top-p ' if cut else ''}chunk {rows} × {over} × {per_entry} B"
            f" + wgrad {weight_grad / GiB:.2f} + {tokens} × {per_token / 1024:.0f} KiB")
    return chunk + weight_grad + tokens * per_token, tokens * per_token, note


def train_phase(spec: Spec, gpu_bytes: float) -> Phase:
    arch, par, opt, train = spec.arch, spec.train.parallel, spec.train.optimizer, spec.train
    d = spec.derived
    shard = actor_shard(spec)
    dense_shards = d.dp * par.cp if opt.distributed else 1
    expert_shards = d.edp if opt.distributed else 1
    optimizer_state = 12 * (shard.dense / dense_shards + shard.expert / expert_shards)
    terms = [
        Term("weights", 2 * shard.total, f"bf16, {shard.total / 1e9:.2f} B params on this GPU"),
        Term("gradients", 4 * shard.total, "fp32 main-grad buffer"),
    ]
    if opt.cpu_offload:
        terms.append(Term("optimizer", 0.0, "fp32 params + Adam moments on the host (CPU Adam)"))
    else:
        where = (f"sharded over dp×cp = {dense_shards} (dense) and edp = {expert_shards} (experts)"
                 if opt.distributed else "not sharded (no distributed optimizer)")
        terms.append(Term("optimizer", optimizer_state, f"fp32 params + 2 moments, {where}"))

    # tokens a GPU processes in one micro-batch
    if train.dynamic_batch:
        tokens = train.max_tokens_per_gpu
        token_note = f"max_tokens_per_gpu {tokens}"
    else:
        seq = spec.rollout.max_prompt_len + spec.rollout.max_response_len
        tokens = train.micro_batch_size * seq // par.cp
        token_note = f"micro batch {train.micro_batch_size} × {seq} tokens ÷ cp {par.cp}"
    layers = arch.num_layers / par.pp
    moe_share = arch.num_moe_layers / arch.num_layers
    per_layer = (moe_share * _layer_activation_bytes_per_token(arch, spec, True)
                 + (1 - moe_share) * _layer_activation_bytes_per_token(arch, spec, False))
    seq_split = par.tp if par.sequence_parallel else 1
    if train.recompute == "full":
        # uniform recompute of 1 layer: each layer keeps its input; one layer is recomputed
        # (and its activations live) at a time during the backward pass
        stored = tokens * (2 * arch.hidden_size / seq_split * layers + per_layer)
        how = "full recompute: layer inputs + one layer"
    else:
        stored = tokens * per_layer * layers
        how = f"{train.recompute} recompute, {layers:g} layers"
    terms.append(Term("activations", stored, f"{token_note}; {how}"))
    # the loss head (the term keeps its name, "logits", for readers of plan.json)
    head, _per_token, note = loss_head(spec, tokens)
    terms.append(Term("logits", head, note))
    allocated = sum(t.bytes for t in terms)
    terms.append(Term("allowance", CUDA_CONTEXT + NCCL_BUFFERS + FRAGMENTATION * allocated,
                      f"CUDA context {CUDA_CONTEXT / GiB:.1f} + NCCL {NCCL_BUFFERS / GiB:.1f} GiB "
                      f"+ {FRAGMENTATION:.0%} fragmentation"))
    if train.colocate:
        terms.append(Term("sleeping engine", _engine_residual(spec),
                          "vLLM asleep (level 1): weights on the host, KV cache freed; "
                          "context and CUDA graphs stay"))
    return Phase("train", tuple(terms), gpu_bytes)


# -- rollout -------------------------------------------------------------------------------

def _graph_bytes(spec: Spec) -> float:
    sizes = spec.inference.cudagraph_capture_sizes
    count = len(sizes) if sizes is not None else VLLM_DEFAULT_CAPTURE_SIZES
    return VLLM_GRAPH_BASE + VLLM_GRAPH_EACH * count


def _engine_residual(spec: Spec) -> float:
    return CUDA_CONTEXT + _graph_bytes(spec)


def _actor_residual(spec: Spec) -> float:
    """What the offloaded actor leaves on a GPU while the engines generate."""
    return CUDA_CONTEXT + NCCL_BUFFERS


def max_num_batched_tokens(gpu_bytes: float) -> int:
    """vLLM's default for the offline LLM class by device memory (vllm.md §3.1)."""
    return 16384 if gpu_bytes >= 70 * GiB else 8192


def rollout_phase(spec: Spec, gpu_bytes: float) -> Rollout:
    arch, d, inf = spec.arch, spec.derived, spec.inference
    weights = 2 * vllm_weight_params(spec)
    batched = max_num_batched_tokens(gpu_bytes)
    h = arch.hidden_size
    experts_active = arch.topk if arch.is_moe else 1
    ffn = arch.moe_ffn_hidden_size if arch.is_moe else arch.ffn_hidden_size / d.vllm_tp
    # profile run: one forward pass of max_num_batched_tokens (hidden states, qkv, MoE
    # workspaces of top-k copies) and the sampler over the vocabulary
    activation = batched * (12 * h + experts_active * (4 * h + 6 * ffn)) + 1024 * arch.vocab_size * 8
    graphs = _graph_bytes(spec)
    budget = ceil(gpu_bytes * inf.gpu_memory_utilization)
    kv = budget - weights - activation - graphs - VLLM_NON_TORCH - CUDA_CONTEXT
    kv_per_token = 2 * arch.num_layers * max(1, arch.num_kv_heads // d.vllm_tp) * arch.head_dim * 2
    kv_tokens = max(int(kv // kv_per_token), 0)
    max_len = spec.rollout.max_prompt_len + spec.rollout.max_response_len
    engines = max(d.num_engines, 1)
    terms = [
        Term("weights", weights, f"bf16, TP {d.vllm_tp}, EP {d.vllm_ep}"),
        Term("activations", activation, f"profile run of {batched} tokens + sampler"),
        Term("cuda graphs", graphs, f"{len(inf.cudagraph_capture_sizes or ()) or 'default'} sizes"),
        Term("context + NCCL", VLLM_NON_TORCH + CUDA_CONTEXT, ""),
        Term("kv cache", max(kv, 0.0), f"{kv_tokens} tokens per DP rank"),
    ]
    if spec.train.colocate:
        terms.append(Term("offloaded actor", _actor_residual(spec),
                          "actor weights, grads and optimizer moved to the host"))
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
                          "fp32 params, 2 moments and fp32 grads, per GPU × GPUs on the node"))
    if spec.train.colocate:
        terms.append(Term("offloaded actor weights", 2 * shard.total * actor_gpus_per_node,
                          "bf16 copy while the engines generate"))
        terms.append(Term("sleeping engine weights", 2 * vllm_weight_params(spec) * gpn,
                          "vLLM sleep level 1 keeps weights on the host"))
    if spec.algorithm.kl_loss_coef > 0:
        terms.append(Term("reference model", 2 * shard.total * actor_gpus_per_node,
                          "bf16 reference weights for the KL term"))
    return tuple(terms)


def uses_torch_backend(spec: Spec) -> bool:
    return "torch" in (spec.train.backend, spec.inference.backend)


@dataclass(frozen=True)
class TorchMemory:
    """The torch backends' fp32 model, whole on each device (runtime/backends/torch_model.py):
    what a rank and an engine hold, activations and the batch's KV not counted."""

    actor_bytes: float  # weights, gradients and two Adam moments
    engine_bytes: float  # weights


def torch_memory(spec: Spec) -> TorchMemory | None:
    if spec.arch is None or not uses_torch_backend(spec):
        return None
    params = spec.arch.params_total
    return TorchMemory(actor_bytes=16 * params, engine_bytes=4 * params)


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
    gpu_bytes = spec.derived.gpu_memory_gib * GiB
    host = spec.cluster.host_memory_gib
    terms = host_terms(spec)
    if host is not None:
        terms += (Term("Ray object store", RAY_OBJECT_STORE_FRACTION * host * GiB,
                       "30% of host memory, Ray's default"),)
    return MemoryPlan(gpu_bytes, train_phase(spec, gpu_bytes), rollout_phase(spec, gpu_bytes),
                      terms, host * GiB if host is not None else None)
