"""Full Megatron tensors (the names and shapes of runtime/megatron/mapping.py, tp = ep = 1)
<-> the pieces one rank holds under its tensor/expert parallel layout.

The layout is read from megatron-core itself (`GPTModel.sharded_state_dict()`, the
description dist-checkpointing reshards by). `fill` writes a rank's pieces from full tensors
(loading HF weights under any layout); `gather` rebuilds full tensors on every rank (exporting
weights to the rollout engines). How pieces map to parameters and why the gather is a sum:
docs/design.md, "Full tensors and a rank's pieces".
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

_LOCAL_EXPERT = re.compile(r"local_experts\.(\d+)\.")
# Transformer Engine's layer spec names some parameters its own way; pieces are named as the
# local spec names them (runtime/megatron/model.py), so everything past this module is the same
_TE_NAMES = (
    (re.compile(r"self_attention\.linear_qkv\.layer_norm_weight$"), "input_layernorm.weight"),
    (re.compile(r"mlp\.linear_fc1\.layer_norm_weight$"), "pre_mlp_layernorm.weight"),
    (re.compile(r"mlp\.experts\.(linear_fc[12])\.weight(\d+)$"),
     r"mlp.experts.local_experts.\2.\1.weight"),
)


def local_name(name: str) -> str:
    """A parameter's name under the local layer spec (TE spec names translated; others as
    they are). TEGroupedMLP's `weight{i}` is local expert i, as SequentialMLP's
    `local_experts.{i}`."""
    for pattern, local in _TE_NAMES:
        if pattern.search(name):
            return pattern.sub(local, name)
    return name


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_EMBEDDING = "embedding.word_embeddings.weight"


@dataclass(frozen=True)
class Piece:
    name: str  # the full tensor's name at tp = ep = 1 (hf_to_megatron's names)
    index: tuple[slice, ...]  # where this rank's piece sits in the full tensor
    full_shape: tuple[int, ...]
    data: torch.Tensor  # a view of this rank's parameter
    main: bool  # the one replica that writes this piece when gathering


def pieces(gpt) -> list[Piece]:
    """This rank's pieces of every parameter of a GPTModel, in the model's order."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import (
        ShardedTensor,
        apply_factories,
        is_main_replica,
    )

    state = gpt.sharded_state_dict()
    apply_factories(state)
    # parameters may be views into one DDP buffer: find a piece's parameter by address. The
    # router's expert bias (DeepSeek-V3, GLM-4.5) is a buffer that the checkpoint holds too,
    # moved to fp32 storage when a state dict is taken (megatron/core/transformer/moe/
    # router.py), so the addresses are read after it
    held = [*gpt.named_parameters(), *(
        (name, b) for name, b in gpt.named_buffers() if name.endswith("router.expert_bias"))]
    spans = sorted((p.data_ptr(), p.data_ptr() + p.numel() * p.element_size(), name)
                   for name, p in held)
    starts = [start for start, _end, _name in spans]
    # a pipeline stage numbers its layers from 0; the full model's names number them globally
    layer_of = {i: layer.layer_number - 1 for i, layer in enumerate(gpt.decoder.layers)}
    out: list[Piece] = []
    for entry in nested_values(state):
        if not isinstance(entry, ShardedTensor):
            continue  # _extra_state objects: no weights
        at = bisect.bisect_right(starts, entry.data.data_ptr()) - 1
        start, end, name = spans[at]
        if not start <= entry.data.data_ptr() < end:
            raise RuntimeError(f"{entry.key}: no parameter holds this piece")
        name = _LAYER.sub(lambda m: f"decoder.layers.{layer_of[int(m.group(1))]}.",
                          local_name(name))
        if name == "output_layer.weight" and entry.key == _EMBEDDING:
            # tied embeddings under pp > 1: the last stage's copy of the first stage's
            # embedding, keyed by it as a non-main replica (megatron-core's
            # tie_embeddings_and_output_weights_state_dict); a tied model has no output_layer
            # tensor of its own (tests/runtime/test_megatron_pipeline.py)
            name = _EMBEDDING
        prepend = entry.prepend_axis_num
        if prepend:  # experts: the offset on the leading axis is the global expert index
            name = _LOCAL_EXPERT.sub(f"local_experts.{entry.global_offset[0]}.", name, count=1)
        index = tuple(slice(offset, offset + size) for offset, size in
                      zip(entry.global_offset[prepend:], entry.local_shape, strict=True))
        out.append(Piece(name, index, tuple(entry.global_shape[prepend:]), entry.data,
                         is_main_replica(entry.replica_id)))
    return out


def fill(gpt, full: Mapping[str, torch.Tensor]) -> set[str]:
    """Copy this rank's pieces out of full tensors; returns the names used."""
    used = set()
    with torch.no_grad():
        for piece in pieces(gpt):
            tensor = full[piece.name]
            if tuple(tensor.shape) != piece.full_shape:
                raise ValueError(f"{piece.name}: the checkpoint has {tuple(tensor.shape)}, "
                                 f"the model {piece.full_shape}")
            piece.data.copy_(tensor[piece.index])
            used.add(piece.name)
    return used


def gather(gpt, bucket_bytes: int, group=None) -> Iterator[dict[str, torch.Tensor]]:
    """Full tensors in buckets of about bucket_bytes, on every rank (a collective: every
    rank of `group` must iterate to the end)."""
    import torch.distributed as dist

    by_name: dict[str, list[Piece]] = {}
    for piece in pieces(gpt):
        by_name.setdefault(piece.name, []).append(piece)
    # every rank must build the same buckets, including tensors it holds no piece of (the
    # experts of other expert-parallel ranks): agree on the union of names, in rank order
    described = {n: (p[0].full_shape, p[0].data.dtype) for n, p in by_name.items()}
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        every = [None] * dist.get_world_size(group)
        dist.all_gather_object(every, described, group=group)
        described = {}
        for part in every:
            for name, value in part.items():
                described.setdefault(name, value)
    device = next(iter(by_name.values()))[0].data.device
    names, at = list(described), 0
    while at < len(names):
        dtype = described[names[at]][1]
        bucket, size = [], 0
        while at < len(names) and (not bucket or size < bucket_bytes) \
                and described[names[at]][1] == dtype:
            bucket.append(names[at])
            size += dtype.itemsize * _numel(described[names[at]][0])
            at += 1
        flat = torch.zeros(sum(_numel(described[n][0]) for n in bucket), dtype=dtype,
                           device=device)
        out, offset = {}, 0
        for name in bucket:
            shape = described[name][0]
            out[name] = flat[offset:offset + _numel(shape)].view(shape)
            offset += _numel(shape)
            written = set()
            for piece in by_name.get(name, []):
                key = tuple((s.start, s.stop) for s in piece.index)
                if piece.main and key not in written:  # tied weights appear twice
                    out[name][piece.index].copy_(piece.data)
                    written.add(key)
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            dist.all_reduce(flat, group=group)
        yield out


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
