"""What vime's runtime can run, as plain data: the support matrix that V102 checks a model's
config.json against at compile time.

The Megatron backend (runtime/megatron/model.py) builds Qwen3 blocks and the DeepSeek-V3
(`deepseek_v3`, `kimi_k2`) and GLM-4.5 (`glm4_moe`) families; the HF <-> Megatron mapping
(runtime/megatron/mapping.py) and the weight push to vLLM know their tensor names. vLLM
serves far more architectures, but the actor could not train them nor give it their weights.
What each family supports and what V102 names: docs/design.md, "What the runtime can run".
"""

from __future__ import annotations

from dataclasses import dataclass

# config.json model_type -> its transformers class (config.json "architectures")
MODEL_TYPES: dict[str, str] = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                               "deepseek_v3": "DeepseekV3ForCausalLM",
                               "kimi_k2": "DeepseekV3ForCausalLM",
                               "glm4_moe": "Glm4MoeForCausalLM"}

# model_type -> (its transformers class, what of it the runtime does not run): families the
# planner reads (vime/resolve/model.py counts their parameters and vime import writes them)
# whose layout and memory `vime plan` shows as planning only (V102)
PLANNED_ONLY: dict[str, tuple[str, str]] = {
    "qwen2": ("Qwen2ForCausalLM", "Qwen2's attention (QKV bias without q/k norms)"),
    "glm4": ("Glm4ForCausalLM", "GLM-4's dense layers (RMSNorms after attention and after "
             "the MLP, interleaved partial rotary, QKV bias)"),
    "glm4_moe_lite": ("Glm4MoeLiteForCausalLM", "GLM-4.7-Flash's layers (GLM-4-MoE-Lite: "
                      "latent attention and sigmoid-routed experts that the Megatron backend "
                      "and its weight mapping do not build for this class)"),
    "qwen3_next": ("Qwen3NextForCausalLM", "Qwen3-Next's hybrid layers (gated DeltaNet "
                   "linear attention, output-gated full attention every "
                   "full_attention_interval-th layer, a gated shared expert)"),
    "gpt_oss": ("GptOssForCausalLM", "GPT-OSS's layers (attention sinks, sliding-window "
                "layers, biases on attention, router and experts, clamped SwiGLU experts)"),
}

# the DeepSeek-V3 and GLM-4.5 families: MLA, shared experts, sigmoid routing, QKV bias and
# partial rotary are theirs to have (runtime/megatron/model.py builds them)
FAMILY_TYPES = frozenset({"deepseek_v3", "kimi_k2", "glm4_moe"})

SUPPORTED = (
    "Qwen3 dense (model_type \"qwen3\", Qwen3ForCausalLM) and Qwen3-MoE (\"qwen3_moe\", "
    "Qwen3MoeForCausalLM): full attention with q/k norm and no QKV bias in every layer, "
    "SiLU, rotary embeddings without scaling, tied or untied embeddings, MoE layers by "
    "decoder_sparse_step and mlp_only_layers, no shared expert; DeepSeek-V3 (\"deepseek_v3\", "
    "\"kimi_k2\", DeepseekV3ForCausalLM) with or without a query latent (q_lora_rank) and "
    "rotary embeddings unscaled or YaRN-scaled, and GLM-4.5 (\"glm4_moe\", Glm4MoeForCausalLM: GLM-4.5, 4.6, "
    "4.7, Air): shared experts, dense first layers, sigmoid routing with the expert bias, "
    "groups scored by their best 2 experts, renormalised weights, QKV bias, partial rotary; "
    "their MTP layers (num_nextn_predict_layers) are neither counted nor trained")


@dataclass(frozen=True)
class Unsupported:
    key: str  # the config.json key that says it
    value: object
    what: str  # what the runtime cannot run, in the user's words


def _rope_features(config: dict) -> list[Unsupported]:
    """The rotary scaling of a config.json the runtime does not build: any kind but YaRN,
    YaRN outside MLA (megatron-core builds it in MLASelfAttention alone), and the YaRN
    settings megatron-core and vLLM compute otherwise than transformers."""
    for key in ("rope_scaling", "rope_parameters"):
        table = config.get(key)
        if not isinstance(table, dict):
            continue
        kind = table.get("rope_type", table.get("type"))
        if kind in (None, "default"):
            continue
        at = f"{key}.{'rope_type' if 'rope_type' in table else 'type'}"
        if kind != "yarn":
            return [Unsupported(at, kind, f"{kind} scaled rotary embeddings (only YaRN is "
                                "built, with MLA)")]
        if not _number(config, "kv_lora_rank"):
            return [Unsupported(at, kind, "YaRN rotary scaling without MLA (megatron-core "
                                "builds YaRN in its multi-latent attention alone)")]
        found = []
        if table.get("attention_factor") is not None:
            found.append(Unsupported(f"{key}.attention_factor", table["attention_factor"],
                                     "a YaRN attention_factor written out (megatron-core "
                                     "derives it from mscale and mscale_all_dim)"))
        if table.get("truncate") is False:
            found.append(Unsupported(f"{key}.truncate", False, "a YaRN correction range not "
                                     "rounded to whole dimensions (megatron-core rounds it)"))
        mscale, all_dim = table.get("mscale"), table.get("mscale_all_dim")
        if not (mscale and all_dim) and (all_dim or mscale not in (None, 1, 1.0)):
            # transformers' _compute_yarn_parameters divides the two only where both are
            # non-zero, megatron-core's _yarn_get_concentration_factor and vLLM always
            found.append(Unsupported(f"{key}.mscale", mscale, "a YaRN mscale without "
                                     f"mscale_all_dim or the reverse (mscale_all_dim = "
                                     f"{all_dim!r}: transformers scales cos and sin by another "
                                     "factor than megatron-core and vLLM)"))
        return found
    return []


def unsupported(config: dict) -> list[Unsupported]:
    """Every feature of a config.json (with [model.arch] applied) the runtime cannot run;
    empty for the Qwen3 and Qwen3-MoE checkpoints."""
    found: list[Unsupported] = []
    model_type = config.get("model_type")
    family = model_type in FAMILY_TYPES
    if model_type in PLANNED_ONLY:
        found.append(Unsupported("model_type", model_type, f"the {model_type} architecture: "
                                 f"{PLANNED_ONLY[model_type][1]}"))
    elif model_type is not None and model_type not in MODEL_TYPES:
        found.append(Unsupported("model_type", model_type,
                                 f"the {model_type} architecture"))
    found += _moe_family_features(config)
    architectures = config.get("architectures")
    if isinstance(architectures, list):
        known = set(MODEL_TYPES.values())
        foreign = [a for a in architectures if a not in known]
        if foreign and not found:
            found.append(Unsupported("architectures", architectures,
                                     f"the {', '.join(map(str, foreign))} class"))
    for key, what in (("vision_config", "a vision encoder (a multimodal model)"),
                      ("audio_config", "an audio encoder (a multimodal model)"),
                      ("text_config", "a model whose language model is nested (a multimodal "
                       "or composite config)")):
        if isinstance(config.get(key), dict):
            found.append(Unsupported(key, "{...}", what))
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list):
        other = sorted({str(t) for t in layer_types} - {"full_attention"})
        if other:
            found.append(Unsupported("layer_types", other,
                                     f"{', '.join(other)} layers (hybrid attention)"))
    for key, what in (("full_attention_interval", "linear-attention layers (hybrid attention)"),
                      ("linear_num_value_heads", "linear-attention layers (hybrid attention)")):
        if config.get(key) and not any(u.key == "layer_types" for u in found):
            found.append(Unsupported(key, config[key], what))
            break
    if config.get("use_sliding_window") is True:
        found.append(Unsupported("use_sliding_window", True, "sliding-window attention"))
    if config.get("attention_bias") is True and not family:  # GLM-4.5's is built
        found.append(Unsupported("attention_bias", True, "QKV bias"))
    found += _rope_features(config)
    partial = config.get("partial_rotary_factor")
    if partial is None and isinstance(config.get("rope_parameters"), dict):  # transformers v5
        partial = config["rope_parameters"].get("partial_rotary_factor")
    if (isinstance(partial, int | float) and not isinstance(partial, bool) and partial != 1
            and not family):
        found.append(Unsupported("partial_rotary_factor", partial,
                                 "rotary embeddings over part of each head"))
    act = config.get("hidden_act")
    if act is not None and act != "silu":
        found.append(Unsupported("hidden_act", act, f"the {act} activation (SiLU only)"))
    shared = config.get("shared_expert_intermediate_size")
    if isinstance(shared, int) and shared > 0:
        found.append(Unsupported("shared_expert_intermediate_size", shared, "a shared expert"))
    experts = config.get("num_experts") or config.get("num_local_experts")
    if model_type == "qwen3" and isinstance(experts, int) and experts > 0:
        found.append(Unsupported("model_type", model_type,
                                 f"{experts} experts in a dense qwen3 (a Qwen3-MoE is "
                                 "model_type \"qwen3_moe\")"))
    return found


def _number(config: dict, key: str):
    value = config.get(key)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _moe_family_features(config: dict) -> list[Unsupported]:
    """The parts of a DeepSeek-V3 or GLM-4.5 config.json the Megatron backend does not build
    as transformers and vLLM compute them. It builds (tests/oracle/test_megatron_families.py:
    log-probs of transformers' own model to 2e-6 in fp32, weights bit for bit, R3): MLA with
    or without a query latent, YaRN, shared experts, sigmoid scores with the expert bias, group-limited
    routing picking half of top_k's groups, scaled routing weights, QKV bias, q/k norms,
    partial rotary, dense first layers."""
    found: list[Unsupported] = []
    if config.get("model_type") in ("deepseek_v3", "kimi_k2"):
        # vLLM's deepseek_v2.py reads getattr(config, "scoring_func", "softmax") and builds
        # the expert bias only for topk_method "noaux_tc"; transformers (v5 writes neither
        # key) and the Megatron actor route by sigmoid with the bias
        for key, value in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
            if key not in config:
                found.append(Unsupported(key, None, f"a config.json without {key} = "
                                         f"{value!r} (vLLM then serves another router)"))
    groups, topk = _number(config, "n_group"), _number(config, "num_experts_per_tok")
    group_topk = _number(config, "topk_group")
    if groups and groups > 1 and topk and group_topk and topk // group_topk != 2:
        # megatron-core scores a group by its top_k ÷ topk_group best experts
        # (moe_utils.py group_limited_topk), transformers and vLLM by its best 2
        found.append(Unsupported("topk_group", group_topk,
                                 f"group-limited routing scoring each group by "
                                 f"{topk // group_topk} experts (megatron-core) instead of 2"))
    if config.get("scoring_func", "sigmoid" if config.get("model_type") in FAMILY_TYPES
                  else "softmax") == "sigmoid" and config.get("norm_topk_prob") is False:
        found.append(Unsupported("norm_topk_prob", False, "sigmoid routing weights not "
                                 "renormalised (megatron-core renormalises them)"))
    return found
