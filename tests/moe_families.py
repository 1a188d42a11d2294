"""Small config.json dicts of the DeepSeek-V3 and GLM-4.5 families (imported as `moe_families`
by the tests, like `specsupport`): each family's features at sizes a CPU builds in a second.
The first layer is dense, the others MoE; the values are not any checkpoint's."""

from __future__ import annotations

_COMMON = {
    "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
    "num_hidden_layers": 3, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "norm_topk_prob": True, "tie_word_embeddings": False, "max_position_embeddings": 256,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu",
}

# DeepSeek-V3: MLA with a compressed query, two shared experts, group-limited sigmoid routing
DEEPSEEK_V3 = {
    **_COMMON, "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 48, "kv_lora_rank": 32,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8,
    "n_shared_experts": 2, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
}

# DeepSeek-V3/R1 and Kimi-K2: YaRN rotary scaling, its ramp across the 4 rotary frequencies
# (original context 256: dimensions 0 to 2) and two mscales, so the rotary frequencies, the
# cos/sin factor (mscale ÷ mscale_all_dim) and the softmax scale (mscale_all_dim) all move
DEEPSEEK_V3_YARN = {**DEEPSEEK_V3, "rope_scaling": {
    "type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256, "beta_fast": 32,
    "beta_slow": 1, "mscale": 0.9, "mscale_all_dim": 1.0}}

# Moonlight: DeepSeek-V3 without the query's compression (q_lora_rank null), one group
MOONLIGHT = {**DEEPSEEK_V3, "q_lora_rank": None, "n_group": 1, "topk_group": 1,
             "routed_scaling_factor": 2.446}

# GLM-4.5: grouped-query attention with QKV bias, q/k norm, half-rotary heads, one shared expert
GLM4_MOE = {
    **_COMMON, "model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "partial_rotary_factor": 0.5, "attention_bias": True, "use_qk_norm": True,
    "n_routed_experts": 8, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.5,
}

# GLM-4.5-Air: no q/k norm
GLM4_MOE_AIR = {**GLM4_MOE, "use_qk_norm": False, "routed_scaling_factor": 1.0}

FAMILIES = {"deepseek_v3": DEEPSEEK_V3, "deepseek_v3_yarn": DEEPSEEK_V3_YARN,
            "moonlight": MOONLIGHT, "glm4_moe": GLM4_MOE,
            "glm4_moe_air": GLM4_MOE_AIR}
