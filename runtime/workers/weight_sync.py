"""Which way a weight sync travels, and which actor ranks take part.

Two paths from the actor to the engines: "nccl" / "ipc", vLLM's weight-transfer engine
(runtime/backends/vllm_weights.py), where the actor's rank 0 is the only one that calls the
engines; and "collective_rpc", the fallback, where every rank sends its export's buckets
through Ray to each engine's `update_weights`. `route` decides from what the engines and the
ranks report; it is pure, and tested without vLLM (tests/runtime/test_weight_sync.py).
Each path's ranks and rendezvous: docs/design.md, "Which way a weight sync travels".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from runtime.backends.vllm_rollout import weight_path

COLLECTIVE_RPC = "collective_rpc"


@dataclass(frozen=True)
class RankExport:
    """What one actor rank reports about its export."""

    on_cuda: bool  # vLLM's trainer engines stage and share tensors on the rank's GPU
    holds_all: bool  # its export yields every tensor (a world of one, or a replicated actor)


@dataclass(frozen=True)
class SyncRoute:
    path: str  # "nccl", "ipc" or "collective_rpc"
    world: int  # actor ranks; all of them iterate the export
    senders: tuple[int, ...]  # ranks whose tensors reach the engines
    master: tuple[str, int] | None = None  # NCCL: the rendezvous, on rank 0's node
    engine_worlds: tuple[int, ...] = ()  # NCCL: workers per engine (TP x PP x DP)

    @property
    def transfer(self) -> bool:
        """Through vLLM's weight-transfer engine."""
        return self.path != COLLECTIVE_RPC

    @staticmethod
    def drives(rank: int) -> bool:
        """Whether this rank calls the engines (vLLM's trainer engines: rank 0 only)."""
        return rank == 0

    @property
    def group_size(self) -> int:
        """NCCL: the sender plus every worker of every engine."""
        return 1 + sum(self.engine_worlds)

    def rank_offsets(self) -> tuple[int, ...]:
        """NCCL: the group rank of each engine's first worker (vLLM adds dp_index x TP x PP
        + the worker's rank to it, nccl_common._worker_group_rank)."""
        out, offset = [], 1
        for world in self.engine_worlds:
            out.append(offset)
            offset += world
        return tuple(out)


def route(engine_backends: Sequence[str | None], ranks: Sequence[RankExport],
          same_process: bool = False) -> SyncRoute:
    """The path for engines reporting these transfer backends (None: an engine without
    vLLM's transfer engine) and actor ranks reporting these exports; `same_process`: an
    engine lives in an actor rank's process (in-process groups, a torchrun world's rank 0:
    runtime/core/spmd.py)."""
    world = len(ranks)
    everyone = tuple(range(world))
    kinds = set(engine_backends)
    if len(kinds) > 1:
        raise ValueError(f"the engines report different weight-transfer backends: "
                         f"{list(engine_backends)}")
    backend = kinds.pop() if kinds else None
    if backend is None:
        return SyncRoute(COLLECTIVE_RPC, world, everyone)
    # a world of one holds whatever it exports
    holds_all = world == 1 or all(r.holds_all for r in ranks)
    path = weight_path(backend, all(r.on_cuda for r in ranks), holds_all, same_process)
    return SyncRoute(path, world, (0,) if path == "nccl" else everyone)


def with_rendezvous(decided: SyncRoute, master: tuple[str, int],
                    engine_worlds: Sequence[int]) -> SyncRoute:
    """An NCCL route completed with rank 0's address and port and the engines' worker
    counts; other routes need neither."""
    if decided.path != "nccl":
        return decided
    return replace(decided, master=(str(master[0]), int(master[1])),
                   engine_worlds=tuple(int(w) for w in engine_worlds))
