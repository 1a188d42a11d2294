"""Reading HF checkpoints a tensor at a time (runtime/megatron/convert.py's HFCheckpoint) and
building Megatron's weights on demand (mapping.MegatronView), against reading everything.

A conversion rank or a Megatron training rank asks only for its own pieces; what it gets
must be what the whole-file path gives. Both layouts transformers writes are covered: the
hub's per-expert tensors and transformers 5's fused expert tensors. The CPU side only: the
GPU side of `vime convert` is in docs/gpu-runs.md.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.megatron.convert import HFCheckpoint, read_hf
from runtime.megatron.mapping import MegatronView, hf_to_megatron, unfuse_experts
from vime.resolve.model import arch_from_config

CONFIG = {
    "model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64,
    "intermediate_size": 48, "moe_intermediate_size": 16, "num_experts": 4,
    "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [0],
    "tie_word_embeddings": False, "max_position_embeddings": 128,
}


def _fused(layers: int, experts: int) -> dict[str, torch.Tensor]:
    """A state dict with experts as transformers 5 may hold them."""
    torch.manual_seed(0)
    out = {"model.embed_tokens.weight": torch.randn(64, 32),
           "model.norm.weight": torch.randn(32), "lm_head.weight": torch.randn(64, 32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out |= {p + "input_layernorm.weight": torch.randn(32),
                p + "post_attention_layernorm.weight": torch.randn(32),
                p + "self_attn.q_proj.weight": torch.randn(32, 32),
                p + "self_attn.k_proj.weight": torch.randn(16, 32),
                p + "self_attn.v_proj.weight": torch.randn(16, 32),
                p + "self_attn.o_proj.weight": torch.randn(32, 32),
                p + "self_attn.q_norm.weight": torch.randn(8),
                p + "self_attn.k_norm.weight": torch.randn(8)}
        if i == 0:
            out |= {p + "mlp.gate_proj.weight": torch.randn(48, 32),
                    p + "mlp.up_proj.weight": torch.randn(48, 32),
                    p + "mlp.down_proj.weight": torch.randn(32, 48)}
        else:
            out |= {p + "mlp.gate.weight": torch.randn(experts, 32),
                    p + "mlp.experts.gate_up_proj": torch.randn(experts, 32, 32),
                    p + "mlp.experts.down_proj": torch.randn(experts, 32, 16)}
    return out


@pytest.mark.parametrize("fused", [True, False], ids=["fused-experts", "per-expert"])
def test_one_tensor_at_a_time_equals_the_whole_files(tmp_path, fused):
    tensors = _fused(2, 4)
    if not fused:
        tensors = unfuse_experts(tensors)
    # two files, as sharded checkpoints are
    names = sorted(tensors)
    save_file({k: tensors[k] for k in names[::2]}, str(tmp_path / "a.safetensors"))
    save_file({k: tensors[k] for k in names[1::2]}, str(tmp_path / "b.safetensors"))
    whole = unfuse_experts({**load_file(tmp_path / "a.safetensors"),
                            **load_file(tmp_path / "b.safetensors")})
    checkpoint = HFCheckpoint(tmp_path)
    assert sorted(checkpoint) == sorted(whole)
    for name, tensor in whole.items():
        assert torch.equal(checkpoint[name], tensor), name
    assert sorted(read_hf(tmp_path)) == sorted(whole)

    arch = arch_from_config(CONFIG)
    eager = hf_to_megatron(whole, arch)
    view = MegatronView(checkpoint, arch)
    assert list(view) == list(eager)
    for name, tensor in eager.items():
        assert torch.equal(view[name], tensor), name


def test_an_expert_is_read_alone(tmp_path):
    tensors = _fused(2, 4)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    checkpoint = HFCheckpoint(tmp_path)
    up = checkpoint["model.layers.1.mlp.experts.2.up_proj.weight"]
    assert up.shape == (16, 32)
    assert torch.equal(up, tensors["model.layers.1.mlp.experts.gate_up_proj"][2, 16:])
    with pytest.raises(KeyError):
        checkpoint["model.layers.1.mlp.experts.4.up_proj.weight"]  # only 4 experts


def test_an_empty_folder_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        HFCheckpoint(tmp_path)
