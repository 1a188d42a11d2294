"""torch_dist checkpoints read by either layer spec (local or Transformer Engine).

megatron-core keys most weights of its local and Transformer Engine layer specs alike: the
local spec saves its norms under TE's fused names (its sharded_state_dict_keys_map). Not an
MoE layer's pre-MLP norm: the local spec saves it as `mlp.linear_fc1.layer_norm_weight` (the
map is a dense layer's), TE's spec, whose MoE layers keep the norm apart, as
`pre_mlp_layernorm.weight`. On an H200 a local-spec checkpoint did not load into the TE spec
("decoder.layers.1.pre_mlp_layernorm.weight from model not in state dict", docs/gpu-runs.md,
2026-12-01 21:01 UTC). TE's modules also carry `_extra_state` objects (FP8 metadata; nothing in bf16
training) that a local-spec checkpoint may not hold.

`align` makes a model's sharded state dict ask for what the checkpoint has: a key the
checkpoint lacks is renamed to its alias where the checkpoint holds that, and an `_extra_state`
object the checkpoint lacks is left out (the module keeps its own). The optimizer's sharded
state dict, built from the model's afterwards, follows the new keys.
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
