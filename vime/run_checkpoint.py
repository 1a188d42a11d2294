"""What a run's checkpoint says about the run that wrote it.

    <load folder>/rollout_000019/   train/  state.json  vime_checkpoint.json

Plain data and the file system only: the compiler reads this module (V708, V709), the runtime
writes with it (runtime/rl/checkpoint.py), and which checkpoint a resume loads is decided here
for both. What the record holds and why: docs/design.md, "A checkpoint's record of its run".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vime.layout import SIZES, Layout

RECORD_FILE = "vime_checkpoint.json"
RECORD_VERSION = 1
STATE_FILE = "state.json"
LATEST_FILE = "latest"

# [model.arch] (config.json) keys whose values decide a saved tensor's shape or name; the
# others (rope_theta, rms_norm_eps, top-k, ...) load into any model and are not recorded
ARCH_KEYS = ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
             "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings",
             "mlp_only_layers", "intermediate_size", "num_experts", "moe_intermediate_size")
DENSE_MLP_KEYS = ("intermediate_size",)  # tensors of the layers in mlp_only_layers only
EXPERT_KEYS = ("num_experts", "moe_intermediate_size")  # tensors of the MoE layers only
# the training ranks' sizes (plan.json train.*) and their number
LAYOUT_KEYS = (*SIZES, "ranks")


@dataclass(frozen=True)
class Format:
    """How a training backend writes its part of a checkpoint, and what its load can change."""

    name: str
    must_match: tuple[str, ...]  # layout sizes the load cannot change
    more_ranks: bool  # whether more training ranks than saved it can load it
    note: str  # written into the record, for the person reading it


FORMATS = {  # by train.backend
    "torch": Format(
        "torch", (), True,
        "rank 0 writes the whole model and optimizer (train/model_optim.pt), every rank its "
        "RNG state (rng_rank<r>.pt, optional on load): any number of data-parallel ranks "
        "loads it, and the backend has no other parallelism (runtime/backends/torch_train.py)"),
    "megatron": Format(
        "torch_dist", ("tp", "pp", "ep", "etp"), False,
        "megatron-core dist-checkpointing (train/torch_dist/): the model's tensors reshard to "
        "any tp/pp/ep/etp, but the distributed optimizer's state is saved as dp_reshardable, "
        "which 'allows checkpoint resharding only in DP dimension' (megatron-core 0.19, "
        "optimizer/distrib_optimizer.py), so tp, pp, ep and etp must match and dp, edp and cp "
        "may change; every rank loads its own rng_rank<r>.pt (RNG and Adam's step count), so "
        "at most as many training ranks as saved it (runtime/backends/megatron_train.py)"),
}


def arch_values(arch) -> dict:
    """The ARCH_KEYS of an Arch (vime/resolve/model.py), in config.json's names."""
    return {
        "model_type": arch.model_type, "num_hidden_layers": arch.num_layers,
        "hidden_size": arch.hidden_size, "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_kv_heads, "head_dim": arch.head_dim,
        "vocab_size": arch.vocab_size, "tie_word_embeddings": arch.tie_word_embeddings,
        "mlp_only_layers": [i for i, moe in enumerate(arch.moe_layers) if not moe],
        "intermediate_size": arch.ffn_hidden_size, "num_experts": arch.num_experts,
        "moe_intermediate_size": arch.moe_ffn_hidden_size,
    }


def record(arch, train_backend: str, layout: Layout, vime_version: str) -> dict:
    """A checkpoint's vime_checkpoint.json: arch an Arch, the layout's sizes (LAYOUT_KEYS,
    its world as `ranks`)."""
    written = FORMATS.get(train_backend)
    return {
        "record": RECORD_VERSION, "vime": vime_version, "train_backend": train_backend,
        "format": written.name if written else train_backend,
        "arch": arch_values(arch),
        "layout": {**layout.to_plan(), "ranks": layout.world_size},
        "loads_under": written.note if written else "",
    }


def arch_differences(saved: dict, now: dict) -> list[str]:
    """The ARCH_KEYS whose values differ between a record and a model, of the tensors a load
    meets: the dense MLP's width only where either model has a dense layer, the experts' only
    where either has an MoE layer (Qwen3-MoE keeps intermediate_size in its config.json
    whether or not a layer uses it). Keys the record lacks are not compared."""
    def has_dense(values: dict) -> bool:
        return bool(values.get("mlp_only_layers"))

    def has_moe(values: dict) -> bool:
        return len(values.get("mlp_only_layers", ())) < values.get("num_hidden_layers", 0)

    differ = []
    for key in ARCH_KEYS:
        if key not in saved or saved[key] == now[key]:
            continue
        if key in DENSE_MLP_KEYS and not (has_dense(saved) or has_dense(now)):
            continue
        if key in EXPERT_KEYS and not (has_moe(saved) or has_moe(now)):
            continue
        differ.append(key)
    return differ


def problem_with(saved) -> str | None:
    """What makes a parsed vime_checkpoint.json unusable, or None."""
    if not isinstance(saved, dict):
        return "is not a JSON object"
    if not isinstance(saved.get("train_backend"), str):
        return "has no train_backend"
    if not isinstance(saved.get("arch"), dict):
        return "has no arch table"
    layout = saved.get("layout")
    if not isinstance(layout, dict) or any(
            type(layout.get(key)) is not int or layout[key] < 1 for key in LAYOUT_KEYS):
        return f"does not give the positive integers {', '.join(LAYOUT_KEYS)} under layout"
    return None


def read_record(checkpoint: Path) -> tuple[dict | None, str | None]:
    """(the record, None), (None, why it cannot be used), or (None, None) when the
    checkpoint has none (written before records existed: not checked)."""
    path = Path(checkpoint) / RECORD_FILE
    try:
        saved = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, f"cannot be read: {err}"
    problem = problem_with(saved)
    return (None, problem) if problem else (saved, None)


# --------------------------------------------------------------- which checkpoint a resume loads

def complete(folder: Path) -> list[Path]:
    """The complete checkpoints of a folder (a rollout_* folder with its state.json; a save
    in progress is a .partial-* folder), oldest first."""
    folder = Path(folder)
    try:
        entries = list(folder.iterdir())
    except OSError:  # absent, not a folder, not readable: nothing to resume from
        return []
    return sorted(p for p in entries
                  if p.name.startswith("rollout_") and (p / STATE_FILE).is_file())


def latest(folder: Path) -> Path | None:
    """The checkpoint a resume loads: the one `latest` names, or the newest complete one when
    `latest` is missing, unreadable or names a folder that is gone."""
    folder = Path(folder)
    try:
        named = (folder / LATEST_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        named = ""
    if named and (folder / named / STATE_FILE).is_file():
        return folder / named
    found = complete(folder)
    return found[-1] if found else None
