"""The model family `vime import` reads from a script's model args: DeepSeek-V3 and GLM-4.5
are written as theirs, and a model of a family vime does not build is named, never written as
a Qwen3. The flag lists are THUDM/slime's scripts/models/*.sh at
624b824a898ab0ec1fcb4d373004c7f3852bf515, their MODEL_ARGS as written (variables replaced by
the values the file gives them)."""

from __future__ import annotations

import json
import shlex

from specsupport import ROOT

from vime.importer import import_argv, table
from vime.resolve.model import PRESETS, arch_from_config
from vime.support import unsupported

DEEPSEEK_V3 = shlex.split("""--disable-bias-linear --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432
--num-attention-heads 128 --kv-channels 128 --normalization RMSNorm --position-embedding-type rope
--norm-epsilon 1e-6 --swiglu --untie-embeddings-and-output-weights --vocab-size 129280
--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128
--qk-pos-emb-head-dim 64 --v-head-dim 128 --qk-layernorm --rotary-base 10000
--num-experts 256 --moe-ffn-hidden-size 2048 --moe-router-topk 8
--moe-shared-expert-intermediate-size 2048 --moe-router-score-function sigmoid
--moe-router-enable-expert-bias --moe-router-group-topk 4 --moe-router-num-groups 8
--moe-router-topk-scaling-factor 2.5""")

GLM45_AIR = shlex.split("""--disable-bias-linear --group-query-attention --num-attention-heads 96
--num-query-groups 8 --kv-channels 128 --num-layers 46 --hidden-size 4096 --ffn-hidden-size 10944
--add-qkv-bias --normalization RMSNorm --position-embedding-type rope --rotary-percent 0.5
--swiglu --untie-embeddings-and-output-weights --vocab-size 151552 --rotary-base 1000000
--moe-ffn-hidden-size 1408 --moe-shared-expert-intermediate-size 1408
--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-topk 8
--moe-layer-freq [0]*1+[1]*45 --num-experts 128""")

QWEN25_05B = shlex.split("""--swiglu --num-layers 24 --hidden-size 896 --ffn-hidden-size 4864
--num-attention-heads 14 --use-rotary-position-embeddings --disable-bias-linear --add-qkv-bias
--normalization RMSNorm --norm-epsilon 1e-6 --rotary-base 1000000 --group-query-attention
--num-query-groups 2 --vocab-size 151936""")


# THUDM/slime scripts/models/glm4.7-30B-A3B.sh at 624b824a: latent attention with QKV bias
GLM47_30B = shlex.split("""--moe-layer-freq [0]*1+[1]*46 --num-experts 64
--moe-shared-expert-intermediate-size 1536 --moe-router-topk 4 --moe-ffn-hidden-size 1536
--moe-router-score-function sigmoid --moe-router-enable-expert-bias
--moe-router-topk-scaling-factor 1.8 --num-layers 47 --hidden-size 2048 --ffn-hidden-size 10240
--num-attention-heads 20 --disable-bias-linear --add-qkv-bias --swiglu
--untie-embeddings-and-output-weights --normalization RMSNorm --qk-layernorm
--multi-latent-attention --q-lora-rank 768 --kv-lora-rank 512 --qk-head-dim 192
--v-head-dim 256 --kv-channels 192 --qk-pos-emb-head-dim 64 --vocab-size 154880
--rotary-base 1000000""")


def _family_said(result) -> list:
    return [f for f in result.findings if f.code == "V975"]


def _arch(result) -> dict:
    return {key.removeprefix("model.arch."): value for key, value in result.values.items()
            if key.startswith("model.arch.")}


def _planned(result) -> dict:
    """The config the planner reads: the preset the model args match, under [model.arch]."""
    preset = PRESETS.get(result.values.get("model.preset"), {})
    return {**preset, **_arch(result)}


def _errors_of(result, flags) -> list:
    return [f for f in result.findings if f.severity == "error" and f.message.startswith(flags)]


def test_multi_head_latent_attention_is_written_as_the_deepseek_v3_family():
    result = import_argv(["--hf-checkpoint", "/nowhere", *DEEPSEEK_V3])
    assert not _family_said(result), result.findings
    arch = _planned(result)
    assert result.values["model.preset"] == "deepseek-r1"  # DeepSeek-V3's published shape
    assert {key: arch[key] for key in (
        "model_type", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
        "v_head_dim", "n_shared_experts", "scoring_func", "topk_method", "n_group",
        "topk_group", "routed_scaling_factor", "norm_topk_prob")} == {
        "model_type": "deepseek_v3", "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "n_shared_experts": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
        "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "norm_topk_prob": True}
    assert not _errors_of(result, ("--multi-latent-attention", "--q-lora-rank",
                                   "--moe-router-score-function", "--moe-router-enable"))
    built = arch_from_config(arch)
    assert built.is_mla and built.shared_expert_ffn_hidden_size == 2048
    assert built.score_function == "sigmoid" and built.expert_bias
    assert unsupported(arch) == []


def test_glm_s_flags_are_written_as_the_glm45_family():
    result = import_argv(["--hf-checkpoint", "/nowhere", *GLM45_AIR])
    assert not _family_said(result), result.findings
    arch = _planned(result)
    assert result.values["model.preset"] == "glm-4.5-air"
    assert {key: arch[key] for key in (
        "model_type", "attention_bias", "partial_rotary_factor", "n_shared_experts",
        "scoring_func", "topk_method")} == {
        "model_type": "glm4_moe", "attention_bias": True, "partial_rotary_factor": 0.5,
        "n_shared_experts": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc"}
    assert not _errors_of(result, ("--add-qkv-bias", "--rotary-percent",
                                   "--moe-router-score-function"))
    built = arch_from_config(arch)
    assert built.qkv_bias and built.partial_rotary_factor == 0.5 and not built.qk_norm
    assert built.moe_layers == (False,) + (True,) * 45
    assert unsupported(arch) == []


def test_qkv_bias_without_qk_norm_is_a_qwen2_vime_plans():
    """Qwen2 is planned, not run (V102 at plan): the model args are its preset."""
    result = import_argv(["--hf-checkpoint", "/nowhere", *QWEN25_05B])
    assert not _family_said(result), result.findings
    assert result.values["model.preset"] == "qwen2.5-0.5b"
    planned = arch_from_config(_planned(result))
    assert planned.model_type == "qwen2" and planned.qkv_bias and not planned.qk_norm
    assert unsupported(_planned(result))[0].key == "model_type"


def test_latent_attention_with_qkv_bias_is_glm_4_7_flash():
    result = import_argv(["--hf-checkpoint", "/nowhere", *GLM47_30B])
    assert not _family_said(result), result.findings
    assert result.values["model.preset"] == "glm-4.7-flash"
    assert arch_from_config(_planned(result)).is_mla


def test_a_config_json_of_another_family_is_v968(tmp_path):
    config = {"num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
              "vocab_size": 129280}
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "deepseek_v3"}))
    same = import_argv(["--hf-checkpoint", str(tmp_path), *DEEPSEEK_V3])
    assert not [f for f in same.findings if f.code in ("V975", "V968")], same.findings
    assert not _arch(same)  # vime reads config.json
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_moe"}))
    other = import_argv(["--hf-checkpoint", str(tmp_path), *DEEPSEEK_V3])
    said = [f for f in other.findings if f.message.startswith("the model args show")]
    assert [(f.code, f.severity) for f in said] == [("V968", "error")], other.findings
    assert "'qwen3_moe'" in said[0].message


def test_qwen3_model_args_are_still_a_qwen3():
    result = import_argv(["--hf-checkpoint", "/nowhere", "--num-layers", "36", "--hidden-size",
                          "2560", "--num-attention-heads", "32", "--num-query-groups", "8",
                          "--ffn-hidden-size", "9728", "--qk-layernorm", "--rotary-percent",
                          "1.0"])
    assert not _family_said(result)
    assert result.values["model.preset"] == "qwen3-4b"
    assert not _arch(result)


def test_every_family_key_is_a_model_arch_key():
    schema = json.loads((ROOT / "schema" / "vime.schema.json").read_text())
    keys = schema["properties"]["model"]["properties"]["arch"]["properties"]
    for row in table.FLAGS:
        if row.family:
            assert row.family.split(":")[0] in keys, row.family


def test_a_family_vime_plans_beside_its_config_json_is_not_v975(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "num_hidden_layers": 24, "hidden_size": 896,
        "num_attention_heads": 14, "vocab_size": 151936, "tie_word_embeddings": True}))
    result = import_argv(["--hf-checkpoint", str(tmp_path), *QWEN25_05B])
    assert not _family_said(result) and not [f for f in result.findings if f.code == "V968"]
    assert not _arch(result)  # vime reads config.json, and V102 says it is planned only


def test_the_router_settings_of_glm_and_deepseek_scripts_are_vime_s():
    """`--moe-router-bias-update-rate 0` and `--moe-router-load-balancing-type seq_aux_loss`
    with `--moe-aux-loss-coeff 0` (slime's glm4.5-106B-A12B.sh and deepseek-v3.sh): a static
    expert bias and no load-balancing loss, as vime trains."""
    router = ["--moe-router-bias-update-rate", "0", "--moe-router-load-balancing-type",
              "seq_aux_loss", "--moe-aux-loss-coeff", "0"]
    result = import_argv(["--hf-checkpoint", "/nowhere", *GLM45_AIR, *router])
    said = {f.message.split(":")[0]: (f.code, f.severity) for f in result.findings}
    assert said["--moe-router-bias-update-rate 0"] == ("V965", "note")
    assert said["--moe-router-load-balancing-type seq_aux_loss"] == ("V965", "note")
    updated = import_argv(["--moe-router-bias-update-rate", "1e-3"])
    assert [(f.code, f.severity) for f in updated.findings
            if f.message.startswith("--moe-router-bias-update-rate")] == [("V963", "error")]
