"""Hugging Face Qwen3 / Qwen3-MoE weights <-> megatron-core GPTModel weights (local layer spec).

A mapping of our own rather than mbridge or Megatron-Bridge: Qwen3 needs five rules (renames,
the fused and group-interleaved QKV, gate|up fused into fc1, per-expert modules, untied
head), and keeping them here, in one readable table tested by round trip against the real
GPTModel, costs less than a dependency that pins its own megatron-core and transformers.

Megatron names are those of `GPTModel` built with `get_gpt_decoder_block_spec(...,
use_transformer_engine=False)` at tensor/expert parallel size 1 (full tensors); sharding for
tp/ep > 1 is done by megatron-core's dist-checkpointing when the torch_dist folder is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from vime.resolve.model import Arch

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def _qkv_fuse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: Arch) -> torch.Tensor:
    """Megatron keeps, per KV group, that group's query heads, then its key, then its value."""
    groups, d = arch.num_kv_heads, arch.head_dim
    per_group = arch.num_attention_heads // groups
    hidden = q.shape[-1]
    q = q.view(groups, per_group * d, hidden)
    k = k.view(groups, d, hidden)
    v = v.view(groups, d, hidden)
    return torch.cat([q, k, v], dim=1).reshape(-1, hidden)


def _qkv_split(qkv: torch.Tensor, arch: Arch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, d = arch.num_kv_heads, arch.head_dim
    per_group = arch.num_attention_heads // groups
    hidden = qkv.shape[-1]
    grouped = qkv.view(groups, (per_group + 2) * d, hidden)
    q, k, v = torch.split(grouped, [per_group * d, d, d], dim=1)
    return (q.reshape(-1, hidden).contiguous(), k.reshape(-1, hidden).contiguous(),
            v.reshape(-1, hidden).contiguous())


def hf_to_megatron(hf: Mapping[str, torch.Tensor], arch: Arch) -> dict[str, torch.Tensor]:
    """HF checkpoint tensors (hub names, per-expert) -> GPTModel state dict."""
    out = {
        "embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": hf["model.norm.weight"],
        "output_layer.weight": hf["model.embed_tokens.weight" if arch.tie_word_embeddings
                                  else "lm_head.weight"],
    }
    for i, moe in enumerate(arch.moe_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = src + "self_attn."
        out[dst + "input_layernorm.weight"] = hf[src + "input_layernorm.weight"]
        out[dst + "pre_mlp_layernorm.weight"] = hf[src + "post_attention_layernorm.weight"]
        out[dst + "self_attention.linear_qkv.weight"] = _qkv_fuse(
            hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"], arch)
        out[dst + "self_attention.linear_proj.weight"] = hf[attn + "o_proj.weight"]
        out[dst + "self_attention.q_layernorm.weight"] = hf[attn + "q_norm.weight"]
        out[dst + "self_attention.k_layernorm.weight"] = hf[attn + "k_norm.weight"]
        if moe:
            out[dst + "mlp.router.weight"] = hf[src + "mlp.gate.weight"]
            for e in range(arch.num_experts):
                expert = f"{src}mlp.experts.{e}."
                local = f"{dst}mlp.experts.local_experts.{e}."
                out[local + "linear_fc1.weight"] = torch.cat(
                    [hf[expert + "gate_proj.weight"], hf[expert + "up_proj.weight"]], dim=0)
                out[local + "linear_fc2.weight"] = hf[expert + "down_proj.weight"]
        else:
            out[dst + "mlp.linear_fc1.weight"] = torch.cat(
                [hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"]], dim=0)
            out[dst + "mlp.linear_fc2.weight"] = hf[src + "mlp.down_proj.weight"]
    return out


def megatron_to_hf(mc: Mapping[str, torch.Tensor], arch: Arch) -> dict[str, torch.Tensor]:
    """GPTModel state dict -> HF checkpoint tensors (hub names, per-expert)."""
    out = {
        "model.embed_tokens.weight": mc["embedding.word_embeddings.weight"],
        "model.norm.weight": mc["decoder.final_layernorm.weight"],
    }
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = mc["output_layer.weight"]
    for i, moe in enumerate(arch.moe_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        attn = dst + "self_attn."
        out[dst + "input_layernorm.weight"] = mc[src + "input_layernorm.weight"]
        out[dst + "post_attention_layernorm.weight"] = mc[src + "pre_mlp_layernorm.weight"]
        q, k, v = _qkv_split(mc[src + "self_attention.linear_qkv.weight"], arch)
        out[attn + "q_proj.weight"], out[attn + "k_proj.weight"], out[attn + "v_proj.weight"] = q, k, v
        out[attn + "o_proj.weight"] = mc[src + "self_attention.linear_proj.weight"]
        out[attn + "q_norm.weight"] = mc[src + "self_attention.q_layernorm.weight"]
        out[attn + "k_norm.weight"] = mc[src + "self_attention.k_layernorm.weight"]
        if moe:
            out[dst + "mlp.gate.weight"] = mc[src + "mlp.router.weight"]
            for e in range(arch.num_experts):
                local = f"{src}mlp.experts.local_experts.{e}."
                gate, up = torch.chunk(mc[local + "linear_fc1.weight"], 2, dim=0)
                expert = f"{dst}mlp.experts.{e}."
                out[expert + "gate_proj.weight"] = gate.contiguous()
                out[expert + "up_proj.weight"] = up.contiguous()
                out[expert + "down_proj.weight"] = mc[local + "linear_fc2.weight"]
        else:
            gate, up = torch.chunk(mc[src + "mlp.linear_fc1.weight"], 2, dim=0)
            out[dst + "mlp.gate_proj.weight"] = gate.contiguous()
            out[dst + "mlp.up_proj.weight"] = up.contiguous()
            out[dst + "mlp.down_proj.weight"] = mc[src + "mlp.linear_fc2.weight"]
    return out


def unfuse_experts(hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5 may hold experts fused (`mlp.experts.gate_up_proj` [E, 2F, H],
    `mlp.experts.down_proj` [E, H, F]); give them the hub's per-expert names."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in hf.items():
        found = _LAYER.match(name)
        if found and found[2] == "mlp.experts.gate_up_proj":
            for e, fused in enumerate(tensor):
                gate, up = torch.chunk(fused, 2, dim=0)
                out[f"model.layers.{found[1]}.mlp.experts.{e}.gate_proj.weight"] = gate.contiguous()
                out[f"model.layers.{found[1]}.mlp.experts.{e}.up_proj.weight"] = up.contiguous()
        elif found and found[2] == "mlp.experts.down_proj":
            for e, down in enumerate(tensor):
                out[f"model.layers.{found[1]}.mlp.experts.{e}.down_proj.weight"] = down.contiguous()
        else:
            out[name] = tensor
    return out
