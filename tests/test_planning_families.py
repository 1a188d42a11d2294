"""Families the planner reads and the runtime does not run (vime/support.py's PLANNED_ONLY:
Qwen2, GLM-4, GLM-4.7-Flash, Qwen3-Next, GPT-OSS), on their published config.json
(tests/fixtures/configs/, SOURCES.md names each one's origin) and their presets; and the
engines' weights at the width a quantized checkpoint or inference.quantization stores them."""

from __future__ import annotations

import copy
import json

import pytest
from specsupport import ROOT, codes, run_spec

from vime.plan import memory
from vime.resolve.model import FAMILY_PRESETS, PRESETS, arch_from_config

CONFIGS = ROOT / "tests" / "fixtures" / "configs"
SPEC = ROOT / "specs" / "qwen3_30b.toml"
FAMILIES = ["qwen2_5_7b", "glm_4_9b_0414", "glm_4_7_flash", "qwen3_next_80b_a3b", "gpt_oss_20b"]


def _config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def _transformers_count(config: dict) -> int:
    """The parameters of transformers' own model of `config`, built on the meta device."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    # a copy: transformers v5 writes rope_theta into the rope_scaling table it is given
    hf_config = transformers.AutoConfig.for_model(
        **{k: copy.deepcopy(v) for k, v in config.items() if k != "quantization_config"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", FAMILIES)
def test_parameter_count_of_the_published_config_is_transformers_own(name):
    """Qwen2's QKV bias without q/k norms, GLM-4's norms after attention and the MLP,
    GLM-4.7-Flash's latent attention, Qwen3-Next's gated DeltaNet layers (in_proj_qkvz,
    in_proj_ba, conv1d, dt_bias, A_log, the gated norm) beside its output-gated attention and
    gated shared expert, GPT-OSS's sinks and its attention, router and expert biases: counted
    as transformers builds them (its MTP layers, which transformers does not build, apart)."""
    config = _config(name)
    assert arch_from_config(config).params_total == _transformers_count(config)


@pytest.mark.parametrize("preset", sorted(FAMILY_PRESETS))
def test_a_family_preset_counts_as_transformers_builds_it(preset):
    assert arch_from_config(FAMILY_PRESETS[preset]).params_total == \
        _transformers_count(FAMILY_PRESETS[preset])


@pytest.mark.parametrize("preset, name", [
    ("glm-4-9b-0414", "glm_4_9b_0414"), ("glm-4.7-flash", "glm_4_7_flash"),
    ("qwen3-next-80b-a3b", "qwen3_next_80b_a3b"), ("gpt-oss-20b", "gpt_oss_20b"),
    ("moonlight-16b-a3b", "moonlight_16b_a3b"), ("glm-4.7", "glm_4_7"),
])
def test_a_family_preset_holds_its_config_json_values(preset, name):
    config = _config(name)
    for key, value in PRESETS[preset].items():
        assert config[key] == value, key


def test_published_sizes():
    """OpenAI's gpt-oss-20b model card: 20.91 B parameters (20,914,757,184), 3.61 B active
    without the output layer; Qwen3-Next-80B-A3B: 80 B; GLM-4.7-Flash: 30 B-A3B."""
    gpt = arch_from_config(_config("gpt_oss_20b"))
    assert gpt.params_total == 20_914_757_184
    assert round((gpt.params_active - gpt.embedding_params) / 1e9, 2) == 3.61
    assert round(arch_from_config(_config("qwen3_next_80b_a3b")).params_total / 1e9) == 80
    assert round(arch_from_config(_config("glm_4_7_flash")).params_total / 1e9) == 30
    # Qwen3-Next: 12 of its 48 layers are full attention (every 4th)
    assert arch_from_config(_config("qwen3_next_80b_a3b")).num_linear_layers == 36


def _checkpoint(tmp_path, name: str, **patch) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**_config(name), **patch}))
    return str(folder)


@pytest.mark.parametrize("name, says, sets", [
    ("qwen2_5_7b", "QKV bias without q/k norms", ("inference.gpus_per_engine=4",)),
    ("glm_4_9b_0414", "RMSNorms after attention and after the MLP", ()),
    ("glm_4_7_flash", "GLM-4.7-Flash", ("inference.gpus_per_engine=4",)),  # 20 heads
    ("qwen3_next_80b_a3b", "gated DeltaNet linear attention", ()),
    ("gpt_oss_20b", "attention sinks, sliding-window layers", ()),
])
def test_a_planned_only_family_plans_its_layout_and_v102_names_it(tmp_path, name, says, sets):
    dense = "experts" not in (CONFIGS / f"{name}.json").read_text()
    dense_sets = ("train.parallel.ep=1", "train.routing_replay=false",
                  "inference.expert_parallel=false") if dense else ()
    # GPT-OSS's MXFP4 experts are V120 (the actor cannot train from them): the bf16 release
    patch = {"quantization_config": None} if name == "gpt_oss_20b" else {}
    folder = _checkpoint(tmp_path, name, **patch)
    result = run_spec(SPEC, [f'model.hf_checkpoint="{folder}"', *dense_sets, *sets,
                             "train.max_tokens_per_gpu=8192"])
    (diag,) = [d for d in result.diagnostics if d.code == "V102"]
    assert says in diag.message and f"the {_config(name)['model_type']} architecture" in \
        diag.message
    errors = {d.code for d in result.diagnostics if d.severity == "error"}
    assert errors <= {"V102"} | {c for c in errors if c.startswith("V8")}, errors
    assert result.plan is None and result.sketch is not None
    assert result.spec.arch.params_total == arch_from_config(_config(name)).params_total


def test_only_qwen3_next_s_full_attention_layers_keep_a_kv_cache():
    """12 of 48 layers: K and V of 2 KV heads of 256 (one a GPU at TP 8), bf16."""
    arch = arch_from_config(_config("qwen3_next_80b_a3b"))
    assert memory.kv_bytes_per_token(arch, 8) == 2 * 12 * 1 * 256 * 2
    assert memory.kv_bytes_per_token(arch_from_config(_config("qwen2_5_7b")), 4) == \
        2 * 28 * 1 * 128 * 2


# -- the engines' weights at their stored width

def _rollout_weights(result) -> float:
    spec = result.spec
    gpu = spec.derived.gpu_memory_gib * memory.GiB
    [term] = [t for t in memory.rollout_phase(spec, gpu).phase.terms if t.name == "weights"]
    return term.bytes


def test_inference_quantization_counts_the_engines_weights_at_its_width():
    bf16 = run_spec(SPEC)
    int4 = run_spec(SPEC, ['inference.quantization="int4"'])
    fp8 = run_spec(SPEC, ['inference.quantization="fp8"'])
    params = memory.engine_weights(bf16.spec)
    assert _rollout_weights(bf16) == 2 * params.total
    assert _rollout_weights(fp8) == pytest.approx(
        (params.linear + params.experts) * memory.FP8_WIDTH + 2 * params.other)
    assert _rollout_weights(int4) == pytest.approx(
        (params.linear + params.experts) * (0.5 + 2 / 128) + 2 * params.other)
    assert _rollout_weights(int4) < _rollout_weights(bf16) / 3
    # the runtime does not serve them yet: planning only, named by the key
    assert "V124" not in codes(bf16)
    (diag,) = [d for d in int4.diagnostics if d.code == "V124"]
    assert diag.key == "inference.quantization" and int4.plan is None
    assert int4.sketch is not None
    assert int4.sketch.memory.rollout.kv_cache_bytes > bf16.plan.memory.rollout.kv_cache_bytes


@pytest.mark.parametrize("name, linear, experts", [
    ("kimi_k2", memory.FP8_WIDTH, memory.FP8_WIDTH),  # block FP8 [128, 128]
    ("gpt_oss_20b", 2.0, memory.MXFP4_WIDTH),  # MXFP4 experts, bf16 attention
])
def test_a_quantized_checkpoint_is_counted_at_its_stored_width(tmp_path, name, linear, experts):
    folder = _checkpoint(tmp_path, name)
    spec = run_spec(SPEC, [f'model.hf_checkpoint="{folder}"']).spec
    params = memory.engine_weights(spec)
    assert memory.vllm_weight_bytes(spec) == pytest.approx(
        params.linear * linear + params.experts * experts + 2 * params.other)
    assert memory.vllm_weight_bytes(spec) < 0.6 * 2 * params.total


def test_import_reads_the_engines_quantization_from_the_checkpoints_name():
    from vime.importer import import_argv

    for path, kind in (("/root/Qwen3-30B-A3B-INT4/", "int4"), ("/root/Qwen3-4B-FP8", "fp8")):
        result = import_argv(["--hf-checkpoint", path])
        assert result.values["inference.quantization"] == kind
        assert "checkpoint's name" in result.origins["inference.quantization"].flag
    assert "inference.quantization" not in import_argv(["--hf-checkpoint", "/root/Qwen3-4B"]).values
