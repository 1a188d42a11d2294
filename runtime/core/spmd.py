"""The training ranks of one torchrun world, driven from rank 0 without Ray.

On one node with several GPUs and no Ray (a GPU machine without Ray installed), every
process of `torchrun --nproc-per-node N` hosts one training rank
(runtime.workers.host.TrainWorker); rank 0 also runs the GRPO loop and the rollout engine,
and its TrainGroup holds one RankHandle per rank. A call on the group is broadcast to every
rank (torch.distributed's object collectives), each rank runs it on its own share, and the
results are gathered back to rank 0 — the same calls, in the same order, as the Ray actors
receive, so the backends' collectives (tensor-parallel all-reduces, the expert all-to-all,
weight gathers) line up. The other ranks wait in `follow` until rank 0 says stop.

The job that runs this (`python -m torch.distributed.run ... -m runtime.node.torchrun SPEC`)
is runtime/node/torchrun.py; the ranks' group is `runtime.workers.build.spmd_group`.

Rollout engines live on rank 0: arguments that are engine hosts (hosts whose class says
`stays_on_rank_0`, runtime.workers.host.RolloutWorker) are not sent to the other ranks,
which only take part in the gathers of a weight export.
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
