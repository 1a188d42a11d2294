"""The published checkpoints of the DeepSeek-V3 family (DeepSeek-V3, DeepSeek-R1, Kimi-K2,
Moonlight-16B-A3B) and the GLM-4.5 family (GLM-4.5, 4.5-Air, 4.6, 4.7) plan from their
config.json alone (a folder with it and a tokenizer, tests/fixtures/configs/) and from a
preset, at the layouts their upstream scripts train with
(tests/fixtures/scripts/corpus/slime/scripts/run-*.sh), with memory; V102 names nothing."""

from __future__ import annotations

import json

import pytest
from specsupport import ROOT, codes, run_spec

from vime.resolve.model import PRESETS

CONFIGS = ROOT / "tests" / "fixtures" / "configs"
SPEC = ROOT / "specs" / "qwen3_30b.toml"

# slime's scripts: TP, PP, CP, EP (ETP 1), GPUs per engine, nodes of 8 GPUs, response length,
# max tokens per GPU, and the last pipeline stage's layers where the script sets it
DEEPSEEK_R1 = dict(tp=8, pp=4, cp=4, ep=32, engine=64, nodes=16, response=32768,
                   tokens=16384, last=13)  # run-deepseek-r1.sh
# run-kimi-k2-Instruct.sh, whose SGLang engines of 16 GPUs serve the FP8 release; the weight
# push gives bf16 (V121), and 1.03T parameters in bf16 leave no KV cache on 16 GPUs (V802):
# engines of 32 H200s
KIMI_K2 = dict(tp=8, pp=8, cp=4, ep=32, engine=32, nodes=32, response=32768, tokens=16384,
               last=5, gpu="H200")
MOONLIGHT = dict(tp=4, pp=1, cp=1, ep=8, engine=8, nodes=1, response=4096,
                 tokens=8192)  # run-moonlight-16B-A3B.sh
GLM_355B = dict(tp=8, pp=4, cp=2, ep=16, engine=32, nodes=8, response=32768,
                tokens=16384)  # run-glm4.7-355B-A32B.sh (its node count is the user's: 8)

PUBLISHED = {  # fixture -> (preset, the layout of the script that trains it)
    # DeepSeek-R1 is published with DeepSeek-V3's config.json: one preset holds both
    "deepseek_v3": ("deepseek-r1", DEEPSEEK_R1),
    "deepseek_r1": ("deepseek-r1", DEEPSEEK_R1),
    "kimi_k2": ("kimi-k2-instruct", KIMI_K2),
    "moonlight_16b_a3b": ("moonlight-16b-a3b", MOONLIGHT),
    "glm_4_5": ("glm-4.5", GLM_355B),
    "glm_4_5_air": ("glm-4.5-air", dict(GLM_355B, nodes=4, pp=2, ep=8, engine=16)),
    "glm_4_6": ("glm-4.6", GLM_355B),
    "glm_4_7": ("glm-4.7", GLM_355B),
}


def _sets(layout: dict) -> list[str]:
    sets = [f"cluster.nodes={layout['nodes']}", "cluster.gpus_per_node=8",
            f"train.parallel.tp={layout['tp']}", f"train.parallel.pp={layout['pp']}",
            f"train.parallel.cp={layout['cp']}", f"train.parallel.ep={layout['ep']}",
            "train.parallel.etp=1", f"inference.gpus_per_engine={layout['engine']}",
            f"rollout.max_response_len={layout['response']}",
            f"train.max_tokens_per_gpu={layout['tokens']}"]
    if "gpu" in layout:
        sets.append(f'cluster.gpu="{layout["gpu"]}"')
    if "last" in layout:
        sets.append(f"train.parallel.last_stage_layers={layout['last']}")
    return sets


def _checkpoint(tmp_path, name: str):
    """A folder with the published config.json and a tokenizer, nothing else. DeepSeek-V3/R1
    and Kimi-K2 are published in block FP8, which the weight push cannot update (V121): the
    bf16 release slime's scripts convert to is the same config.json without its
    quantization_config."""
    folder = tmp_path / name
    folder.mkdir()
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1 << 20, "chat_template": "{{ messages }}"}))
    return folder


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_config_plans_at_its_upstream_layout(tmp_path, name):
    _, layout = PUBLISHED[name]
    result = run_spec(SPEC, [f'model.hf_checkpoint="{_checkpoint(tmp_path, name)}"',
                             *_sets(layout)])
    errors = [(d.code, d.message) for d in result.diagnostics if d.severity == "error"]
    assert "V102" not in codes(result) and not errors, errors
    assert result.ok and result.plan is not None
    arch = result.spec.arch
    assert arch.is_moe and result.spec.model_config.origin.kind == "config.json"
    if name in ("deepseek_v3", "deepseek_r1", "kimi_k2"):
        assert arch.rope_scaling is not None and arch.rope_scaling.kind == "yarn"


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_is_the_published_config(name):
    preset, _ = PUBLISHED[name]
    assert preset in PRESETS, f"{preset} is not a preset"
    published = json.loads((CONFIGS / f"{name}.json").read_text())
    from vime.resolve.model import arch_from_config

    assert arch_from_config(PRESETS[preset]) == arch_from_config(published)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_plans_at_its_upstream_layout(name):
    preset, layout = PUBLISHED[name]
    assert preset in PRESETS, f"{preset} is not a preset"
    result = run_spec(SPEC, [f'model.preset="{preset}"', *_sets(layout)])
    errors = [(d.code, d.message) for d in result.diagnostics if d.severity == "error"]
    assert result.spec.model_config.origin.kind == "preset"
    if "quantization_config" in PRESETS[preset]:
        # an FP8 release: the weight push cannot update its engines (V121), and its blocks
        # do not split over the script's engine TP (V119)
        assert "V102" not in codes(result) and set(dict(errors)) <= {"V119", "V121"}, errors
        return
    assert not errors and result.plan is not None and result.plan.memory is not None, errors
