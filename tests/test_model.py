import json

import pytest

from vime.resolve.model import PRESETS, ArchError, arch_from_config, moe_layer_pattern


@pytest.mark.parametrize(("preset", "total", "active"), [
    # the model cards: 30.5B / 3.3B, 235B / 22B, 4.0B, 8.2B
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),
    ("qwen3-235b-a22b", 235e9, 22e9),
    ("qwen3-4b", 4.0e9, 4.0e9),
    ("qwen3-8b", 8.2e9, 8.2e9),
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
