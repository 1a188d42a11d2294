"""Model architecture: HF config.json keys -> Arch, built-in presets, parameter counts.

One description for three families of config.json: Qwen3 / Qwen3-MoE, DeepSeek-V3
(`deepseek_v3`, `kimi_k2`: multi-head latent attention, shared experts, sigmoid routing with
an expert bias, group-limited routing, dense first layers) and GLM-4.5 (`glm4_moe`: shared
experts, partial rotary, QKV bias, dense first layers). Which of them the runtime runs is
vime/support.py's to say. The planner also reads families the runtime does not run, so that
their layout and memory can be planned (V102 marks such a plan as planning only): Qwen2
(`qwen2`: QKV bias, no q/k norms), GLM-4 dense (`glm4`: norms after attention and after the
MLP), GLM-4.7-Flash (`glm4_moe_lite`: DeepSeek-V3's latent attention and experts), Qwen3-Next
(`qwen3_next`: gated attention every full_attention_interval-th layer, gated DeltaNet
linear attention in the others, a gated shared expert) and GPT-OSS (`gpt_oss`: attention
sinks, biased attention, router and experts).

Presets hold the published config.json values of the Qwen3 checkpoints on the Hugging Face
hub (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B, Qwen/Qwen3-4B, Qwen/Qwen3-8B, Qwen/Qwen3-14B,
Qwen/Qwen3-32B), so a spec can be planned on a laptop that does not have the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from vime import schema
from vime.resolve.published import PUBLISHED_PRESETS

_QWEN3_COMMON = {
    "vocab_size": 151936,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}

PRESETS: dict[str, dict] = {
    "qwen3-30b-a3b": {
        **_QWEN3_COMMON,
        "model_type": "qwen3_moe",
        "num_hidden_layers": 48,
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
    },
    "qwen3-235b-a22b": {
        **_QWEN3_COMMON,
        "model_type": "qwen3_moe",
        "num_hidden_layers": 94,
        "hidden_size": 4096,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "intermediate_size": 12288,
        "moe_intermediate_size": 1536,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
    },
    "qwen3-4b": {
        **_QWEN3_COMMON,
        "model_type": "qwen3",
        "num_hidden_layers": 36,
        "hidden_size": 2560,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 9728,
        "tie_word_embeddings": True,
    },
    "qwen3-8b": {
        **_QWEN3_COMMON,
        "model_type": "qwen3",
        "num_hidden_layers": 36,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 12288,
        "tie_word_embeddings": False,
    },
    "qwen3-14b": {
        **_QWEN3_COMMON,
        "model_type": "qwen3",
        "num_hidden_layers": 40,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "intermediate_size": 17408,
        "tie_word_embeddings": False,
    },
    "qwen3-32b": {
        **_QWEN3_COMMON,
        "model_type": "qwen3",
        "num_hidden_layers": 64,
        "hidden_size": 5120,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "intermediate_size": 25600,
        "tie_word_embeddings": False,
    },
}

# The published config.json architecture keys of checkpoints of the families the runtime does
# not run (tests/fixtures/configs/SOURCES.md names where each was read): a script's model args
# that match one name it (vime import), and `vime plan` shows their layout as planning only.
FAMILY_PRESETS: dict[str, dict] = {
    "qwen2.5-0.5b": {
        "model_type": "qwen2", "num_hidden_layers": 24, "hidden_size": 896,
        "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
        "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    },
    "qwen2.5-3b": {
        "model_type": "qwen2", "num_hidden_layers": 36, "hidden_size": 2048,
        "num_attention_heads": 16, "num_key_value_heads": 2, "intermediate_size": 11008,
        "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    },
    "glm-4-9b-0414": {
        "model_type": "glm4", "num_hidden_layers": 40, "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
        "intermediate_size": 13696, "vocab_size": 151552, "max_position_embeddings": 32768,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "partial_rotary_factor": 0.5,
        "attention_bias": True, "tie_word_embeddings": False,
    },
    "glm-4.7-flash": {
        "model_type": "glm4_moe_lite", "num_hidden_layers": 47, "hidden_size": 2048,
        "num_attention_heads": 20, "num_key_value_heads": 20, "intermediate_size": 10240,
        "moe_intermediate_size": 1536, "vocab_size": 154880,
        "max_position_embeddings": 202752, "rope_theta": 1000000.0, "rms_norm_eps": 1e-5,
        "attention_bias": False, "partial_rotary_factor": 1.0, "q_lora_rank": 768,
        "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
        "v_head_dim": 256, "n_routed_experts": 64, "n_shared_experts": 1,
        "num_experts_per_tok": 4, "norm_topk_prob": True, "routed_scaling_factor": 1.8,
        "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "first_k_dense_replace": 1,
        "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
    },
    "qwen3-next-80b-a3b": {
        "model_type": "qwen3_next", "num_hidden_layers": 48, "hidden_size": 2048,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
        "intermediate_size": 5120, "moe_intermediate_size": 512, "num_experts": 512,
        "num_experts_per_tok": 10, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "norm_topk_prob": True, "shared_expert_intermediate_size": 512,
        "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
        "partial_rotary_factor": 0.25, "vocab_size": 151936, "max_position_embeddings": 262144,
        "rope_theta": 10000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    },
    "gpt-oss-20b": {
        "model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4,
        "attention_bias": True, "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "original_max_position_embeddings": 4096,
                         "truncate": False},
        "swiglu_limit": 7.0, "vocab_size": 201088, "max_position_embeddings": 131072,
        "rope_theta": 150000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    },
}
PRESETS.update(FAMILY_PRESETS)

# The published config.json architecture keys of Moonlight-16B-A3B and GLM-4.7
# (tests/fixtures/configs/: moonlight_16b_a3b.json, glm_4_7.json): a script's model args that
# match one name it.
MOE_FAMILY_PRESETS: dict[str, dict] = {
    "moonlight-16b-a3b": {
        "first_k_dense_replace": 1, "hidden_size": 2048, "intermediate_size": 11264,
        "kv_lora_rank": 512, "max_position_embeddings": 8192, "model_type": "deepseek_v3",
        "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts":
        64, "n_shared_experts": 2, "norm_topk_prob": True, "num_attention_heads": 16,
        "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
        "num_nextn_predict_layers": 0, "q_lora_rank": None, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta":
        50000.0, "routed_scaling_factor": 2.446, "scoring_func": "sigmoid",
        "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc", "v_head_dim":
        128, "vocab_size": 163840
    },
    "glm-4.7": {
        "attention_bias": True, "first_k_dense_replace": 3, "head_dim": 128, "hidden_size":
        5120, "intermediate_size": 12288, "max_position_embeddings": 202752, "model_type":
        "glm4_moe", "moe_intermediate_size": 1536, "n_group": 1, "n_routed_experts": 160,
        "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 96,
        "num_experts_per_tok": 8, "num_hidden_layers": 92, "num_key_value_heads": 8,
        "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 1000000, "routed_scaling_factor": 2.5,
        "tie_word_embeddings": False, "topk_group": 1, "use_qk_norm": True, "vocab_size": 151552
    },
}
PRESETS.update(MOE_FAMILY_PRESETS)

PRESETS.update(PUBLISHED_PRESETS)

# HF keys vime reads; the ones without a fallback must be present.
REQUIRED_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
MOE_MODEL_TYPES = ("qwen3_moe", "deepseek_v3", "kimi_k2", "glm4_moe", "glm4_moe_lite",
                   "qwen3_next", "gpt_oss")
# the families whose router scores by a sigmoid with the expert bias (e_score_correction_bias)
_SIGMOID_TYPES = ("deepseek_v3", "kimi_k2", "glm4_moe", "glm4_moe_lite")


class ArchError(ValueError):
    """A config.json that does not describe a model vime can plan; `key` is the culprit."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class RopeScaling:
    """YaRN rotary scaling as config.json's rope_scaling (or rope_parameters) writes it:
    positions up to original_max_position_embeddings × factor, the frequencies between the
    beta_fast and beta_slow rotations interpolated, cos/sin scaled by mscale ÷ mscale_all_dim
    and MLA's softmax by mscale_all_dim's square."""

    kind: str  # "yarn"
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0

    @property
    def max_positions(self) -> int:
        """The context the scaled rotary embedding covers."""
        return int(self.original_max_position_embeddings * self.factor)


@dataclass(frozen=True)
class Arch:
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    ffn_hidden_size: int
    num_experts: int  # 0 for a dense model
    topk: int
    moe_ffn_hidden_size: int
    moe_layers: tuple[bool, ...]  # per decoder layer: MoE (True) or dense MLP
    tie_word_embeddings: bool
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    norm_topk_prob: bool
    # multi-head latent attention (DeepSeek-V3): kv_lora_rank > 0; q_lora_rank 0 is a plain
    # q_proj (Moonlight's q_lora_rank null)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    qkv_bias: bool = False
    qk_norm: bool = True  # q_norm / k_norm RMSNorms over head_dim (Qwen3; GLM's use_qk_norm)
    partial_rotary_factor: float = 1.0
    # summed width of a MoE layer's shared experts (n_shared_experts × moe_intermediate_size)
    shared_expert_ffn_hidden_size: int = 0
    score_function: str = "softmax"  # the router's scores: softmax or sigmoid
    expert_bias: bool = False  # e_score_correction_bias: a buffer, not a parameter
    num_groups: int = 1  # group-limited routing: n_group groups, topk_group of them used
    group_topk: int = 1
    routed_scaling_factor: float = 1.0
    mtp_layers: int = 0  # num_nextn_predict_layers: not part of the model trained or served
    # per decoder layer: gated DeltaNet linear attention (True) or full attention; () all full
    linear_layers: tuple[bool, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    attention_output_gate: bool = False  # Qwen3-Next: q_proj also gives a sigmoid gate per head
    attention_out_bias: bool = False  # GPT-OSS: o_proj has a bias beside q, k and v's
    attention_sinks: bool = False  # GPT-OSS: one learnt sink logit per head
    router_bias: bool = False  # GPT-OSS: the router linear has a bias
    expert_biases: bool = False  # GPT-OSS: each expert's gate_up and down projections do
    shared_expert_gate: bool = False  # Qwen3-Next: a sigmoid gate (hidden -> 1) on the shared expert
    post_norms: bool = False  # GLM-4: RMSNorms after attention and after the MLP as well
    rope_scaling: RopeScaling | None = None  # YaRN; None: rotary embeddings without scaling

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and any(self.moe_layers)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layers)

    # -- parameter counts (transformers' modules; megatron-core counts the same) --------
    @property
    def attention_replicated_params(self) -> int:
        """Attention weights every tensor-parallel rank holds whole: MLA's down projections
        and their RMSNorms (vLLM's fused_qkv_a_proj is replicated, megatron-core's
        linear_q_down_proj / linear_kv_down_proj are not split over tp)."""
        if not self.is_mla:
            return 0
        h = self.hidden_size
        q_down = h * self.q_lora_rank + self.q_lora_rank if self.q_lora_rank else 0
        kv_down = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        return q_down + kv_down

    @property
    def num_linear_layers(self) -> int:
        return sum(self.linear_layers)

    @property
    def linear_attention_params(self) -> int:
        """One gated DeltaNet layer (transformers' Qwen3NextGatedDeltaNet): in_proj_qkvz (q, k,
        v and the output gate z), in_proj_ba (beta and the decay a per value head), the
        depthwise conv1d over q, k and v, dt_bias and A_log per value head, the gated
        RMSNorm over a value head, out_proj."""
        h = self.hidden_size
        keys = self.linear_num_key_heads * self.linear_key_head_dim
        values = self.linear_num_value_heads * self.linear_value_head_dim
        in_proj = h * (2 * keys + 2 * values) + h * 2 * self.linear_num_value_heads
        conv = (2 * keys + values) * self.linear_conv_kernel_dim
        return (in_proj + conv + 2 * self.linear_num_value_heads + self.linear_value_head_dim
                + values * h)

    @property
    def attention_params(self) -> int | float:
        """One decoder layer's attention; with linear-attention layers, the mean over the
        layers (attention_params_total ÷ num_layers)."""
        if self.num_linear_layers:
            return self.attention_params_total / self.num_layers
        return self.full_attention_params

    @property
    def attention_params_total(self) -> int:
        linear = self.num_linear_layers
        return (self.num_layers - linear) * self.full_attention_params \
            + linear * self.linear_attention_params

    @property
    def full_attention_params(self) -> int:
        h, heads = self.hidden_size, self.num_attention_heads
        if self.is_mla:
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            q_up = (self.q_lora_rank or h) * heads * qk_head
            kv_up = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            out = heads * self.v_head_dim * h
            return self.attention_replicated_params + q_up + kv_up + out
        q = h * heads * self.head_dim * (2 if self.attention_output_gate else 1)
        kv = 2 * h * self.num_kv_heads * self.head_dim
        out = heads * self.head_dim * h
        bias = (heads + 2 * self.num_kv_heads) * self.head_dim if self.qkv_bias else 0
        bias += h if self.attention_out_bias else 0
        norms = 2 * self.head_dim if self.qk_norm else 0  # q_norm, k_norm
        sinks = heads if self.attention_sinks else 0
        return q + kv + out + bias + norms + sinks

    @property
    def shared_expert_params(self) -> int:
        """A MoE layer's shared experts: gate, up and down projections."""
        gate = self.hidden_size if self.shared_expert_gate and self.shared_expert_ffn_hidden_size \
            else 0
        return 3 * self.hidden_size * self.shared_expert_ffn_hidden_size + gate

    @property
    def expert_params(self) -> int:
        """One expert's gate, up and down projections (and their biases, GPT-OSS's)."""
        biases = 2 * self.moe_ffn_hidden_size + self.hidden_size if self.expert_biases else 0
        return 3 * self.hidden_size * self.moe_ffn_hidden_size + biases

    @property
    def router_params(self) -> int:
        return self.hidden_size * self.num_experts + (self.num_experts if self.router_bias else 0)

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.ffn_hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def _layer_params(self, experts_counted: int) -> int:
        norms = (4 if self.post_norms else 2) * self.hidden_size
        total = self.attention_params_total
        for moe in self.moe_layers:
            total += norms
            if moe:
                total += self.router_params
                total += experts_counted * self.expert_params + self.shared_expert_params
            else:
                total += self.dense_mlp_params
        return total

    @property
    def params_total(self) -> int:
        heads = 1 if self.tie_word_embeddings else 2
        return self._layer_params(self.num_experts) + heads * self.embedding_params + self.hidden_size

    @property
    def params_active(self) -> int:
        heads = 1 if self.tie_word_embeddings else 2
        return self._layer_params(self.topk) + heads * self.embedding_params + self.hidden_size


def _int(config: dict, key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        if value is None:
            raise ArchError(key, f"config.json has no {key!r}")
        raise ArchError(key, f"config.json {key!r} is {value!r}, expected an integer")
    if value < 0:
        raise ArchError(key, f"config.json {key!r} is {value}, expected ≥ 0")
    # config.json is not validated against the schema, so its bounds are applied here: the
    # planner builds per-layer tables and searches divisors of these numbers
    # (benchmarks/RESULTS.md, "The largest cluster the schema admits")
    limit = (schema.node(("model", "arch", _SCHEMA_KEY.get(key, key))) or {}).get("maximum")
    if limit is not None and value > limit:
        raise ArchError(key, f"config.json {key!r} is {value}, more than vime plans (≤ {limit})")
    return value


_SCHEMA_KEY = {"num_local_experts": "num_experts", "n_routed_experts": "num_experts"}


def moe_layer_pattern(num_layers: int, num_experts: int, sparse_step: int,
                      mlp_only_layers: list[int]) -> tuple[bool, ...]:
    """HF Qwen-MoE rule: layer i is MoE iff experts exist, i ∉ mlp_only_layers and
    (i + 1) % decoder_sparse_step == 0 (transformers' Qwen3MoeDecoderLayer)."""
    if num_experts <= 0:
        return (False,) * num_layers
    dense = set(mlp_only_layers)
    return tuple(i not in dense and (i + 1) % sparse_step == 0 for i in range(num_layers))


def dense_first_pattern(num_layers: int, num_experts: int, first_dense: int,
                        freq: int) -> tuple[bool, ...]:
    """DeepSeek-V3 / GLM-4.5 rule: layer i is MoE iff routed experts exist,
    i >= first_k_dense_replace and i % moe_layer_freq == 0 (vLLM's deepseek_v2.py and
    glm4_moe.py; transformers reads first_k_dense_replace alone, and every published
    checkpoint has moe_layer_freq 1)."""
    if num_experts <= 0:
        return (False,) * num_layers
    return tuple(i >= first_dense and i % freq == 0 for i in range(num_layers))


def _optional_int(config: dict, key: str) -> int:
    """A key config.json may write as null (Moonlight's q_lora_rank): 0."""
    return 0 if config.get(key) is None else _int(config, key)


def rope_scaling_table(config: dict) -> dict | None:
    """config.json's rope scaling table (transformers v4's rope_scaling, v5's
    rope_parameters), or None where it scales nothing (absent, or rope_type "default")."""
    for key in ("rope_scaling", "rope_parameters"):
        table = config.get(key)
        if isinstance(table, dict) and table.get("rope_type", table.get("type")) not in (
                None, "default"):
            return table
    return None


def _rope_number(table: dict, key: str, default=None, integer: bool = False):
    value = table.get(key, default)
    if value is None and default is not None:  # written as null: transformers' default
        value = default
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or value < 0:
        raise ArchError("rope_scaling", f"config.json rope_scaling {key!r} is {value!r}, "
                        f"expected a{'n integer' if integer else ' number'} ≥ 0")
    return value


def read_rope_scaling(config: dict) -> RopeScaling | None:
    """The YaRN scaling of a config.json; None without scaling or for another kind (linear,
    dynamic, llama3, mrope: vime/support.py names those).

    Raises:
        ArchError: a YaRN value that is not a number, or a factor or context below 1.
    """
    table = rope_scaling_table(config)
    if table is None or table.get("rope_type", table.get("type")) != "yarn":
        return None
    # transformers' _compute_yarn_parameters: the original context defaults to
    # max_position_embeddings, the factor to their ratio
    longest = _int(config, "max_position_embeddings", 2048)
    original = _rope_number(table, "original_max_position_embeddings", longest, integer=True)
    factor = _rope_number(table, "factor", longest / original if original else 1.0)
    if factor < 1 or original < 1:
        raise ArchError("rope_scaling", f"config.json rope_scaling has factor {factor!r} and "
                        f"original_max_position_embeddings {original!r}, expected ≥ 1")
    return RopeScaling(
        kind="yarn", factor=float(factor), original_max_position_embeddings=original,
        beta_fast=float(_rope_number(table, "beta_fast", 32.0)),
        beta_slow=float(_rope_number(table, "beta_slow", 1.0)),
        mscale=float(_rope_number(table, "mscale", 1.0)),
        mscale_all_dim=float(_rope_number(table, "mscale_all_dim", 0.0)))


def arch_from_config(config: dict) -> Arch:
    """Read the Qwen3 / Qwen3-MoE, DeepSeek-V3 and GLM-4.5 keys of an HF config.json (a dict).

    Raises:
        ArchError: a key vime needs is missing or not a number it can plan with.
    """
    for key in REQUIRED_KEYS:
        _int(config, key)
    layers = _int(config, "num_hidden_layers")
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    if heads == 0:
        raise ArchError("num_attention_heads", "config.json 'num_attention_heads' is 0")
    model_type = str(config.get("model_type", "qwen3_moe" if config.get("num_experts") else "qwen3"))
    # transformers v5 names the expert count num_local_experts for some families; DeepSeek-V3
    # and GLM-4.5 name the routed experts n_routed_experts
    experts = _int(config, "num_experts", _int(config, "num_local_experts",
                                                _optional_int(config, "n_routed_experts")))
    mlp_only = config.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only):
        raise ArchError("mlp_only_layers", "config.json 'mlp_only_layers' must be a list of layer indices")
    if "first_k_dense_replace" in config:
        first_dense = _int(config, "first_k_dense_replace")
        moe_layers = dense_first_pattern(layers, experts, first_dense,
                                         _int(config, "moe_layer_freq", 1) or 1)
    else:
        moe_layers = moe_layer_pattern(layers, experts, _int(config, "decoder_sparse_step", 1) or 1,
                                       mlp_only)
    kv_lora = _optional_int(config, "kv_lora_rank")
    qk_rope = _optional_int(config, "qk_rope_head_dim") if kv_lora else 0
    qk_nope = _optional_int(config, "qk_nope_head_dim") if kv_lora else 0
    # without moe_intermediate_size (Mixtral) intermediate_size is each expert's width
    moe_ffn = (_int(config, "moe_intermediate_size", _int(config, "intermediate_size", 4 * hidden))
               if experts else 0)
    shared = _optional_int(config, "n_shared_experts") if experts else 0
    partial = config.get("partial_rotary_factor")
    if partial is None:  # transformers v5 writes it under rope_parameters (GLM-4.5's 0.5)
        partial = (config.get("rope_parameters") or {}).get("partial_rotary_factor", 1.0)
    if isinstance(partial, bool) or not isinstance(partial, int | float) or not 0 < partial <= 1:
        raise ArchError("partial_rotary_factor",
                        f"config.json 'partial_rotary_factor' is {partial!r}, expected a number in (0, 1]")
    scoring = config.get("scoring_func")
    if scoring is None:  # transformers' DeepseekV3 and Glm4Moe routers score with a sigmoid
        scoring = "sigmoid" if model_type in _SIGMOID_TYPES else "softmax"
    if model_type == "qwen3_next":  # its shared expert is one of shared_expert_intermediate_size
        shared_ffn = _int(config, "shared_expert_intermediate_size", 0) if experts else 0
    else:
        shared_ffn = shared * moe_ffn
    groups = _optional_int(config, "n_group") or 1
    rope = config.get("rope_theta")
    if rope is None:  # transformers v5 keeps it under rope_parameters
        rope = (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    return Arch(
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=_int(config, "num_key_value_heads", heads),
        # MLA's query/key head is qk_nope + qk_rope wide (its config.json head_dim, where
        # written, is qk_rope_head_dim)
        head_dim=qk_nope + qk_rope if kv_lora else _int(config, "head_dim", hidden // heads),
        vocab_size=_int(config, "vocab_size"),
        ffn_hidden_size=_int(config, "intermediate_size", 4 * hidden),
        num_experts=experts,
        topk=_int(config, "num_experts_per_tok", 0) if experts else 0,
        moe_ffn_hidden_size=moe_ffn,
        moe_layers=moe_layers,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=_int(config, "max_position_embeddings", 2048),
        rope_theta=float(rope),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),
        q_lora_rank=_optional_int(config, "q_lora_rank") if kv_lora else 0,
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=qk_nope,
        qk_rope_head_dim=qk_rope,
        v_head_dim=_optional_int(config, "v_head_dim") if kv_lora else 0,
        # Qwen2's q, k and v always have a bias (its config.json has no attention_bias)
        qkv_bias=bool(config.get("attention_bias", model_type == "qwen2")) and not kv_lora,
        # Qwen3 and Qwen3-Next always have q/k norms; transformers' Glm4MoeConfig defaults
        # use_qk_norm to false; Qwen2, GLM-4 and GPT-OSS have none
        qk_norm=bool(config.get("use_qk_norm", model_type not in _NO_QK_NORM)) and not kv_lora,
        partial_rotary_factor=float(partial),
        shared_expert_ffn_hidden_size=shared_ffn,
        score_function=str(scoring),
        expert_bias=model_type in _SIGMOID_TYPES and (
            config.get("topk_method", "noaux_tc") == "noaux_tc"),
        num_groups=groups,
        group_topk=_optional_int(config, "topk_group") or 1,
        routed_scaling_factor=float(config.get("routed_scaling_factor") or 1.0),
        mtp_layers=_optional_int(config, "num_nextn_predict_layers"),
        **_family_fields(config, model_type, layers),
        rope_scaling=read_rope_scaling(config),
    )


_NO_QK_NORM = ("glm4_moe", "qwen2", "glm4", "gpt_oss")


def _family_fields(config: dict, model_type: str, layers: int) -> dict:
    """The Arch fields of the Qwen3-Next, GPT-OSS and GLM-4 parts other families lack."""
    if model_type == "qwen3_next":
        # transformers' Qwen3NextConfig: layer i is full attention iff
        # (i + 1) % full_attention_interval == 0, unless layer_types says otherwise
        interval = _int(config, "full_attention_interval", 4) or 1
        kinds = config.get("layer_types")
        if isinstance(kinds, list) and len(kinds) == layers:
            linear = tuple(kind == "linear_attention" for kind in kinds)
        else:
            linear = tuple((i + 1) % interval != 0 for i in range(layers))
        return {"linear_layers": linear,
                "linear_num_key_heads": _int(config, "linear_num_key_heads", 16),
                "linear_num_value_heads": _int(config, "linear_num_value_heads", 32),
                "linear_key_head_dim": _int(config, "linear_key_head_dim", 128),
                "linear_value_head_dim": _int(config, "linear_value_head_dim", 128),
                "linear_conv_kernel_dim": _int(config, "linear_conv_kernel_dim", 4),
                "attention_output_gate": True, "shared_expert_gate": True}
    if model_type == "gpt_oss":
        biased = bool(config.get("attention_bias", True))
        return {"attention_out_bias": biased, "attention_sinks": True, "router_bias": True,
                "expert_biases": True}
    if model_type == "glm4":
        return {"post_norms": True}
    return {}
