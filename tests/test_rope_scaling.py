"""YaRN rotary scaling read from config.json and [model.arch]: DeepSeek-V3/R1 and Kimi-K2's
rope_scaling, the context it covers (V125), and what transformers reads the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vime.resolve.model import ArchError, RopeScaling, arch_from_config

CONFIGS = Path(__file__).parent / "fixtures" / "configs"


def _published(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize(("name", "scaling"), [
    ("deepseek_v3", RopeScaling("yarn", 40.0, 4096, 32.0, 1.0, 1.0, 1.0)),
    ("kimi_k2", RopeScaling("yarn", 32.0, 4096, 1.0, 1.0, 1.0, 1.0)),
])
def test_published_yarn_is_read(name, scaling):
    arch = arch_from_config(_published(name))
    assert arch.rope_scaling == scaling
    # the published max_position_embeddings is the scaled context
    assert arch.rope_scaling.max_positions == arch.max_position_embeddings


def test_transformers_v5_rope_parameters_and_defaults():
    config = {**_published("deepseek_v3"), "rope_scaling": None,
              "rope_parameters": {"rope_type": "yarn", "factor": 40, "rope_theta": 10000.0,
                                  "original_max_position_embeddings": 4096}}
    scaling = arch_from_config(config).rope_scaling
    assert scaling == RopeScaling("yarn", 40.0, 4096, 32.0, 1.0, 1.0, 0.0)
    # without original_max_position_embeddings: max_position_embeddings, factor 1 (transformers)
    config["rope_parameters"] = {"rope_type": "yarn"}
    assert arch_from_config(config).rope_scaling.max_positions == config["max_position_embeddings"]


def test_no_scaling_reads_as_none():
    assert arch_from_config(_published("moonlight_16b_a3b")).rope_scaling is None
    plain = {**_published("deepseek_v3"), "rope_scaling": {"type": "default"}}
    assert arch_from_config(plain).rope_scaling is None


def test_a_yarn_value_that_is_not_a_number_names_rope_scaling():
    config = {**_published("deepseek_v3"),
              "rope_scaling": {"type": "yarn", "factor": "forty",
                               "original_max_position_embeddings": 4096}}
    with pytest.raises(ArchError) as error:
        arch_from_config(config)
    assert error.value.key == "rope_scaling" and "forty" in str(error.value)


def test_transformers_reads_the_same_yarn():
    transformers = pytest.importorskip("transformers")
    from moe_families import DEEPSEEK_V3_YARN

    hf = transformers.DeepseekV3Config(**{k: v for k, v in DEEPSEEK_V3_YARN.items()
                                          if k not in ("model_type", "architectures")})
    ours = arch_from_config(DEEPSEEK_V3_YARN).rope_scaling
    params = hf.rope_parameters
    assert (params["factor"], params["original_max_position_embeddings"], params["mscale"],
            params["mscale_all_dim"]) == (ours.factor, ours.original_max_position_embeddings,
                                          ours.mscale, ours.mscale_all_dim)
