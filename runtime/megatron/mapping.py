"""Hugging Face Qwen3 / Qwen3-MoE, DeepSeek-V3 and GLM-4.5 weights <-> megatron-core GPTModel
weights (local layer spec), for runtime/megatron/convert.py, runtime/megatron/shards.py and
the training backend (runtime/backends/megatron_train.py).

Megatron names are those of `GPTModel` built with `get_gpt_decoder_block_spec(...,
use_transformer_engine=False)` at tensor/expert parallel size 1 (full tensors). Why a mapping
of our own, and what each family adds: docs/design.md, "Hugging Face and Megatron weights".
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from vime.resolve.model import Arch

HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


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


def megatron_tensor(name: str, hf: Mapping[str, torch.Tensor], arch: Arch) -> torch.Tensor:
    """One GPTModel weight (tp = ep = 1) from the HF tensors it is made of; reads only those,
    so a rank that needs a few weights reads a few tensors (see MegatronView)."""
    if name == "output_layer.weight":
        return hf["model.embed_tokens.weight" if arch.tie_word_embeddings else "lm_head.weight"]
    if name in _GLOBALS:
        return hf[_GLOBALS[name]]
    found = _MC_LAYER.match(name)
    if not found:
        raise KeyError(f"no Megatron weight {name}")
    layer, rest = f"model.layers.{found[1]}.", _mla_key(found[2], arch)
    if rest in _RENAMES:
        return hf[layer + _RENAMES[rest]]
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        attn, kind = layer + "self_attn.", rest.rsplit(".", 1)[1]
        fused = _qkv_fuse(*(hf[f"{attn}{p}_proj.{kind}"].reshape(-1, 1 if kind == "bias" else
                                                              arch.hidden_size)
                            for p in "qkv"), arch)
        return fused.reshape(-1) if kind == "bias" else fused
    expert = _MC_EXPERT.match(rest)
    prefix = (f"{layer}mlp.experts.{expert[1]}." if expert else
              layer + "mlp.shared_experts." if rest.startswith("mlp.shared_experts.") else
              layer + "mlp.")
    if rest.endswith("linear_fc2.weight"):
        return hf[prefix + "down_proj.weight"]
    if expert or rest in ("mlp.linear_fc1.weight", "mlp.shared_experts.linear_fc1.weight"):
        return torch.cat([hf[prefix + "gate_proj.weight"], hf[prefix + "up_proj.weight"]], dim=0)
    raise KeyError(f"no Megatron weight {name}")


def _hf_to_megatron_names(arch: Arch) -> list[str]:
    # the head is also given when tied (GPTModel ignores it then; loads use strict=False)
    return megatron_names(arch) + (["output_layer.weight"] if arch.tie_word_embeddings else [])


def hf_to_megatron(hf: Mapping[str, torch.Tensor], arch: Arch) -> dict[str, torch.Tensor]:
    """HF checkpoint tensors (hub names, per-expert) -> GPTModel state dict."""
    return {name: megatron_tensor(name, hf, arch) for name in _hf_to_megatron_names(arch)}


class MegatronView(Mapping):
    """hf_to_megatron(hf, arch) as a mapping whose tensors are built when asked for: over a
    lazily read checkpoint (runtime/megatron/convert.py's HFCheckpoint), a rank reads the
    dense weights and its own experts only, not the whole model."""

    def __init__(self, hf: Mapping[str, torch.Tensor], arch: Arch):
        self.hf, self.arch = hf, arch
        self.names = _hf_to_megatron_names(arch)

    def __getitem__(self, name: str) -> torch.Tensor:
        return megatron_tensor(name, self.hf, self.arch)

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def megatron_names(arch: Arch) -> list[str]:
    """Every weight of the GPTModel at tp = ep = 1, in the model's order."""
    names = ["embedding.word_embeddings.weight"]
    for i, moe in enumerate(arch.moe_layers):
        layer = f"decoder.layers.{i}."
        names += [layer + n for n in ("input_layernorm.weight", *_attention_names(arch),
                                      "pre_mlp_layernorm.weight")]
        if moe:
            names.append(layer + "mlp.router.weight")
            if arch.expert_bias:
                names.append(layer + "mlp.router.expert_bias")
            for e in range(arch.num_experts):
                names += [f"{layer}mlp.experts.local_experts.{e}.linear_fc1.weight",
                          f"{layer}mlp.experts.local_experts.{e}.linear_fc2.weight"]
            if arch.shared_expert_ffn_hidden_size:
                names += [layer + "mlp.shared_experts.linear_fc1.weight",
                          layer + "mlp.shared_experts.linear_fc2.weight"]
        else:
            names += [layer + "mlp.linear_fc1.weight", layer + "mlp.linear_fc2.weight"]
    names.append("decoder.final_layernorm.weight")
    if not arch.tie_word_embeddings:
        names.append("output_layer.weight")
    return names


def _attention_names(arch: Arch) -> tuple[str, ...]:
    """A layer's attention weights, in the model's order."""
    attention = "self_attention."
    if arch.is_mla:
        query = (("linear_q_down_proj.weight", "linear_q_up_proj.weight", "q_layernorm.weight")
                 if arch.q_lora_rank else ("linear_q_proj.weight",))
        return tuple(attention + n for n in (
            "linear_proj.weight", *query, "linear_kv_down_proj.weight",
            "linear_kv_up_proj.weight", "kv_layernorm.weight"))
    return tuple(attention + n for n in (
        "linear_proj.weight", "linear_qkv.weight",
        *(("linear_qkv.bias",) if arch.qkv_bias else ()),
        *(("q_layernorm.weight", "k_layernorm.weight") if arch.qk_norm else ())))


_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.router.weight": "mlp.gate.weight",
    "mlp.router.expert_bias": "mlp.gate.e_score_correction_bias",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.shared_experts.linear_fc2.weight": "mlp.shared_experts.down_proj.weight",
    # multi-head latent attention (DeepSeek-V3)
    "self_attention.linear_q_proj.weight": "self_attn.q_proj.weight",
    "self_attention.linear_q_down_proj.weight": "self_attn.q_a_proj.weight",
    "self_attention.linear_q_up_proj.weight": "self_attn.q_b_proj.weight",
    "self_attention.q_layernorm.weight@mla": "self_attn.q_a_layernorm.weight",
    "self_attention.linear_kv_down_proj.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "self_attention.linear_kv_up_proj.weight": "self_attn.kv_b_proj.weight",
    "self_attention.kv_layernorm.weight": "self_attn.kv_a_layernorm.weight",
}
_GLOBALS = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}
_MC_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def _mla_key(rest: str, arch: Arch) -> str:
    """MLA's query-latent norm has the name of the attention's q/k norm in megatron-core."""
    return rest + "@mla" if arch.is_mla and rest == "self_attention.q_layernorm.weight" else rest
_MC_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")


def tensor_to_hf(name: str, tensor: torch.Tensor, arch: Arch) -> dict[str, torch.Tensor]:
    """One GPTModel weight (tp = ep = 1) -> its HF checkpoint tensors: each Megatron tensor
    maps on its own, so weights can be exported one gathered bucket at a time."""
    if name in _GLOBALS:
        return {_GLOBALS[name]: tensor}
    found = _MC_LAYER.match(name)
    if not found:
        raise KeyError(f"no HF name for {name}")
    layer, rest = f"model.layers.{found[1]}.", _mla_key(found[2], arch)
    if rest in _RENAMES:
        return {layer + _RENAMES[rest]: tensor}
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = rest.rsplit(".", 1)[1]
        parts = _qkv_split(tensor.reshape(-1, 1) if kind == "bias" else tensor, arch)
        return {f"{layer}self_attn.{p}_proj.{kind}": t.reshape(-1) if kind == "bias" else t
                for p, t in zip("qkv", parts, strict=True)}
    expert = _MC_EXPERT.match(rest)
    prefix = (f"{layer}mlp.experts.{expert[1]}." if expert else
              layer + "mlp.shared_experts." if rest.startswith("mlp.shared_experts.") else
              layer + "mlp.")
    if expert and expert[2] == "linear_fc2":
        return {prefix + "down_proj.weight": tensor}
    if expert or rest in ("mlp.linear_fc1.weight", "mlp.shared_experts.linear_fc1.weight"):
        gate, up = torch.chunk(tensor, 2, dim=0)
        return {prefix + "gate_proj.weight": gate.contiguous(),
                prefix + "up_proj.weight": up.contiguous()}
    raise KeyError(f"no HF name for {name}")


def megatron_to_hf(mc: Mapping[str, torch.Tensor], arch: Arch) -> dict[str, torch.Tensor]:
    """GPTModel state dict -> HF checkpoint tensors (hub names, per-expert)."""
    names = megatron_names(arch)
    missing = [n for n in names if n not in mc]
    if missing:
        raise KeyError(f"{len(missing)} Megatron weights missing, first {missing[0]}")
    out: dict[str, torch.Tensor] = {}
    for name in names:
        out.update(tensor_to_hf(name, mc[name], arch))
    return out


def unfuse_experts(hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5 may hold experts fused (`mlp.experts.gate_up_proj` [E, 2F, H],
    `mlp.experts.down_proj` [E, H, F]); give them the hub's per-expert names."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in hf.items():
        found = HF_LAYER.match(name)
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
