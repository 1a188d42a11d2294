"""Weights on their way from the actor to the engines: how big a bucket may be, and how to
check, after a sync, that an engine holds what the actor sent.

- `bucket_bytes(memory)`: the bucket size from plan.json's memory numbers. A bucket lives on
  the device twice over while it travels (vLLM's packed NCCL and IPC transfers keep
  `packed_num_buffers` = 2 staging buffers on each side, vllm/distributed/weight_transfer/
  packed_tensor.py), and a sync happens next to whichever phase holds more memory, so the
  room for buckets is the GPU's memory minus the larger of the two planned peaks.
- `sample_names` / `fingerprints` / `mismatches`: a few tensors the actor and every engine
  worker both hold whole and under the same name (RMSNorm weights: never sharded by TP or EP,
  never fused by vLLM's loaders), hashed byte for byte (the way vLLM's own
  model_loader/weight_checksum.py digests weights), compared after every sync.

Pure functions; torch is imported only where a tensor is hashed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

GIB = 1 << 30
MIB = 1 << 20
# the size every sync used before buckets followed the plan; a smaller bucket only adds calls
BUCKET_FLOOR_BYTES = 64 * MIB
# vLLM's own default packed buffer (DEFAULT_PACKED_BUFFER_SIZE_BYTES); larger buckets buy
# little bandwidth and cost their size twice on both sides
BUCKET_CAP_BYTES = 1 * GIB
STAGING_BUFFERS = 2  # DEFAULT_PACKED_NUM_BUFFERS in vLLM 0.33
HEADROOM_SHARE = 0.25  # of the memory neither phase plans to use: the rest is fragmentation's


def bucket_bytes(memory: Mapping, floor: int = BUCKET_FLOOR_BYTES,
                 cap: int = BUCKET_CAP_BYTES) -> int:
    """Bytes per weight bucket for plan.json's `memory` (gpu_gib, train_peak_gib,
    rollout_peak_gib): a quarter of the GPU memory above the larger peak, split over the two
    staging buffers, rounded down to MiB, and kept within [floor, cap]."""
    gpu = float(memory["gpu_gib"])
    peak = max(float(memory["train_peak_gib"]), float(memory["rollout_peak_gib"]))
    room = max(gpu - peak, 0.0) * GIB * HEADROOM_SHARE / STAGING_BUFFERS
    return int(min(max(int(room) // MIB * MIB, floor), cap))


# ------------------------------------------------------------------------ sample checks

_NORM = re.compile(r"(^|\.)(input_layernorm|post_attention_layernorm|norm|q_norm|k_norm)"
                   r"\.weight$")
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def sample_names(names: Iterable[str], count: int = 4) -> list[str]:
    """Up to `count` HF names to compare after a sync: the final norm and norms of the
    first, middle and last layers (replicated on every TP / EP rank, same name in vLLM)."""
    norms = sorted(n for n in names if _NORM.search(n))
    if not norms:
        return []

    def layer(name: str) -> int:
        found = _LAYER.search(name)
        return int(found.group(1)) if found else -1

    final = [n for n in norms if layer(n) < 0]
    layered = sorted((n for n in norms if layer(n) >= 0), key=lambda n: (layer(n), n))
    picks = final[:1]
    if layered:
        step = max(len(layered) - 1, 1) / max(count - len(picks) - 1, 1)
        for i in range(count - len(picks)):
            index = min(round(i * step), len(layered) - 1)
            if layered[index] not in picks:
                picks.append(layered[index])
    return picks[:count]


def fingerprint(tensor, dtype=None) -> str:
    """sha256 of the tensor's bytes (after a cast to `dtype`, the engine's, when given)."""
    import torch

    value = tensor.detach()
    if dtype is not None:
        value = value.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    raw = value.cpu().contiguous().view(-1).view(torch.uint8).numpy()
    return hashlib.sha256(raw).hexdigest()


def fingerprints(named: Iterable[tuple[str, object]], names: Iterable[str]) -> dict:
    """{name: (dtype name, fingerprint)} of the wanted names among (name, tensor) pairs."""
    wanted = set(names)
    return {name: (str(t.dtype).removeprefix("torch."), fingerprint(t))
            for name, t in named if name in wanted}


def mismatches(actor: Mapping, reported: Mapping[str, tuple[str, str]]) -> list[str]:
    """Names whose engine fingerprint differs from the actor's tensor (cast to the engine's
    dtype) or that the engine does not hold. Empty when the sync delivered the sample."""
    out = []
    for name, tensor in actor.items():
        if name not in reported:
            out.append(f"{name}: not in the engine")
            continue
        dtype, digest = reported[name]
        if fingerprint(tensor, dtype) != digest:
            out.append(f"{name}: differs from the actor's")
    return out
