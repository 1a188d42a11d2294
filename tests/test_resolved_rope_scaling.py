"""resolved.toml's [model.arch] is what the runtime builds the Megatron actor from
(MegatronTrainBackend: arch_from_config(slice.model.arch)): every family's architecture read
back from it is the one config.json gave, YaRN's rope_scaling (DeepSeek-V3/R1, Kimi-K2) and
Moonlight's q_lora_rank null with it, so the actor computes what vLLM serves from config.json
(tests/live/test_vllm_mla_variants.py)."""

from __future__ import annotations

import moe_families
import pytest

from vime.emit.resolved import _family_config
from vime.resolve.model import arch_from_config


@pytest.mark.parametrize("name", sorted(moe_families.FAMILIES))
def test_resolved_arch_reads_back_as_config_json(name):
    arch = arch_from_config(moe_families.FAMILIES[name])
    assert arch_from_config(_family_config(arch)) == arch


def test_yarn_is_in_resolved_arch():
    arch = arch_from_config(moe_families.DEEPSEEK_V3_YARN)
    again = arch_from_config(_family_config(arch)).rope_scaling
    assert again is not None and again == arch.rope_scaling
    assert again.factor == 8.0 and again.mscale == 0.9 and again.mscale_all_dim == 1.0
