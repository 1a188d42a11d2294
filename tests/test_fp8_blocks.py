"""V119: a block-FP8 checkpoint's weights against the engine's tensor parallelism, on the
published config.json files (tests/fixtures/configs/)."""

from __future__ import annotations

import json

import pytest
from specsupport import ROOT, codes, run_spec

from vime.check.model import block_splits, fp8_block_size
from vime.resolve.model import arch_from_config

CONFIGS = ROOT / "tests" / "fixtures" / "configs"
SPEC = ROOT / "specs" / "qwen3_30b.toml"
FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
       "weight_block_size": [128, 128]}


def _config(name: str, **patch) -> dict:
    return {**json.loads((CONFIGS / f"{name}.json").read_text()), **patch}


def _splits(config: dict, tp: int, expert_parallel: bool = True, ignored=()):
    return {(s.weight, s.width, s.every_version)
            for s in block_splits(arch_from_config(config), tp, expert_parallel,
                                  fp8_block_size(config), ignored)}


def test_deepseek_v3_splits_over_16_gpus_not_32():
    config = _config("deepseek_v3")
    assert fp8_block_size(config) == (128, 128)
    assert _splits(config, 16) == set()
    # the shared expert (2048 wide) and the first three layers' MLPs (18432) at TP 32
    assert _splits(config, 32) == {("mlp.down_proj", 576, True),
                                   ("mlp.shared_experts.down_proj", 64, True)}
    assert ("mlp.experts", 64, False) in _splits(config, 32, expert_parallel=False)


def test_glm_4_5_air_fp8_at_tp_8():
    # GLM-4.5-Air-FP8 under TP 8: 1408 ÷ 8 = 176 (vLLM: "Weight input_size_per_partition =
    # 176 is not divisible by weight quantization block_k = 128.")
    config = _config("glm_4_5_air", quantization_config=FP8)
    assert ("mlp.shared_experts.down_proj", 176, True) in _splits(config, 8)
    assert ("mlp.experts", 176, False) in _splits(config, 8, expert_parallel=False)
    # a checkpoint that keeps those modules in bf16 is not checked there
    kept = tuple(f"model.layers.{i}.mlp" for i in range(46))
    assert _splits(config, 8, ignored=kept) == set()


def test_unquantized_and_other_methods_are_not_checked():
    assert fp8_block_size(_config("moonlight_16b_a3b")) is None
    assert fp8_block_size({"quantization_config": {"quant_method": "fp8"}}) is None  # per tensor
    assert fp8_block_size({"quantization_config": {"quant_method": "awq",
                                                   "weight_block_size": [128, 128]}}) is None


def _plan(tmp_path, config: dict, *sets):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return run_spec(SPEC, [f'model.hf_checkpoint="{tmp_path}"', *sets])


def test_qwen3_fp8_without_expert_parallel_warns_on_the_experts(tmp_path):
    config = _config("qwen3_30b_a3b", quantization_config=FP8)
    result = _plan(tmp_path, config, "inference.expert_parallel=false")
    (diag,) = [d for d in result.diagnostics if d.code == "V119"]
    assert diag.severity == "warning" and diag.key == "inference.expert_parallel"
    assert "768" not in diag.message and "96 per GPU" in diag.message
    # TP 2: 768 ÷ 2 = 384, three blocks (TP 4 leaves 192)
    assert diag.help == ("inference.expert_parallel = true, or inference.data_parallel_size = 4 "
                         "(TP 2 × DP 4)")
    assert "V119" not in codes(_plan(tmp_path, config))  # expert_parallel = true: experts whole


def test_glm_air_fp8_error_names_the_weight_and_a_layout_that_fits(tmp_path):
    config = _config("glm_4_5_air", quantization_config=FP8)
    result = _plan(tmp_path, config, "rollout.max_response_len=4096")
    errors = [d for d in result.diagnostics if d.code == "V119" and d.severity == "error"]
    assert {d.key for d in errors} == {"inference.gpus_per_engine"}
    assert any("shared_experts.down_proj: 176 per GPU under vLLM's TP = 8" in d.message
               for d in errors)
    assert errors[0].help == "inference.data_parallel_size = 8 (TP 1 × DP 8)"


@pytest.mark.parametrize("name", ["qwen3_30b_a3b", "glm_4_5_air", "moonlight_16b_a3b"])
def test_bf16_checkpoints_are_silent(tmp_path, name):
    assert "V119" not in codes(_plan(tmp_path, _config(name), "rollout.max_response_len=4096"))
