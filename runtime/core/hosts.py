"""Calling a set of hosts, sharing work between them, and the GPU share each takes: what the
workers that drive the hosts (runtime/workers/) and a backend that calls engines itself
(runtime/backends/vllm_weights.py) both need, so it lives below both (runtime/README.md).

A host is a training rank's or an engine's TrainWorker / RolloutWorker
(runtime/workers/host.py): a Ray actor, an in-process object, or a rank of a torchrun world
(runtime/core/spmd.py).

GPU shares per actor: colocated, a training rank takes 0.4 of its GPU and an engine 0.2
(slime's numbers), so both fit on one bundle; disaggregated, each takes its whole GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

TRAIN_GPU_SHARE_COLOCATED = 0.4
ENGINE_GPU_SHARE_COLOCATED = 0.2


def _is_ray(handle) -> bool:
    return hasattr(getattr(handle, "where", None), "remote")


def call_all(handles: Sequence, method: str, *args, per_handle: Sequence | None = None):
    """Call method on every host (Ray actors in parallel) and return the results in order.
    per_handle: one argument tuple per host instead of the same args for all."""
    calls = per_handle if per_handle is not None else [args] * len(handles)
    from runtime.core import spmd

    if handles and isinstance(handles[0], spmd.RankHandle):  # a torchrun world, from rank 0
        return spmd.call_all(SPMD_WORKER[0], method, calls)
    if handles and _is_ray(handles[0]):
        import ray

        return ray.get([getattr(h, method).remote(*a) for h, a in zip(handles, calls, strict=True)])
    return [getattr(h, method)(*a) for h, a in zip(handles, calls, strict=True)]


# rank 0's own TrainWorker when the ranks are a torchrun world (actors.spmd_group sets it)
SPMD_WORKER: list = [None]


def balanced_split(costs: Sequence[int], parts: int) -> list[list[int]]:
    """Indices of `costs` in `parts` shares of split()'s sizes (the same number of items as a
    contiguous split), the sums of their costs as even as a greedy pass makes them: the largest
    item first, each to the share with the smallest sum that still has room. Indices are in
    ascending order within a share; equal inputs give equal shares."""
    sizes = [len(r) for r in split(len(costs), parts)]
    shares: list[list[int]] = [[] for _ in range(parts)]
    sums = [0] * parts
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        part = min((p for p in range(parts) if len(shares[p]) < sizes[p]),
                   key=lambda p: (sums[p], p))
        shares[part].append(index)
        sums[part] += costs[index]
    return [sorted(share) for share in shares]


def split(count: int, parts: int) -> list[range]:
    """count items in `parts` contiguous shares, sizes differing by at most one."""
    base, extra = divmod(count, parts)
    out, start = [], 0
    for index in range(parts):
        size = base + (index < extra)
        out.append(range(start, start + size))
        start += size
    return out
