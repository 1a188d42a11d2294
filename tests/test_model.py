import json
from pathlib import Path

import pytest

from vime.resolve.model import PRESETS, ArchError, arch_from_config, moe_layer_pattern


@pytest.mark.parametrize(("preset", "total", "active"), [
    # the model cards: 30.5B / 3.3B, 235B / 22B, 4.0B, 8.2B, 14.8B, 32.8B
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),
    ("qwen3-235b-a22b", 235e9, 22e9),
    ("qwen3-4b", 4.0e9, 4.0e9),
    ("qwen3-8b", 8.2e9, 8.2e9),
    ("qwen3-14b", 14.8e9, 14.8e9),
    ("qwen3-32b", 32.8e9, 32.8e9),
])
def test_parameter_counts_match_the_published_sizes(preset, total, active):
    arch = arch_from_config(PRESETS[preset])
    assert arch.params_total == pytest.approx(total, rel=0.03)
    assert arch.params_active == pytest.approx(active, rel=0.04)


def test_qwen3_30b_exact_count():
    arch = arch_from_config(PRESETS["qwen3-30b-a3b"])
    attention = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 2 * 128
    layer = attention + 2 * 2048 + 2048 * 128 + 128 * 3 * 2048 * 768
    assert arch.params_total == 48 * layer + 2 * 151936 * 2048 + 2048


def test_moe_layer_pattern_follows_transformers():
    assert moe_layer_pattern(4, 8, 2, []) == (False, True, False, True)
    assert moe_layer_pattern(4, 8, 1, [0]) == (False, True, True, True)
    assert moe_layer_pattern(3, 0, 1, []) == (False, False, False)


def test_config_json_keys_and_v5_names():
    config = dict(PRESETS["qwen3-30b-a3b"])
    del config["rope_theta"]
    config["rope_parameters"] = {"rope_theta": 5e6, "rope_type": "default"}
    config["num_local_experts"] = config.pop("num_experts")
    arch = arch_from_config(json.loads(json.dumps(config)))
    assert (arch.num_experts, arch.rope_theta, arch.topk) == (128, 5e6, 8)


@pytest.mark.parametrize(("key", "value"), [("num_hidden_layers", None), ("hidden_size", "2048"),
                                            ("vocab_size", -1), ("mlp_only_layers", "x")])
def test_bad_config_names_the_key(key, value):
    config = dict(PRESETS["qwen3-30b-a3b"])
    if value is None:
        del config[key]
    else:
        config[key] = value
    with pytest.raises(ArchError) as err:
        arch_from_config(config)
    assert err.value.key == key


# -- the DeepSeek-V3 and GLM-4.5 families -------------------------------------------------

CONFIGS = Path(__file__).parent / "fixtures" / "configs"


def _published(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize(("name", "total", "active"), [
    # the model cards: 16B / 3B, 671B / 37B (without the MTP module), 1T / 32B
    ("moonlight_16b_a3b", 16e9, 3e9),
    ("deepseek_v3", 671e9, 37e9),
    ("kimi_k2", 1.0e12, 32e9),
])
def test_deepseek_family_sizes_match_the_model_cards(name, total, active):
    arch = arch_from_config(_published(name))
    assert arch.params_total == pytest.approx(total, rel=0.03)
    assert arch.params_active == pytest.approx(active, rel=0.03)


@pytest.mark.parametrize(("name", "total", "active"), [
    # 355B / 32B and 106B / 12B: GLM's model cards count the MTP layer in the total and
    # leave the two embedding matrices out of the active count
    ("glm_4_5", 355e9, 32e9), ("glm_4_7", 355e9, 32e9), ("glm_4_5_air", 106e9, 12e9),
])
def test_glm_family_sizes_match_the_model_cards(name, total, active):
    arch = arch_from_config(_published(name))
    assert arch.params_total == pytest.approx(total, rel=0.02)
    assert arch.params_active - 2 * arch.embedding_params == pytest.approx(active, rel=0.02)


def test_moonlight_reads_routed_experts_dense_first_layer_and_mla():
    arch = arch_from_config(_published("moonlight_16b_a3b"))
    assert (arch.num_experts, arch.topk, arch.num_moe_layers) == (64, 6, 26)
    assert arch.moe_layers[0] is False and all(arch.moe_layers[1:])
    assert (arch.is_mla, arch.q_lora_rank, arch.kv_lora_rank, arch.head_dim) == (True, 0, 512, 192)
    assert arch.shared_expert_ffn_hidden_size == 2 * 1408
    assert (arch.score_function, arch.expert_bias, arch.routed_scaling_factor) == (
        "sigmoid", True, 2.446)


def test_deepseek_v3_group_limited_routing_and_mtp():
    arch = arch_from_config(_published("deepseek_v3"))
    assert (arch.num_groups, arch.group_topk, arch.mtp_layers) == (8, 4, 1)
    assert arch.moe_layers[:4] == (False, False, False, True)


def test_glm_reads_bias_partial_rotary_and_qk_norm():
    glm, air = arch_from_config(_published("glm_4_5")), arch_from_config(_published("glm_4_5_air"))
    assert (glm.qkv_bias, glm.qk_norm, glm.partial_rotary_factor, glm.is_mla) == (
        True, True, 0.5, False)
    assert (air.qk_norm, air.num_moe_layers, air.shared_expert_ffn_hidden_size) == (False, 45, 1408)


@pytest.mark.parametrize("name", ["deepseek_v3", "moonlight", "glm4_moe", "glm4_moe_air"])
def test_parameter_count_is_transformers_own(name):
    """A small random model of each family, built by transformers: vime's count of the
    config.json vime reads, and of the one transformers writes (v5 keys), is its count."""
    transformers = pytest.importorskip("transformers")
    from moe_families import FAMILIES

    config = FAMILIES[name]
    kind = (transformers.DeepseekV3Config if config["model_type"] == "deepseek_v3"
            else transformers.Glm4MoeConfig)
    hf_config = kind(**{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    model = transformers.AutoModelForCausalLM.from_config(hf_config)
    count = sum(p.numel() for p in model.parameters())
    assert arch_from_config(config).params_total == count
    assert arch_from_config(hf_config.to_dict()).params_total == count


def test_bad_partial_rotary_factor_names_the_key():
    with pytest.raises(ArchError) as err:
        arch_from_config({**_published("glm_4_5"), "partial_rotary_factor": 0})
    assert err.value.key == "partial_rotary_factor"


def test_mixtral_experts_are_intermediate_size_wide():
    # Mixtral-8x7B's config.json (mistralai/Mixtral-8x7B-v0.1): no moe_intermediate_size; every
    # layer's 8 experts are intermediate_size wide. Its card: 46.7 B parameters, 12.9 B active.
    config = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
              "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
              "use_qk_norm": False}
    arch = arch_from_config(config)
    assert arch.moe_ffn_hidden_size == 14336
    assert arch.params_total / 1e9 == pytest.approx(46.7, abs=0.05)
    assert arch.params_active / 1e9 == pytest.approx(12.9, abs=0.05)
