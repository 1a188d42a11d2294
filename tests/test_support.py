"""The support matrix (V102) and [model.arch] against config.json (V103), on config.json
files written after the Hugging Face hub's (tests/fixtures/configs/)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from specsupport import ROOT, codes, run_spec

from vime.cli import main

CONFIGS = ROOT / "tests" / "fixtures" / "configs"
SPEC = ROOT / "specs" / "qwen3_30b.toml"


def _checkpoint(tmp_path, name: str, **patch):
    folder = tmp_path / name
    folder.mkdir()
    config = {**json.loads((CONFIGS / f"{name}.json").read_text()), **patch}
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items()
                                                    if v is not None or k not in patch}))
    return folder


# a dense model has no experts to split, replay or serve with expert parallelism
DENSE = ("train.parallel.ep=1", "train.routing_replay=false", "inference.expert_parallel=false")


def _plan(folder, *sets):
    dense = "experts" not in (folder / "config.json").read_text()
    return run_spec(SPEC, [f'model.hf_checkpoint="{folder}"', *(DENSE if dense else ()), *sets])


@pytest.mark.parametrize("name", ["qwen3_30b_a3b", "qwen3_4b"])
def test_published_qwen3_configs_plan_clean(tmp_path, name):
    result = _plan(_checkpoint(tmp_path, name))
    assert result.ok and result.plan is not None, [(d.code, d.message) for d in result.diagnostics]
    assert not codes(result) & {"V101", "V102", "V103"}


def test_transformers_v5_layout_of_a_qwen3_config_is_clean(tmp_path):
    folder = _checkpoint(tmp_path, "qwen3_30b_a3b", rope_theta=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                         layer_types=["full_attention"] * 48)
    result = _plan(folder, "model.arch.rope_theta=1000000.0")
    assert not codes(result) & {"V102", "V103"}, [d.message for d in result.diagnostics]


@pytest.mark.parametrize("name, says", [
    ("qwen2_5_vl_7b", ["qwen2_5_vl architecture", "vision encoder", "scaled rotary"]),
    ("qwen3_next_80b_a3b", ["qwen3_next architecture", "linear-attention", "shared expert",
                            "part of each head"]),
    ("qwen2_5_7b", ["qwen2 architecture"]),
])
def test_other_architectures_are_refused_saying_what_runs(tmp_path, name, says):
    # 28 heads for the Qwen2.5 models: engines of 4 GPUs
    result = _plan(_checkpoint(tmp_path, name), "inference.gpus_per_engine=4")
    (diag,) = [d for d in result.diagnostics if d.code == "V102"]
    assert diag.severity == "error" and diag.key == "model.hf_checkpoint"
    for words in says:
        assert words in diag.message
    assert "Qwen3MoeForCausalLM" in diag.help and "V101" not in codes(result)
    assert not result.ok and result.plan is None
    assert result.sketch is not None  # planning only: the layout is still shown


@pytest.mark.parametrize("patch, key", [
    ({"attention_bias": True}, "attention_bias"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"layer_types": ["full_attention", "sliding_attention"] * 24}, "layer_types"),
])
def test_features_the_backend_does_not_build(tmp_path, patch, key):
    result = _plan(_checkpoint(tmp_path, "qwen3_30b_a3b", **patch))
    (diag,) = [d for d in result.diagnostics if d.code == "V102"]
    assert f"({key}" in diag.message


def test_an_arch_override_is_pointed_at(tmp_path):
    result = _plan(_checkpoint(tmp_path, "qwen3_30b_a3b"), 'model.arch.model_type="qwen3"')
    (diag,) = [d for d in result.diagnostics if d.code == "V102"]
    assert diag.key == "model.arch.model_type" and "128 experts in a dense qwen3" in diag.message


def test_plan_shows_the_layout_marked_planning_only_and_compile_refuses(tmp_path, capsys):
    folder = _checkpoint(tmp_path, "qwen3_next_80b_a3b")
    args = [str(SPEC), "--set", f'model.hf_checkpoint="{folder}"', "--set",
            "train.max_tokens_per_gpu=8192"]
    assert main(["plan", *args]) == 1
    out = capsys.readouterr()
    assert out.out.startswith("PLANNING ONLY") and "GPUs" in out.out and "V102" in out.err
    assert main(["plan", "--json", *args]) == 1
    plan = json.loads(capsys.readouterr().out)
    assert plan["planning_only"] is True and plan["ok"] is False and "train" in plan
    assert main(["compile", *args, "-o", str(tmp_path / "build")]) == 1
    assert not (tmp_path / "build").exists()


def test_other_errors_give_no_planning_only_plan(tmp_path):
    result = _plan(_checkpoint(tmp_path, "qwen3_next_80b_a3b"), "train.parallel.tp=3")
    assert "V102" in codes(result) and result.sketch is None


@pytest.mark.parametrize("key, written, published", [
    ("rope_theta", "10000.0", "1000000.0"),
    ("tie_word_embeddings", "true", "False"),
    ("num_experts_per_tok", "4", "8"),
])
def test_arch_contradicting_config_json_names_both_values(tmp_path, key, written, published):
    folder = _checkpoint(tmp_path, "qwen3_30b_a3b")
    result = _plan(folder, f"model.arch.{key}={written}")
    (diag,) = [d for d in result.diagnostics if d.code == "V103"]
    assert diag.key == f"model.arch.{key}" and diag.location.file.startswith("--set")
    assert published in diag.message and str(folder / "config.json") in diag.message


def test_arch_equal_to_config_json_or_overridable_is_clean(tmp_path):
    folder = _checkpoint(tmp_path, "qwen3_4b")
    result = _plan(folder, "model.arch.rope_theta=1e6", "model.arch.tie_word_embeddings=true",
                   "model.arch.max_position_embeddings=131072")
    assert "V103" not in codes(result)


def test_without_config_json_the_arch_is_taken_as_written():
    result = run_spec(SPEC, ["model.arch.rope_theta=10000.0"])  # preset, no weights here
    assert "V103" not in codes(result)


def test_the_seed_specs_stay_clean():
    for spec in sorted((ROOT / "specs").glob("*.toml")):
        assert not codes(run_spec(spec)) & {"V102", "V103"}, spec.name


def test_tiny_h200_against_the_checkpoint_its_script_writes(tmp_path):
    # benchmarks/gpu/tiny_moe.py saves a Qwen3MoeConfig built from the spec's [model.arch]
    transformers = pytest.importorskip("transformers")
    import tomllib

    spec = ROOT / "specs" / "tiny_h200.toml"
    arch = tomllib.loads(spec.read_text())["model"]["arch"]
    transformers.Qwen3MoeConfig(**arch).save_pretrained(tmp_path)
    shutil.copy(spec, tmp_path / "spec.toml")
    result = run_spec(spec, [f'model.hf_checkpoint="{tmp_path}"'])
    assert not codes(result) & {"V102", "V103"}, [d.message for d in result.diagnostics]


@pytest.mark.parametrize("spec, shape", [("tiny_h200_dsv3", "deepseek-v3-tiny"),
                                         ("tiny_h200_glm", "glm4-moe-tiny")])
def test_family_specs_against_the_checkpoint_their_script_writes(tmp_path, spec, shape):
    # the spec's [model.arch] is what benchmarks/gpu/tiny_moe.py writes through transformers'
    # save_pretrained: no contradiction, nothing refused, the same architecture either way
    pytest.importorskip("transformers")
    import subprocess
    import sys

    folder = tmp_path / shape
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "tiny_moe.py"),
                    str(folder), "--shape", shape, "--device", "cpu"], check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    path = ROOT / "specs" / f"{spec}.toml"
    against = run_spec(path, [f'model.hf_checkpoint="{folder}"'])
    assert against.ok and not codes(against) & {"V102", "V103"}, [
        (d.code, d.message) for d in against.diagnostics if d.severity != "note"]
    assert against.spec.model_config.origin.kind == "config.json"
    assert against.spec.arch == run_spec(path).spec.arch
    # config.json alone reads as the spec's architecture (transformers v5 writes GLM's
    # partial_rotary_factor under rope_parameters), and a contradiction there is named
    from vime.resolve.model import arch_from_config

    assert arch_from_config(json.loads((folder / "config.json").read_text())) == against.spec.arch
    key = "partial_rotary_factor" if shape.startswith("glm") else "kv_lora_rank"
    assert "V103" in codes(run_spec(path, [f'model.hf_checkpoint="{folder}"',
                                           f"model.arch.{key}=1"]))


# -- the DeepSeek-V3 and GLM-4.5 families: run, but for the features named -------------------

FAMILY_FEATURES = {
    "moonlight_16b_a3b": [],  # MLA without a query latent: built
    "deepseek_v3": [],  # YaRN: built
    "kimi_k2": [],
    "glm_4_5": [],
    "glm_4_5_air": [],
    "glm_4_7": [],
}


@pytest.mark.parametrize("name", sorted(FAMILY_FEATURES))
def test_moe_families_plan_as_moe_and_v102_names_what_the_backend_lacks(tmp_path, name):
    # an engine of 16 GPUs for DeepSeek-V3's FP8 blocks (2048 ÷ 16 = 128), EP over routed experts
    result = _plan(_checkpoint(tmp_path, name), "rollout.max_response_len=4096",
                   "inference.gpus_per_engine=8", "train.parallel.ep=8")
    assert not codes(result) & {"V101", "V103", "V302"}, [d.message for d in result.diagnostics]
    assert result.spec.arch.is_moe
    found = [d for d in result.diagnostics if d.code == "V102"]
    if not FAMILY_FEATURES[name]:
        assert not found, [d.message for d in found]
        return
    (diag,) = found
    for words in FAMILY_FEATURES[name]:
        assert words in diag.message, words
    assert "architecture" not in diag.message and "num_nextn_predict_layers" in diag.help
    # the parts the backend builds are not named
    assert not any(w in diag.message for w in ("QKV bias", "part of each head", "shared expert"))


@pytest.mark.parametrize("key", ["scoring_func", "topk_method"])
def test_a_deepseek_v3_config_vllm_would_route_otherwise_is_named(tmp_path, key):
    # transformers v5 writes neither key; vLLM's deepseek_v2.py then scores by softmax
    # without the expert bias, where transformers and the actor take sigmoid with it
    result = _plan(_checkpoint(tmp_path, "deepseek_v3", **{key: None}),
                   "rollout.max_response_len=4096", "inference.gpus_per_engine=8",
                   "train.parallel.ep=8")
    (diag,) = [d for d in result.diagnostics if d.code == "V102"]
    assert f"without {key}" in diag.message and "another router" in diag.message


def test_moonlight_plans_with_mla_in_the_engine(tmp_path):
    result = _plan(_checkpoint(tmp_path, "moonlight_16b_a3b"), "rollout.max_response_len=4096")
    assert "V102" not in codes(result) and result.ok and result.plan is not None, [
        (d.code, d.message) for d in result.diagnostics if d.severity == "error"]


@pytest.mark.parametrize(("rope", "says"), [
    ({"type": "linear", "factor": 4.0}, "linear scaled rotary"),
    ({"rope_type": "dynamic", "factor": 4.0}, "dynamic scaled rotary"),
    ({"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
      "attention_factor": 1.2}, "attention_factor written out"),
    ({"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
      "mscale_all_dim": 1.0}, "mscale without mscale_all_dim"),
    ({"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
      "truncate": False}, "not rounded"),
])
def test_rotary_scaling_the_backend_does_not_build_is_named_in_words(tmp_path, rope, says):
    result = _plan(_checkpoint(tmp_path, "deepseek_v3", rope_scaling=rope),
                   "rollout.max_response_len=4096", "inference.gpus_per_engine=8",
                   "train.parallel.ep=8")
    (diag,) = [d for d in result.diagnostics if d.code == "V102"]
    assert says in diag.message and "{" not in diag.message, diag.message


def test_yarn_without_mla_is_named(tmp_path):
    result = _plan(_checkpoint(tmp_path, "qwen3_30b_a3b", rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}))
    (diag,) = [d for d in result.diagnostics if d.code == "V102"]
    assert "YaRN rotary scaling without MLA" in diag.message and "{" not in diag.message


@pytest.mark.parametrize("name", ["qwen3_30b_a3b", "qwen3_4b"])
def test_qwen3_configs_name_no_family_feature(name):
    from vime.support import unsupported

    assert unsupported(json.loads((CONFIGS / f"{name}.json").read_text())) == []


@pytest.mark.parametrize(("patch", "says"), [
    # megatron-core scores a group by top_k ÷ topk_group experts, transformers and vLLM by 2
    ({"num_experts_per_tok": 8, "n_group": 8, "topk_group": 2}, "scoring each group by 4"),
    ({"norm_topk_prob": False}, "not renormalised"),
])
def test_routing_megatron_core_computes_otherwise_is_named(tmp_path, patch, says):
    from vime.support import unsupported

    config = {**json.loads((CONFIGS / "glm_4_5_air.json").read_text()), **patch}
    assert any(says in u.what for u in unsupported(config))
    assert not any("group" in u.what for u in unsupported(
        {**config, "topk_group": 4}))  # 8 ÷ 4 = 2: DeepSeek-V3's own
