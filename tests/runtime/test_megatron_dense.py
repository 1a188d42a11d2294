"""A dense Qwen3 (no experts, tied embeddings, as Qwen3-4B) built through the Megatron
backend's own path, runtime/megatron/model.py, on the CPU in one gloo process.

The backend sets variable_seq_lengths (its micro-batches have their own lengths), and
TransformerConfig refuses that with megatron-core's default dispatcher, allgather, even for a
dense model, which has no dispatcher at all ("Token dispatcher type: allgather does not
support variable sequence length, please use alltoall dispatcher instead."): the backend sets
alltoall for dense models too.
"""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core")

import torch  # noqa: E402
from megatroncpu import single_rank_parallel_state  # noqa: E402

from vime.resolve.model import arch_from_config  # noqa: E402

DENSE = {
    "model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 64,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
    "intermediate_size": 96, "tie_word_embeddings": True, "max_position_embeddings": 256,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
}


@pytest.fixture(scope="module")
def parallel_state():
    return single_rank_parallel_state()


def test_dense_config_is_accepted_with_the_backends_arguments():
    from runtime.megatron.model import transformer_config

    arch = arch_from_config(DENSE)
    assert not arch.is_moe
    # the arguments runtime/backends/megatron_train.py passes, for a dense model
    config = transformer_config(arch, "none", tensor_model_parallel_size=1,
                                context_parallel_size=1, expert_model_parallel_size=1,
                                expert_tensor_parallel_size=1, sequence_parallel=False,
                                calculate_per_token_loss=True,
                                moe_enable_routing_replay=False)
    assert config.variable_seq_lengths and config.num_moe_experts is None


def test_dense_model_builds_and_runs_forward_on_cpu(parallel_state, monkeypatch):
    from runtime.megatron.mapping import megatron_to_hf
    from runtime.megatron.model import build_gpt, transformer_config

    arch = arch_from_config(DENSE)
    config = transformer_config(arch, calculate_per_token_loss=True, use_cpu_initialization=True,
                                bf16=False, params_dtype=torch.float32,
                                pipeline_dtype=torch.float32)
    gpt = build_gpt(arch, config, 64)
    names = {k for k in gpt.state_dict() if not k.endswith("_extra_state")}
    assert not any("experts" in n or "router" in n for n in names)
    hf = megatron_to_hf({k: gpt.state_dict()[k] for k in names}, arch)
    assert "lm_head.weight" not in hf and "model.embed_tokens.weight" in hf  # tied
    tokens = torch.arange(2, 18).reshape(2, 8)
    position_ids = torch.arange(8).expand(2, 8)
    # megatron-core's rotary embedding moves its frequencies to torch.cuda.current_device()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    with torch.no_grad():
        logits = gpt(tokens, position_ids, attention_mask=None)
    assert logits.shape == (2, 8, arch.vocab_size) and torch.isfinite(logits).all()
