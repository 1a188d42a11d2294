"""torch_dist checkpoints read by either layer spec (local or Transformer Engine).

`align` makes a model's sharded state dict ask for what the checkpoint has; the training
backend (runtime/backends/megatron_train.py) and runtime/megatron/convert.py call it before
they load. Which keys the two specs save differently and what `align` renames or leaves out:
docs/design.md, "torch_dist checkpoints of either layer spec".
"""

from __future__ import annotations

# (one spec's key ending, the other's): either way round
ALIASES = ((".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight"),)
EXTRA_STATE = "_extra_state"


def _saved_keys(checkpoint_dir) -> set[str]:
    """The keys of the tensors and objects a torch_dist checkpoint holds (an object's key
    without its `/shard_…` suffix)."""
    from megatron.core.dist_checkpointing.serialization import load_sharded_metadata

    return {key.split("/shard_")[0] for key in load_sharded_metadata(str(checkpoint_dir))}


def align(sharded_state_dict: dict, checkpoint_dir) -> list[str]:
    """Rename and leave out, in place, as the module docstring says, for the torch_dist
    checkpoint in checkpoint_dir; returns what it did, a line each (empty when the checkpoint
    was written by the same spec)."""
    from megatron.core.dist_checkpointing.mapping import ShardedBase, ShardedObject

    saved = _saved_keys(checkpoint_dir)
    done: list[str] = []

    def visit(node: dict) -> None:
        for name in list(node):
            value = node[name]
            if isinstance(value, dict):
                visit(value)
                continue
            if not isinstance(value, ShardedBase) or value.key in saved:
                continue
            if isinstance(value, ShardedObject) and value.key.endswith(EXTRA_STATE):
                del node[name]
                done.append(f"{value.key}: not in the checkpoint, left out")
                continue
            alias = _alias(value.key, saved)
            if alias is not None:
                done.append(f"{value.key}: read from {alias}")
                value.key = alias

    visit(sharded_state_dict)
    return done


def _alias(key: str, saved: set[str]) -> str | None:
    for a, b in ALIASES:
        for mine, theirs in ((a, b), (b, a)):
            if key.endswith(mine) and key[:-len(mine)] + theirs in saved:
                return key[:-len(mine)] + theirs
    return None
