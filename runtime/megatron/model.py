"""Build megatron-core's GPTModel for vime's Arch: Qwen3 / Qwen3-MoE, and the DeepSeek-V3
(MLA, shared experts, sigmoid routing with the expert bias, group-limited routing) and GLM-4.5
(QKV bias, partial rotary, shared experts) families (`_family_args`).

Two layer specs (`choose_transformer_impl`, the spec's train.transformer_impl):
"transformer_engine", megatron-core's TE spec as it is, and "local", with torch's
scaled_dot_product_attention, an RMSNorm that allows sequence parallelism, and
runtime/megatron/grouped_experts.py's GroupedMLP where torch's grouped GEMM works
(`choose_experts`). What each spec changes and why: docs/design.md, "Building the GPTModel".
"""

from __future__ import annotations

import functools
import inspect
import os

import torch
import torch.nn.functional as F

from vime.resolve.model import Arch


class _GatherSequence(torch.autograd.Function):
    """All-gather along the first (sequence) dimension; backward: the sum of every rank's
    gradient for this rank's part (reduce-scatter; all-reduce then this rank's slice where the
    backend has no reduce-scatter, as gloo on the CPU). megatron-core's own gather allocates
    on the GPU, so the CPU oracle could not run it."""

    @staticmethod
    def forward(ctx, local, group):
        ctx.group = group
        out = local.new_empty((local.shape[0] * group.size(), *local.shape[1:]))
        torch.distributed.all_gather_into_tensor(out, local.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        group, grad = ctx.group, grad.contiguous()
        size = grad.shape[0] // group.size()
        if torch.distributed.get_backend(group) == "nccl":
            out = grad.new_empty((size, *grad.shape[1:]))
            torch.distributed.reduce_scatter_tensor(out, grad, group=group)
            return out, None
        grad = grad.clone()
        torch.distributed.all_reduce(grad, group=group)
        return grad[group.rank() * size:(group.rank() + 1) * size], None


def cp_slots(cp: int) -> list[int]:
    """Where chunk j of 2·cp sits when the ranks' halves are gathered in rank order (rank i
    holds chunks i and 2·cp − 1 − i): read the gathered chunks in this order to get the
    sequence back."""
    return [2 * j if j < cp else 2 * (2 * cp - 1 - j) + 1 for j in range(2 * cp)]


class FlashCoreAttention(torch.nn.Module):
    """Drop-in for megatron's core_attention: causal SDPA on [s, b, heads, d] tensors.

    Under context parallelism (cp > 1) every rank holds chunks r and 2·cp − 1 − r of each
    sequence split into 2·cp chunks (megatron's load-balanced order, whose rotary positions
    GPTModel already gives each rank). The keys and values are all-gathered over the
    context-parallel group (backward: reduce-scatter, since every rank's queries use every
    rank's keys), put back in sequence order, and each local chunk attends to the keys up to
    its own end, causal aligned to the lower right.

    Packed rows (PackedSeqParams with qkv_format "thd", the backend's packed micro-batches):
    [t, heads, d] tensors, causal within each sample (packed_attention); cp = 1 only."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type,
                 attention_dropout=None, softmax_scale=None, cp_comm_type=None, pg_collection=None,
                 k_channels=None, v_channels=None):
        # k_channels / v_channels: MLA's query-key and value widths differ (192 and 128 in
        # DeepSeek-V3); SDPA reads both from the tensors
        super().__init__()
        self.config = config
        self.softmax_scale = softmax_scale
        self.cp_group = None
        if config.context_parallel_size > 1:
            self.cp_group = getattr(pg_collection, "cp", None)
            if self.cp_group is None:
                from megatron.core import parallel_state

                self.cp_group = parallel_state.get_context_parallel_group()

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            if self.cp_group is not None:
                raise NotImplementedError(
                    "packed sequences (THD) under context parallelism need Transformer "
                    "Engine's attention; the local spec runs them padded (cp > 1)")
            return packed_attention(query, key, value, packed_seq_params, self.softmax_scale)
        s, b = query.shape[0], query.shape[1]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # -> [b, h, s, d]
        if self.cp_group is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                                 enable_gqa=q.shape[1] != k.shape[1])
        else:
            out = self._context_parallel(q, key, value)
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)

    def _context_parallel(self, q, key, value):
        from torch.nn.attention.bias import causal_lower_right

        cp, rank = self.cp_group.size(), self.cp_group.rank()
        chunk = q.shape[2] // 2
        k, v = (_GatherSequence.apply(t, self.cp_group) for t in (key, value))
        # gathered in rank order: rank i's chunks i and 2cp-1-i; back to sequence order
        k, v = (torch.cat([t[i * chunk:(i + 1) * chunk] for i in cp_slots(cp)]).permute(1, 2, 0, 3)
                for t in (k, v))
        if k.shape[1] != q.shape[1]:  # grouped-query heads, repeated for the lower-right kernels
            k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        halves = []
        for half, position in enumerate((rank, 2 * cp - 1 - rank)):
            end = (position + 1) * chunk
            mine = q[:, :, half * chunk:(half + 1) * chunk]
            halves.append(F.scaled_dot_product_attention(
                mine, k[:, :, :end], v[:, :, :end], attn_mask=causal_lower_right(chunk, end),
                scale=self.softmax_scale))
        return torch.cat(halves, dim=2)


def packed_attention(query, key, value, packed_seq_params, scale=None):
    """Causal attention within each segment of packed [t, heads, d] tensors (megatron's THD
    form: Attention squeezes the batch dimension of one packed row before its core attention),
    the segments given by packed_seq_params.cu_seqlens_q; returns [t, heads · d_v].

    On a GPU in bf16 / fp16: torch's varlen_attn (torch.nn.attention.varlen, Flash Attention's
    variable-length kernel), one call for every segment, whose work is the sum of the
    segments' squared lengths and which keeps no [t, t] mask; grouped-query heads read in
    place where it takes enable_gqa (torch 2.14), repeated where it does not (torch 2.11, the
    H200 machine's: window_size and scale only). Elsewhere (the CPU, fp32): SDPA once per segment with is_causal, the
    same arithmetic as the padded path's one causal SDPA per row. One SDPA call with a
    block-diagonal mask would hold a [t, t] mask (2^28 bytes for a 16k-token row) and run the
    masked kernel over every block, the work of the whole row's square."""
    cu = packed_seq_params.cu_seqlens_q
    options = _varlen_options(scale) if query.is_cuda and \
        query.dtype in (torch.bfloat16, torch.float16) else None
    if options is not None:
        from torch.nn.attention.varlen import varlen_attn

        cu = cu.to(device=query.device, dtype=torch.int32)
        longest = int(packed_seq_params.max_seqlen_q)
        if key.shape[1] != query.shape[1]:
            if "enable_gqa" in options:
                options["enable_gqa"] = True
            else:  # grouped-query heads repeated where the kernel cannot read them in place
                key, value = (t.repeat_interleave(query.shape[1] // t.shape[1], dim=1)
                              for t in (key, value))
        query, key, value = (t.contiguous() for t in (query, key, value))
        out = varlen_attn(query, key, value, cu, cu, longest, longest, **options)
        return out.reshape(out.shape[0], -1)
    bounds = cu.tolist()
    pieces = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end == start:
            continue
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))  # [h, l, d]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                             enable_gqa=q.shape[0] != k.shape[0])
        pieces.append(out.transpose(0, 1))
    out = torch.cat(pieces)
    return out.reshape(out.shape[0], -1)


@functools.lru_cache
def _varlen_signature() -> frozenset[str] | None:
    """The keyword names of this torch's varlen_attn (None: it has none), read once."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return frozenset(inspect.signature(varlen_attn).parameters)


def _varlen_options(scale) -> dict | None:
    """The keyword arguments of causal attention for this torch's varlen_attn, or None where
    it has none or cannot take them: torch 2.14 spells causal window_size=(-1, 0) and takes
    scale and enable_gqa; earlier releases spell it is_causal=True, some without scale."""
    names = _varlen_signature()
    if names is None:
        return None
    if "window_size" in names:
        options: dict = {"window_size": (-1, 0)}
    elif "is_causal" in names:
        options = {"is_causal": True}
    else:
        return None
    if "scale" in names:
        options["scale"] = scale
    elif scale is not None:
        return None
    if "enable_gqa" in names:
        options["enable_gqa"] = False
    return options


class RMSNorm(torch.nn.Module):
    """torch.nn.RMSNorm's arithmetic, built the way megatron-core builds norms."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **_unused):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel

    def forward(self, hidden):
        return F.rms_norm(hidden, (hidden.shape[-1],), self.weight, self.eps)


def _family_args(arch: Arch) -> dict:
    """megatron-core's names for what a DeepSeek-V3 or GLM-4.5 layer has beyond Qwen3's: MLA,
    QKV bias, no q/k norm, shared experts, sigmoid scores with an expert bias, group-limited
    routing and scaled routing weights; empty for a Qwen3 / Qwen3-MoE."""
    args: dict = {}
    if arch.is_mla:  # MLATransformerConfig (megatron/core/transformer/transformer_config.py)
        args.update(multi_latent_attention=True, q_lora_rank=arch.q_lora_rank or None,
                    kv_lora_rank=arch.kv_lora_rank, qk_head_dim=arch.qk_nope_head_dim,
                    qk_pos_emb_head_dim=arch.qk_rope_head_dim, v_head_dim=arch.v_head_dim,
                    rope_type="rope", rotary_base=arch.rope_theta,
                    kv_channels=arch.qk_nope_head_dim + arch.qk_rope_head_dim)
        if arch.rope_scaling is not None:
            # MLASelfAttention builds YarnRotaryEmbedding for rope_type "yarn" and scales its
            # softmax by _yarn_get_mscale(factor, mscale_all_dim)² (multi_latent_attention.py),
            # as transformers' yarn_apply_mscale and vLLM's deepseek_v2.py do
            yarn = arch.rope_scaling
            args.update(rope_type="yarn", rotary_scaling_factor=yarn.factor,
                        original_max_position_embeddings=yarn.original_max_position_embeddings,
                        beta_fast=yarn.beta_fast, beta_slow=yarn.beta_slow, mscale=yarn.mscale,
                        mscale_all_dim=yarn.mscale_all_dim)
    if arch.qkv_bias:
        args["add_qkv_bias"] = True
    if not arch.qk_norm and not arch.is_mla:  # MLA's q/kv latent norms are its qk_layernorm
        args["qk_layernorm"] = False
    if arch.is_moe and arch.shared_expert_ffn_hidden_size:
        args["moe_shared_expert_intermediate_size"] = arch.shared_expert_ffn_hidden_size
    if arch.is_moe and arch.score_function != "softmax":
        # megatron-core renormalises the top-k sigmoid scores (router_utils.py
        # topk_routing_with_score_function), as transformers does for norm_topk_prob
        args.update(moe_router_score_function=arch.score_function, moe_router_pre_softmax=False)
    if arch.is_moe and arch.expert_bias:
        # the checkpoint's e_score_correction_bias, kept as trained: no online update
        args.update(moe_router_enable_expert_bias=True, moe_router_bias_update_rate=0.0)
    if arch.is_moe and arch.num_groups > 1:
        args.update(moe_router_num_groups=arch.num_groups, moe_router_group_topk=arch.group_topk)
    if arch.is_moe and arch.routed_scaling_factor != 1.0:
        args["moe_router_topk_scaling_factor"] = arch.routed_scaling_factor
    return args


def transformer_config(arch: Arch, recompute: str = "none", **overrides):
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )

    recompute_args = {}
    if recompute == "full":
        recompute_args = dict(recompute_granularity="full", recompute_method="uniform",
                              recompute_num_layers=1)
    elif recompute == "selective":
        recompute_args = dict(recompute_granularity="selective")
    moe = {}
    if arch.is_moe:
        moe = dict(num_moe_experts=arch.num_experts, moe_ffn_hidden_size=arch.moe_ffn_hidden_size,
                   moe_router_topk=arch.topk, moe_layer_freq=[int(m) for m in arch.moe_layers],
                   moe_router_pre_softmax=not arch.norm_topk_prob,
                   moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
                   moe_router_dtype="fp32")
    kwargs = dict(
        num_layers=arch.num_layers, hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads, num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim, ffn_hidden_size=arch.ffn_hidden_size,
        normalization="RMSNorm", layernorm_epsilon=arch.rms_norm_eps, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False, qk_layernorm=True,
        hidden_dropout=0.0, attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, attention_softmax_in_fp32=True,
        # alltoall for dense models too: TransformerConfig refuses its default (allgather)
        # with variable_seq_lengths whether or not there are experts ("Token dispatcher type:
        # allgather does not support variable sequence length",
        # tests/runtime/test_megatron_dense.py); a dense model builds no dispatcher
        variable_seq_lengths=True, moe_token_dispatcher_type="alltoall", **moe,
        **recompute_args)
    kwargs.update(_family_args(arch))
    kwargs.update(overrides)
    return (MLATransformerConfig if arch.is_mla else TransformerConfig)(**kwargs)


def _pipeline_rank() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_pipeline_model_parallel_rank()


DISPATCHERS = ("alltoall", "flex")  # the spec's train.moe_token_dispatcher
FLEX_BACKENDS = {"deepep": "Buffer", "hybridep": "HybridEPBuffer"}  # -> what deep_ep must have


def choose_dispatcher(dispatcher: str = "alltoall", flex_backend: str = "deepep") -> dict:
    """megatron-core's TransformerConfig settings for the spec's train.moe_token_dispatcher
    and moe_flex_backend. "flex" needs CUDA and the deep_ep package with the backend's buffer
    (megatron/core/transformer/moe/fused_a2a.py imports it, and the dispatcher stops the
    first MoE layer's build without it, "DeepEP is not installed."); this refuses at start
    instead, naming the key.

    Raises:
        RuntimeError: flex where its kernels cannot run (no CUDA device, deep_ep missing).
        ValueError: a value the schema does not have.
    """
    if dispatcher not in DISPATCHERS:
        raise ValueError(f"train.moe_token_dispatcher = {dispatcher!r}: expected one of "
                         f"{', '.join(DISPATCHERS)}")
    if dispatcher == "alltoall":
        return {"moe_token_dispatcher_type": "alltoall"}
    if flex_backend not in FLEX_BACKENDS:
        raise ValueError(f"train.moe_flex_backend = {flex_backend!r}: expected one of "
                         f"{', '.join(FLEX_BACKENDS)}")
    setting = (f'train.moe_token_dispatcher = "flex" (moe_flex_backend = "{flex_backend}")')
    fix = 'set train.moe_token_dispatcher = "alltoall", which routes the same tokens over NCCL'
    if not torch.cuda.is_available():
        raise RuntimeError(f"{setting}: DeepEP's kernels run on CUDA GPUs, and this node has "
                           f"no CUDA device: {fix}")
    buffer = FLEX_BACKENDS[flex_backend]
    try:
        import deep_ep
    except Exception as error:  # ImportError, or OSError from its CUDA or NVSHMEM libraries
        raise RuntimeError(f"{setting}, but deep_ep does not import on this node "
                           f"({type(error).__name__}: {error}): build DeepEP against this "
                           f"torch and CUDA in the job's environment (`vime doctor SPEC` "
                           f"checks it), or {fix.removeprefix('set ')}") from error
    if not hasattr(deep_ep, buffer):
        raise RuntimeError(f"{setting}, but this node's deep_ep has no {buffer}"
                           + (" (HybridEP is on DeepEP's hybrid-ep branch)"
                              if flex_backend == "hybridep" else "") + f": {fix}")
    settings = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": flex_backend}
    if flex_backend == "hybridep":
        # packed micro-batches give the ranks different token counts, which HybridEP takes
        # only padded to the group's largest (transformer_config.py,
        # moe_hybridep_pad_uneven_dispatch_inputs)
        settings["moe_hybridep_pad_uneven_dispatch_inputs"] = True
    return settings


EXPERTS_ENV = "VIME_MOE_EXPERTS"  # grouped | sequential | auto (unset: auto)
TRANSFORMER_IMPLS = ("auto", "transformer_engine", "local")  # the spec's train.transformer_impl


def choose_transformer_impl(requested: str = "auto") -> tuple[str, str]:
    """("transformer_engine" | "local", why) for the layer spec: "auto" takes Transformer
    Engine's where `transformer_engine.pytorch` imports and CUDA is there, the local spec
    otherwise; "transformer_engine" fails at start, saying why, where it cannot run."""
    if requested not in TRANSFORMER_IMPLS:
        raise ValueError(f"train.transformer_impl = {requested!r}: expected one of "
                         f"{', '.join(TRANSFORMER_IMPLS)}")
    if requested == "local":
        return "local", "asked for (train.transformer_impl = \"local\")"
    reason = None
    if not torch.cuda.is_available():
        reason = "no CUDA device"
    else:
        try:
            import transformer_engine
            import transformer_engine.pytorch  # noqa: F401  (its CUDA libraries load here)
        except Exception as error:  # ImportError, or OSError/RuntimeError from a library
            reason = f"transformer_engine does not import ({type(error).__name__}: {error})"
    if reason is None:
        version = getattr(transformer_engine, "__version__", "?")
        return "transformer_engine", f"transformer_engine {version} imports"
    if requested == "transformer_engine":
        raise RuntimeError(f"train.transformer_impl = \"transformer_engine\", but {reason} on "
                           "this node: install transformer-engine[pytorch] in the job's "
                           "environment, or set train.transformer_impl = \"auto\" or \"local\"")
    return "local", reason


def choose_experts(config, requested: str | None = None,
                   device: torch.device | None = None) -> tuple[str, str]:
    """("grouped" | "sequential", why) for the MoE experts of this config.

    `requested` (else $VIME_MOE_EXPERTS, else "auto"): "auto" takes GroupedMLP where the config
    allows it (grouped_experts.unsupported_reason) and a tiny grouped GEMM forward and backward
    works on the device the model will train on (CUDA when there is one, else the CPU), and
    SequentialMLP otherwise; "sequential" forces SequentialMLP; "grouped" forces GroupedMLP
    and fails where it cannot run. An environment variable rather than a spec key: it reaches
    the training ranks through [cluster.env] like any other. Local spec only: the Transformer
    Engine spec (train.transformer_impl) has TEGroupedMLP."""
    from runtime.megatron import grouped_experts

    requested = requested or os.environ.get(EXPERTS_ENV) or "auto"
    if requested not in ("auto", "grouped", "sequential"):
        raise ValueError(f"{EXPERTS_ENV}={requested!r}: expected grouped, sequential or auto")
    if requested == "sequential":
        return "sequential", f"asked for ({EXPERTS_ENV} or the caller)"
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) \
            if torch.cuda.is_available() else torch.device("cpu")
    etp = config.expert_tensor_parallel_size or config.tensor_model_parallel_size
    reason = grouped_experts.unsupported_reason(config, etp) or grouped_experts.probe(device)
    if reason is None:
        return "grouped", f"torch._grouped_mm on {device.type}, bf16"
    if requested == "grouped":
        raise ValueError(f"{EXPERTS_ENV}=grouped, but the grouped experts cannot run: {reason}")
    return "sequential", reason


def agree_on_impl(impl: str, why: str, group=None) -> None:
    """Fail at start, on every rank, unless every rank of `group` (the default: all) chose the
    same layer spec: "auto" decides on each node, and nodes with and without Transformer
    Engine would build models of different parameters."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size(group) == 1:
        return
    every = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(every, (impl, why), group=group)
    odd = [(rank, choice) for rank, choice in enumerate(every) if choice[0] != every[0][0]]
    if odd:
        rank, (other, reason) = odd[0]
        raise RuntimeError(
            f"the training ranks chose different layer specs: rank 0 {every[0][0]} "
            f"({every[0][1]}), rank {rank} {other} ({reason}), {len(odd)} ranks unlike rank 0: "
            "give every node the same environment, or set train.transformer_impl = \"local\"")


def _log_once(line: str) -> None:
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        print(line, flush=True)


def build_gpt(arch: Arch, config, max_sequence_length: int, pre_process: bool = True,
              post_process: bool = True, experts: str | None = None, impl: str = "local"):
    """GPTModel of the architecture; call under an initialised megatron parallel state. A
    pipeline stage builds its own layers, with the embedding on the first stage
    (pre_process) and the final norm and output layer on the last (post_process). `impl`:
    "local" or "transformer_engine" (choose_transformer_impl's answer). `experts` (local spec
    only): see choose_experts (None: $VIME_MOE_EXPERTS, else auto); the choice is printed
    once, as a `vime:` line."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    if impl == "transformer_engine":
        if arch.is_moe and not config.moe_grouped_gemm:
            raise ValueError("the Transformer Engine spec's experts are TEGroupedMLP: build the "
                             "config with moe_grouped_gemm=True")
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=True,
                                          normalization="RMSNorm", pp_rank=_pipeline_rank())
        if arch.is_mla and not arch.q_lora_rank:
            for layer in spec.layer_specs:
                layer.submodules.self_attention = _query_without_latent(
                    layer.submodules.self_attention)
        _log_once("vime: layer spec: Transformer Engine (TE attention, fused norms"
                  + (", TEGroupedMLP experts)" if arch.is_moe else ")"))
        return _gpt(GPTModel, arch, config, spec, max_sequence_length, pre_process, post_process)
    if impl != "local":
        raise ValueError(f"impl = {impl!r}: expected local or transformer_engine")
    plain = config
    if config.sequence_parallel:  # the local spec's norms refuse it at build time
        import dataclasses

        plain = dataclasses.replace(config, sequence_parallel=False)
    spec = get_gpt_decoder_block_spec(plain, use_transformer_engine=False, normalization="RMSNorm",
                                      pp_rank=_pipeline_rank())
    for layer in spec.layer_specs:
        attention = layer.submodules.self_attention.submodules
        attention.core_attention = FlashCoreAttention
        if arch.is_mla:  # MLASelfAttentionSubmodules: norms of the query and key-value latents
            from megatron.core.transformer.identity_op import IdentityOp

            # no query latent without q_lora_rank (Moonlight): megatron-core refuses a norm
            # there (mla_qk_norm_config.py)
            attention.q_layernorm = RMSNorm if arch.q_lora_rank else IdentityOp
            attention.kv_layernorm = RMSNorm
            if not arch.q_lora_rank:
                layer.submodules.self_attention = _query_without_latent(
                    layer.submodules.self_attention)
        elif arch.qk_norm:
            attention.q_layernorm = attention.k_layernorm = RMSNorm
        layer.submodules.input_layernorm = layer.submodules.pre_mlp_layernorm = RMSNorm
    _log_once("vime: layer spec: local (torch SDPA attention, torch RMSNorm)")
    if arch.is_moe:
        _set_experts(spec, config, experts)
    spec.layer_norm = RMSNorm
    return _gpt(GPTModel, arch, config, spec, max_sequence_length, pre_process, post_process)


def _query_without_latent(attention_spec):
    """MLA's spec with the query projected straight from the hidden states (q_lora_rank null:
    Moonlight, DeepSeek-V2-Lite), as transformers' and vLLM's q_proj: a plain
    column-parallel linear, the key-value latent's norm resolved as megatron-core resolves it.
    megatron-core's QKNormConfigResolver (mla_qk_norm_config.py) builds that projection only
    as a norm-fused linear while the key-value latent has its norm: a second RMSNorm over the
    normed hidden states that the checkpoint does not have, and one the local backend has no
    module for ("qk_layernorm requires TransformerEngine ... to build `linear_q_proj`")."""
    import dataclasses

    from megatron.core.transformer.multi_latent_attention import MLASelfAttention

    built = _query_without_latent_attention()
    if attention_spec.module is built:  # layers share their spec objects
        return attention_spec
    if attention_spec.module is not MLASelfAttention:
        raise RuntimeError(f"the MLA layer spec builds {attention_spec.module}, not "
                           "MLASelfAttention: megatron-core's spec changed "
                           "(runtime/megatron/model.py)")
    return dataclasses.replace(attention_spec, module=built)


@functools.lru_cache
def _query_without_latent_attention():
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.mla_qk_norm_config import QKNormConfigResolver
    from megatron.core.transformer.multi_latent_attention import MLASelfAttention

    class QueryWithoutLatent(MLASelfAttention):
        def _resolve_qk_norm_config(self, submodules):
            resolver = QKNormConfigResolver(self.config, submodules)
            kv_norm = submodules.kv_layernorm or IdentityOp
            kv_up = (resolver._mla_fused_linear_or_default if resolver._is_trivial(kv_norm)
                     else resolver._non_fused_or_default)(submodules.linear_kv_up_proj,
                                                          "linear_kv_up_proj")
            return dict(linear_q_proj=resolver._non_fused_or_default(submodules.linear_q_proj,
                                                                     "linear_q_proj"),
                        linear_q_up_proj=IdentityOp, linear_kv_up_proj=kv_up,
                        q_layernorm=IdentityOp, kv_layernorm=kv_norm)

    return QueryWithoutLatent


def _gpt(GPTModel, arch: Arch, config, spec, max_sequence_length: int, pre_process: bool,
         post_process: bool):
    return GPTModel(config, spec, vocab_size=arch.vocab_size, pre_process=pre_process,
                    post_process=post_process,
                    max_sequence_length=max_sequence_length, position_embedding_type="rope",
                    rotary_base=int(arch.rope_theta), rotary_percent=arch.partial_rotary_factor,
                    share_embeddings_and_output_weights=arch.tie_word_embeddings)


def _set_experts(spec, config, requested: str | None) -> None:
    """Swap SequentialMLP for GroupedMLP in the MoE layers' specs, when chosen; the MLP
    submodules (ColumnParallelLinear, RowParallelLinear) stay, so do the parameters."""
    import dataclasses
    import functools

    from megatron.core.transformer.moe.experts import SequentialMLP

    from runtime.megatron.grouped_experts import GroupedMLP

    kind, why = choose_experts(config, requested)
    chosen = GroupedMLP if kind == "grouped" else SequentialMLP
    for layer in spec.layer_specs:
        mlp = layer.submodules.mlp
        moe = getattr(mlp, "keywords", {}).get("submodules")
        if not hasattr(moe, "experts"):
            continue  # a dense layer
        built = moe.experts
        if not (isinstance(built, functools.partial) and built.func in (SequentialMLP, GroupedMLP)):
            raise RuntimeError(f"the MoE layer spec builds {built}, not SequentialMLP: megatron-"
                               "core's local spec changed (runtime/megatron/model.py)")
        # new spec objects rather than edits: layers may share theirs
        experts = functools.partial(chosen, *built.args, **built.keywords)
        layer.submodules.mlp = functools.partial(
            mlp.func, *mlp.args, **{**mlp.keywords,
                                    "submodules": dataclasses.replace(moe, experts=experts)})
    names = {"grouped": "GroupedMLP (grouped GEMMs)",
             "sequential": "SequentialMLP (a GEMM per expert)"}
    _log_once(f"vime: MoE experts: {names[kind]}: {why}")
