"""Build megatron-core's GPTModel for a Qwen3 / Qwen3-MoE architecture (vime's Arch).

Uses the local layer spec (no Transformer Engine needed) with two replacements:
- the core attention is torch's scaled_dot_product_attention: the local DotProductAttention
  materialises the [s, s] score matrix, which no real run can afford (shared/reference/
  megatron.md, observed on H200);
- the norms are an RMSNorm that allows sequence parallelism (megatron-core's torch norm
  refuses it, and megatron-core refuses to train MoE with tensor parallelism without it):
  the weights are marked `sequence_parallel`, so that finalize_model_grads sums their
  gradients over the tensor group, as it does for Transformer Engine's norms.
With Transformer Engine installed, real runs should use the TE spec instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vime.resolve.model import Arch


class FlashCoreAttention(torch.nn.Module):
    """Drop-in for megatron's core_attention: causal SDPA on [s, b, heads, d] tensors."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type,
                 attention_dropout=None, softmax_scale=None, cp_comm_type=None, pg_collection=None):
        super().__init__()
        self.config = config
        self.softmax_scale = softmax_scale

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # -> [b, h, s, d]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


class RMSNorm(torch.nn.Module):
    """torch.nn.RMSNorm's arithmetic, built the way megatron-core builds norms."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **_unused):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel

    def forward(self, hidden):
        return F.rms_norm(hidden, (hidden.shape[-1],), self.weight, self.eps)


def transformer_config(arch: Arch, recompute: str = "none", **overrides):
    from megatron.core.transformer.transformer_config import TransformerConfig

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
                   moe_token_dispatcher_type="alltoall", moe_router_load_balancing_type="none",
                   moe_aux_loss_coeff=0.0, moe_router_dtype="fp32")
    kwargs = dict(
        num_layers=arch.num_layers, hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads, num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim, ffn_hidden_size=arch.ffn_hidden_size,
        normalization="RMSNorm", layernorm_epsilon=arch.rms_norm_eps, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False, qk_layernorm=True,
        hidden_dropout=0.0, attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, attention_softmax_in_fp32=True,
        variable_seq_lengths=True, **moe, **recompute_args)
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def build_gpt(arch: Arch, config, max_sequence_length: int):
    """GPTModel with Qwen3's layout; call under an initialised megatron parallel state."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    plain = config
    if config.sequence_parallel:  # the local spec's norms refuse it at build time
        import dataclasses

        plain = dataclasses.replace(config, sequence_parallel=False)
    spec = get_gpt_decoder_block_spec(plain, use_transformer_engine=False, normalization="RMSNorm")
    for layer in spec.layer_specs:
        attention = layer.submodules.self_attention.submodules
        attention.core_attention = FlashCoreAttention
        attention.q_layernorm = attention.k_layernorm = RMSNorm
        layer.submodules.input_layernorm = layer.submodules.pre_mlp_layernorm = RMSNorm
    spec.layer_norm = RMSNorm
    return GPTModel(config, spec, vocab_size=arch.vocab_size,
                    max_sequence_length=max_sequence_length, position_embedding_type="rope",
                    rotary_base=int(arch.rope_theta),
                    share_embeddings_and_output_weights=arch.tie_word_embeddings)
