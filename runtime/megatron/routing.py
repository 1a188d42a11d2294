"""Rollout routing replay (R3): the experts vLLM chose, laid out as Megatron's routers see tokens.

vLLM returns, per sample, `routed_experts` [seq_len - 1, moe_layers, top_k];
megatron-core replays routes through `RouterReplay.set_replay_data` (one [local_tokens, top_k]
tensor per MoE layer, megatron/core/transformer/moe/router_replay.py). `batch_routes` (padded
micro-batches), `packed_routes` (packed ones) and `local_routes` (benchmarks/gpu/routing_replay.py)
lay a rank's routes out under context and sequence parallelism; `moe_layer_routes` keeps the
MoE layers' columns. The layouts and the padding's routes: docs/design.md, "Rollout routing replay".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ReplayLayout:
    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    pad_multiple: int = 1  # local_routes: each packed sample's length is rounded up to this


def sample_routes(routed: np.ndarray, length: int, moe_layers: int) -> np.ndarray:
    """[length, moe_layers, top_k] routes for one sample of `length` tokens."""
    if routed.ndim != 3 or routed.shape[1] != moe_layers:
        raise ValueError(f"routed experts of shape {routed.shape}, expected "
                         f"[tokens, {moe_layers} MoE layers, top_k]")
    if routed.shape[0] not in (length - 1, length):
        raise ValueError(f"routed experts cover {routed.shape[0]} tokens of a {length}-token sample")
    routes = routed.astype(np.int64)
    missing = length - routes.shape[0]
    if missing:
        routes = np.concatenate([routes, np.repeat(routes[-1:], missing, axis=0)])
    return routes


def moe_layer_routes(routed: np.ndarray, moe_layers: Sequence[bool]) -> np.ndarray:
    """One sample's routes with a column per MoE layer, as megatron-core's routers take them.
    vLLM's capturer keeps a column per decoder layer (routed_experts_capturer.py sizes its
    buffer by num_hidden_layers; a dense layer's column stays 0): a model with dense layers
    (DeepSeek-V3's and GLM-4.5's first_k_dense_replace) gets its dense columns dropped."""
    if routed.ndim == 3 and routed.shape[1] == len(moe_layers) != sum(moe_layers):
        return routed[:, np.asarray(moe_layers, dtype=bool), :]
    return routed


def _pad(routes: np.ndarray, multiple: int) -> np.ndarray:
    return _pad_to(routes, len(routes) + -len(routes) % multiple)


def local_routes(samples: Sequence[np.ndarray], lengths: Sequence[int], moe_layers: int,
                 layout: ReplayLayout, tp_rank: int = 0, cp_rank: int = 0) -> np.ndarray:
    """Routes of the tokens one (tp_rank, cp_rank) router sees: [local_tokens, layers, top_k]."""
    if layout.cp > 1 and layout.pad_multiple % (2 * layout.cp):
        raise ValueError(f"pad_multiple {layout.pad_multiple} must be a multiple of 2 × cp = "
                         f"{2 * layout.cp}")
    pieces = []
    for routed, length in zip(samples, lengths, strict=True):
        routes = _pad(sample_routes(routed, length, moe_layers), layout.pad_multiple)
        if layout.cp > 1:
            chunks = np.split(routes, 2 * layout.cp)
            routes = np.concatenate([chunks[cp_rank], chunks[2 * layout.cp - 1 - cp_rank]])
        pieces.append(routes)
    packed = np.concatenate(pieces)
    if layout.sequence_parallel and layout.tp > 1:
        if len(packed) % layout.tp:
            raise ValueError(f"{len(packed)} packed tokens do not split over tp = {layout.tp}; "
                             "pad samples to a multiple of tp")
        packed = np.split(packed, layout.tp)[tp_rank]
    return packed


def batch_routes(samples: Sequence[np.ndarray], lengths: Sequence[int], width: int,
                 moe_layers: int, layout: ReplayLayout, tp_rank: int = 0,
                 cp_rank: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Routes of the tokens one (tp_rank, cp_rank) router sees when the samples go forward
    together, right-padded to one [n, width] batch (the Megatron backend's micro-batches):
    ([local_tokens, layers, top_k], a [local_tokens] mask of the rows vLLM routed).

    megatron-core's layers hold the batch as [s, b, h] and a router flattens it position-major
    (router.py: `logits.view(-1, experts)`), so the token at position p of sample i is row
    p·n + i. Context parallelism gives rank r chunks r and 2·cp − 1 − r of the positions of
    every sample; sequence parallelism then splits the rank's positions into tp contiguous
    slices. The rows the mask leaves out (each sample's last token, the padding) carry a copy
    of the sample's last route and never reach the loss."""
    routes, known = [], []
    for routed, length in zip(samples, lengths, strict=True):
        if length > width:
            raise ValueError(f"a {length}-token sample in a batch {width} tokens wide")
        padded = _pad_to(sample_routes(routed, length, moe_layers), width)
        routes.append(padded)
        known.append(np.arange(width) < routed.shape[0])
    routes, known = np.stack(routes, axis=1), np.stack(known, axis=1)  # [width, n, ...]
    if layout.cp > 1:
        if width % (2 * layout.cp):
            raise ValueError(f"a batch {width} tokens wide does not split into 2 × cp = "
                             f"{2 * layout.cp} chunks")
        slots = [cp_rank, 2 * layout.cp - 1 - cp_rank]
        routes = np.concatenate([np.split(routes, 2 * layout.cp)[i] for i in slots])
        known = np.concatenate([np.split(known, 2 * layout.cp)[i] for i in slots])
    if layout.sequence_parallel and layout.tp > 1:
        if len(routes) % layout.tp:
            raise ValueError(f"{len(routes)} positions per rank do not split over tp = "
                             f"{layout.tp}; pad the batch to a multiple of tp")
        routes, known = np.split(routes, layout.tp)[tp_rank], np.split(known, layout.tp)[tp_rank]
    return routes.reshape(-1, *routes.shape[2:]), known.reshape(-1)


def packed_routes(samples: Sequence[np.ndarray], lengths: Sequence[int], total: int,
                  moe_layers: int, layout: ReplayLayout,
                  tp_rank: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Routes of the tokens one tp_rank's router sees when the samples go forward packed into
    one row of `total` tokens (the Megatron backend's packed micro-batches: the samples one
    after another, then padding to `total`): ([local_tokens, layers, top_k], a [local_tokens]
    mask of the rows vLLM routed). The row is [total, 1, h] in megatron-core's layers, so the
    router's row p is packed token p; sequence parallelism splits it into tp contiguous
    slices. Context parallelism is not laid out here: packed sequences under cp > 1 need
    Transformer Engine's attention, and the backend runs them padded (batch_routes)."""
    if layout.cp > 1:
        raise ValueError("packed routes are laid out for cp = 1; cp > 1 runs padded")
    routes, known = [], []
    for routed, length in zip(samples, lengths, strict=True):
        routes.append(sample_routes(routed, length, moe_layers))
        known.append(np.arange(length) < routed.shape[0])
    routes, known = np.concatenate(routes), np.concatenate(known)
    if len(routes) > total:
        raise ValueError(f"{len(routes)} tokens of samples in a packed row of {total}")
    routes = _pad_to(routes, total)
    known = np.concatenate([known, np.zeros(total - len(known), dtype=bool)])
    if layout.sequence_parallel and layout.tp > 1:
        if total % layout.tp:
            raise ValueError(f"a packed row of {total} tokens does not split over tp = "
                             f"{layout.tp}; pad it to a multiple of tp")
        routes, known = np.split(routes, layout.tp)[tp_rank], np.split(known, layout.tp)[tp_rank]
    return routes, known


def _pad_to(routes: np.ndarray, width: int) -> np.ndarray:
    extra = width - len(routes)
    return np.concatenate([routes, np.repeat(routes[-1:], extra, axis=0)]) if extra else routes


def per_layer(routes: np.ndarray) -> list[np.ndarray]:
    """[tokens, layers, top_k] -> one [tokens, top_k] array per MoE layer (set_replay_data)."""
    return [np.ascontiguousarray(routes[:, layer, :]) for layer in range(routes.shape[1])]
