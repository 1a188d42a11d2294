"""Oracle: the HF <-> Megatron weight mapping against a real megatron-core GPTModel (CPU).

The mapping's names and shapes must be exactly the model's state dict (local layer spec,
tp = ep = 1), and HF -> Megatron -> HF must give back the same tensors bit for bit. When
transformers is installed, the HF side is a real Qwen3MoeForCausalLM's state dict too.
"""

from __future__ import annotations

import os
import warnings

import pytest

pytest.importorskip("megatron.core")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from megatroncpu import TINY_MOE  # noqa: E402

from runtime.megatron.mapping import (  # noqa: E402
    hf_to_megatron,
    megatron_names,
    megatron_to_hf,
    unfuse_experts,
)
from vime.resolve.model import arch_from_config  # noqa: E402

# megatroncpu's tiny MoE with a third layer: two MoE layers after the dense one
TINY = {**TINY_MOE, "num_hidden_layers": 3}


@pytest.fixture(scope="module")
def megatron_model():
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    warnings.simplefilter("ignore")
    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29547")
        torch.distributed.init_process_group("gloo", world_size=1, rank=0)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    arch = arch_from_config(TINY)
    config = TransformerConfig(
        num_layers=arch.num_layers, hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads, num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim, ffn_hidden_size=arch.ffn_hidden_size,
        num_moe_experts=arch.num_experts, moe_ffn_hidden_size=arch.moe_ffn_hidden_size,
        moe_router_topk=arch.topk, moe_layer_freq=[int(m) for m in arch.moe_layers],
        moe_token_dispatcher_type="allgather", normalization="RMSNorm", gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, qk_layernorm=True,
        use_cpu_initialization=True)
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    model = GPTModel(config, spec, vocab_size=arch.vocab_size, max_sequence_length=64,
                     position_embedding_type="rope", share_embeddings_and_output_weights=False)
    return arch, model


def _weights(model):
    return {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}


def test_names_and_shapes_are_the_models(megatron_model):
    arch, model = megatron_model
    mc = _weights(model)
    back = hf_to_megatron(megatron_to_hf(mc, arch), arch)
    assert set(back) == set(mc)
    for name, tensor in mc.items():
        assert back[name].shape == tensor.shape, name
        assert torch.equal(back[name], tensor), name
    model.load_state_dict({**model.state_dict(), **back}, strict=True)
    assert megatron_names(arch) == list(mc)  # every weight, in the model's order


def test_qkv_interleaving_puts_each_group_together(megatron_model):
    arch, model = megatron_model
    hf = megatron_to_hf(_weights(model), arch)
    q = torch.arange(arch.num_attention_heads * arch.head_dim).float()[:, None].repeat(1, 64)
    k = -torch.arange(arch.num_kv_heads * arch.head_dim).float()[:, None].repeat(1, 64) - 1
    v = k - 1000
    hf.update({"model.layers.0.self_attn.q_proj.weight": q,
               "model.layers.0.self_attn.k_proj.weight": k,
               "model.layers.0.self_attn.v_proj.weight": v})
    qkv = hf_to_megatron(hf, arch)["decoder.layers.0.self_attention.linear_qkv.weight"][:, 0]
    block = (arch.num_attention_heads // arch.num_kv_heads + 2) * arch.head_dim
    first = qkv[:block]
    d, per_group = arch.head_dim, arch.num_attention_heads // arch.num_kv_heads
    assert torch.equal(first[: per_group * d], q[: per_group * d, 0])  # group 0's queries
    assert torch.equal(first[per_group * d: per_group * d + d], k[:d, 0])  # then its key
    assert torch.equal(first[per_group * d + d:], v[:d, 0])  # then its value


def test_transformers_model_has_the_mapped_names():
    transformers = pytest.importorskip("transformers")
    arch = arch_from_config(TINY)
    config = transformers.Qwen3MoeConfig(**{k: v for k, v in TINY.items() if k != "model_type"})
    hf_model = transformers.Qwen3MoeForCausalLM(config)
    hf = unfuse_experts(hf_model.state_dict())
    mc = hf_to_megatron(hf, arch)
    assert set(megatron_to_hf(mc, arch)) == set(hf)
