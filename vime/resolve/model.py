"""Model architecture: HF config.json keys -> Arch, built-in presets, parameter counts.

Presets hold the published config.json values of the Qwen3 checkpoints on the Hugging Face
hub (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B, Qwen/Qwen3-4B, Qwen/Qwen3-8B), so a spec can
be planned on a laptop that does not have the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from vime import schema

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
}

# HF keys vime reads; the ones without a fallback must be present.
REQUIRED_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
MOE_MODEL_TYPES = ("qwen3_moe",)


class ArchError(ValueError):
    """A config.json that does not describe a model vime can plan; `key` is the culprit."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


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

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and any(self.moe_layers)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layers)

    # -- parameter counts (bias-free Qwen3 blocks, q/k RMSNorm) -----------------------
    @property
    def attention_params(self) -> int:
        q = self.hidden_size * self.num_attention_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        out = self.num_attention_heads * self.head_dim * self.hidden_size
        return q + kv + out + 2 * self.head_dim  # + q_norm, k_norm

    @property
    def expert_params(self) -> int:
        """One expert's gate, up and down projections."""
        return 3 * self.hidden_size * self.moe_ffn_hidden_size

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.ffn_hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def _layer_params(self, experts_counted: int) -> int:
        total = 0
        for moe in self.moe_layers:
            total += self.attention_params + 2 * self.hidden_size  # + two RMSNorms
            if moe:
                total += self.hidden_size * self.num_experts  # router
                total += experts_counted * self.expert_params
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
    # planner builds per-layer tables and searches divisors of these numbers (issue 17)
    limit = (schema.node(("model", "arch", _SCHEMA_KEY.get(key, key))) or {}).get("maximum")
    if limit is not None and value > limit:
        raise ArchError(key, f"config.json {key!r} is {value}, more than vime plans (≤ {limit})")
    return value


_SCHEMA_KEY = {"num_local_experts": "num_experts"}


def moe_layer_pattern(num_layers: int, num_experts: int, sparse_step: int,
                      mlp_only_layers: list[int]) -> tuple[bool, ...]:
    """HF Qwen-MoE rule: layer i is MoE iff experts exist, i ∉ mlp_only_layers and
    (i + 1) % decoder_sparse_step == 0 (transformers' Qwen3MoeDecoderLayer)."""
    if num_experts <= 0:
        return (False,) * num_layers
    dense = set(mlp_only_layers)
    return tuple(i not in dense and (i + 1) % sparse_step == 0 for i in range(num_layers))


def arch_from_config(config: dict) -> Arch:
    """Read the Qwen3 / Qwen3-MoE keys of an HF config.json (a dict)."""
    for key in REQUIRED_KEYS:
        _int(config, key)
    layers = _int(config, "num_hidden_layers")
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    if heads == 0:
        raise ArchError("num_attention_heads", "config.json 'num_attention_heads' is 0")
    model_type = str(config.get("model_type", "qwen3_moe" if config.get("num_experts") else "qwen3"))
    # transformers v5 names the expert count num_local_experts for some families
    experts = _int(config, "num_experts", _int(config, "num_local_experts", 0))
    step = _int(config, "decoder_sparse_step", 1) or 1
    mlp_only = config.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only):
        raise ArchError("mlp_only_layers", "config.json 'mlp_only_layers' must be a list of layer indices")
    rope = config.get("rope_theta")
    if rope is None:  # transformers v5 keeps it under rope_parameters
        rope = (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    return Arch(
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=_int(config, "num_key_value_heads", heads),
        head_dim=_int(config, "head_dim", hidden // heads),
        vocab_size=_int(config, "vocab_size"),
        ffn_hidden_size=_int(config, "intermediate_size", 4 * hidden),
        num_experts=experts,
        topk=_int(config, "num_experts_per_tok", 0) if experts else 0,
        moe_ffn_hidden_size=_int(config, "moe_intermediate_size", 0) if experts else 0,
        moe_layers=moe_layer_pattern(layers, experts, step, mlp_only),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=_int(config, "max_position_embeddings", 2048),
        rope_theta=float(rope),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),
    )
