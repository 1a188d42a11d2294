"""resolved.toml: the spec with every default and derived value written out, stamped with
the vime version and the hash of the input, so a run can be traced to its exact spec."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import tomli_w

from vime import __version__
from vime.resolve.spec import SECTIONS, Spec, spec_key


def _plain(value):
    if dataclasses.is_dataclass(value):
        return {spec_key(f): _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if getattr(value, f.name) is not None}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# the model types read with DeepSeek-V3's and GLM-4.5's keys (vime/resolve/model.py)
_FAMILY_TYPES = ("deepseek_v3", "kimi_k2", "glm4_moe")


def arch_as_config(spec: Spec) -> dict:
    """The resolved architecture in HF config.json keys (what [model.arch] accepts), which
    vime/resolve/model.py's arch_from_config reads back to the same Arch: the runtime builds
    the actor from resolved.toml's [model.arch] (runtime/core/slices.py)."""
    arch = spec.arch
    if arch.model_type in _FAMILY_TYPES:
        return _family_config(arch)
    config = {
        "model_type": arch.model_type, "num_hidden_layers": arch.num_layers,
        "hidden_size": arch.hidden_size, "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_kv_heads, "head_dim": arch.head_dim,
        "vocab_size": arch.vocab_size, "intermediate_size": arch.ffn_hidden_size,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "max_position_embeddings": arch.max_position_embeddings,
        "rope_theta": arch.rope_theta, "rms_norm_eps": arch.rms_norm_eps,
    }
    if arch.num_experts:
        config.update({
            "num_experts": arch.num_experts, "num_experts_per_tok": arch.topk,
            "moe_intermediate_size": arch.moe_ffn_hidden_size, "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i, moe in enumerate(arch.moe_layers) if not moe],
            "norm_topk_prob": arch.norm_topk_prob,
        })
    return config


def _family_config(arch) -> dict:
    """A DeepSeek-V3 or GLM-4.5 architecture in its own config.json keys: routed and shared
    experts, dense first layers, group-limited sigmoid routing, and MLA's latent widths or
    GLM's QKV bias, q/k norm and partial rotary. An MLA model's head_dim is left out (its
    config.json writes qk_rope_head_dim there, which the Arch does not keep)."""
    config = {
        "model_type": arch.model_type, "num_hidden_layers": arch.num_layers,
        "hidden_size": arch.hidden_size, "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_kv_heads, "vocab_size": arch.vocab_size,
        "intermediate_size": arch.ffn_hidden_size,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "max_position_embeddings": arch.max_position_embeddings,
        "rope_theta": arch.rope_theta, "rms_norm_eps": arch.rms_norm_eps,
        "num_nextn_predict_layers": arch.mtp_layers,
    }
    if arch.is_mla:
        config.update({"q_lora_rank": arch.q_lora_rank, "kv_lora_rank": arch.kv_lora_rank,
                       "qk_nope_head_dim": arch.qk_nope_head_dim,
                       "qk_rope_head_dim": arch.qk_rope_head_dim,
                       "v_head_dim": arch.v_head_dim})
        if arch.rope_scaling is not None:  # the actor is built from this table: its YaRN
            yarn = arch.rope_scaling
            config["rope_scaling"] = {
                "type": yarn.kind, "factor": yarn.factor,
                "original_max_position_embeddings": yarn.original_max_position_embeddings,
                "beta_fast": yarn.beta_fast, "beta_slow": yarn.beta_slow,
                "mscale": yarn.mscale, "mscale_all_dim": yarn.mscale_all_dim}
    else:
        config.update({"head_dim": arch.head_dim, "attention_bias": arch.qkv_bias,
                       "use_qk_norm": arch.qk_norm,
                       "partial_rotary_factor": arch.partial_rotary_factor})
    dense_first = next((i for i, moe in enumerate(arch.moe_layers) if moe), arch.num_layers)
    config.update({"n_routed_experts": arch.num_experts, "first_k_dense_replace": dense_first})
    if arch.num_experts:
        config.update({
            "num_experts_per_tok": arch.topk, "moe_intermediate_size": arch.moe_ffn_hidden_size,
            "n_shared_experts": arch.shared_expert_ffn_hidden_size // arch.moe_ffn_hidden_size,
            "n_group": arch.num_groups, "topk_group": arch.group_topk,
            "routed_scaling_factor": arch.routed_scaling_factor,
            "scoring_func": arch.score_function, "norm_topk_prob": arch.norm_topk_prob,
            "topk_method": "noaux_tc" if arch.expert_bias else "greedy"})
    return config


# The schema installed with vime (a copy of schema/vime.schema.json, in checkouts and wheels).
SCHEMA_FILE = Path(__file__).resolve().parent.parent / "data" / "vime.schema.json"


def schema_reference(build_dir: str | None) -> str:
    """What resolved.toml's `#:schema` names, for editors (Taplo, Even Better TOML) that read it
    relative to the file: the installed schema, from build_dir when that is a folder path, else
    (a submitted job's folder, not known yet) by its absolute path."""
    if build_dir is None or build_dir.startswith("<"):
        return str(SCHEMA_FILE)
    return Path(os.path.relpath(SCHEMA_FILE, os.path.abspath(build_dir))).as_posix()


def render(spec: Spec, source_name: str, source_sha256: str,
           build_dir: str | None = None) -> str:
    body = {name: _plain(getattr(spec, name)) for name in SECTIONS}
    if spec.arch is not None:
        body["model"]["arch"] = arch_as_config(spec)
    header = (
        f"#:schema {schema_reference(build_dir)}\n"
        f"# resolved by vime {__version__} from {source_name}\n"
        f"# input sha256 {source_sha256}\n"
        "# every default and derived value is written out; `vime plan` on this file gives the same plan\n\n"
    )
    return header + tomli_w.dumps(body)
