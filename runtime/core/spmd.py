"""The training ranks of one torchrun world, driven from rank 0 without Ray.

The job that runs this (`python -m torch.distributed.run ... -m runtime.node.torchrun SPEC`)
is runtime/node/torchrun.py; the ranks' group is `runtime.workers.build.spmd_group`. How a
call on the group reaches every rank and why the rollout engines stay on rank 0:
docs/design.md, "Training ranks without Ray".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist

STOP = "__stop__"


@dataclass(frozen=True)
class RankHandle:
    """One rank of the world, as rank 0's TrainGroup sees it."""

    rank: int


def _local_only(value):
    """Engine hosts (runtime.workers.host.RolloutWorker) stay on rank 0. The host says so
    itself: this module is below the workers and cannot import their classes."""
    if isinstance(value, (list, tuple)) and value and all(getattr(v, "stays_on_rank_0", False)
                                                          for v in value):
        return []
    return value


def call_all(worker, method: str, calls: Sequence[tuple]) -> list:
    """On rank 0: run method on every rank with its argument tuple; the results in rank order."""
    world = dist.get_world_size()
    if len(calls) != world:
        raise ValueError(f"{len(calls)} argument tuples for {world} ranks")
    # rank 0's own arguments are used here, not sent (they may hold engines)
    sent = [(method, [()] + [tuple(_local_only(a) for a in c) for c in calls[1:]])]
    dist.broadcast_object_list(sent, src=0)
    result = getattr(worker, method)(*calls[0])
    gathered = [None] * world
    dist.gather_object(result, gathered, dst=0)
    return gathered


def follow(worker) -> None:
    """On every other rank: run what rank 0 broadcasts until it says stop."""
    rank = dist.get_rank()
    while True:
        received = [None]
        dist.broadcast_object_list(received, src=0)
        method, calls = received[0]
        if method == STOP:
            return
        result = getattr(worker, method)(*calls[rank])
        dist.gather_object(result, None, dst=0)


def stop() -> None:
    """On rank 0: release the other ranks from `follow`."""
    dist.broadcast_object_list([(STOP, [])], src=0)
