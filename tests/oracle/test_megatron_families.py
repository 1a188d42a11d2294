"""Oracle: megatron-core's own parameter count of the DeepSeek-V3 and GLM-4.5 families, built
by the runtime's builder (runtime/megatron/model.py: MLA, shared experts, sigmoid routing with
an expert bias, QKV bias, q/k norms as the config says), against vime's count and against
transformers' model of the same config.json. A spawned gloo process of one rank builds them:
megatron-core's alltoall dispatcher asks for CUDA streams, answered on the CPU there."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core")
transformers = pytest.importorskip("transformers")

from megatroncpu import gloo_ranks  # noqa: E402
from moe_families import FAMILIES  # noqa: E402

from vime.resolve.model import arch_from_config  # noqa: E402

# megatron-core 0.19's local spec builds MLA's query projection without a latent
# (q_lora_rank null: Moonlight) only as a norm-fused linear, which it has from Transformer
# Engine alone (megatron/core/transformer/mla_qk_norm_config.py)
BUILT_ON_THE_CPU = ("deepseek_v3", "glm4_moe", "glm4_moe_air")


def _megatron_counts(rank: int, names: tuple[str, ...]) -> dict[str, dict]:
    import torch
    from megatron.core import parallel_state
    from megatroncpu import cpu_streams

    from runtime.megatron.model import build_gpt, transformer_config

    cpu_streams()
    parallel_state.initialize_model_parallel(1, 1)
    counts = {}
    for name in names:
        arch = arch_from_config(FAMILIES[name])
        config = transformer_config(arch, bf16=False, params_dtype=torch.float32,
                                    pipeline_dtype=torch.float32, use_cpu_initialization=True)
        model = build_gpt(arch, config, 256, experts="sequential")
        buffers = {k for k, _ in model.named_buffers()}
        counts[name] = {"params": sum(p.numel() for p in model.parameters()),
                        "expert_bias": any(k.endswith("router.expert_bias") for k in buffers),
                        "qkv_bias": any(k.endswith("linear_qkv.bias") for k, _ in
                                        model.named_parameters())}
    return counts


@pytest.fixture(scope="module")
def megatron_counts():
    return gloo_ranks(_megatron_counts, 1, BUILT_ON_THE_CPU)[0]


def _transformers_count(config: dict) -> int:
    kind = (transformers.DeepseekV3Config if config["model_type"] == "deepseek_v3"
            else transformers.Glm4MoeConfig)
    hf = kind(**{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    return sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(hf).parameters())


@pytest.mark.parametrize("name", BUILT_ON_THE_CPU)
def test_megatron_core_counts_what_vime_and_transformers_count(megatron_counts, name):
    arch = arch_from_config(FAMILIES[name])
    built = megatron_counts[name]
    assert built["params"] == arch.params_total == _transformers_count(FAMILIES[name])
    # the expert bias is a buffer on both sides (megatron-core's router, transformers'
    # e_score_correction_bias): in the model, not among the parameters
    assert built["expert_bias"] is arch.expert_bias is True
    assert built["qkv_bias"] is arch.qkv_bias
