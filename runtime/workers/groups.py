"""The two groups the loop talks to: TrainGroup (every training rank) and RolloutGroup (every
engine). A call goes to all hosts of the group (runtime/core/hosts.py, call_all)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from runtime.core.hosts import balanced_split, split
from runtime.core.hosts import call_all as _call_all
from runtime.core.interfaces import TrainBatch, WeightBucket
from runtime.workers import weight_sync
from runtime.workers.host import _handle_key
from runtime.workers.weight_sync import SyncRoute
from vime.layout import Layout


class TrainGroup:
    """Every rank of the actor. A call goes to all ranks; the ranks of one data-parallel
    replica (its tensor-parallel ranks) get the same share of the samples, and one of them
    (tensor rank 0) reports for the replica."""

    def __init__(self, workers: Sequence, data_ranks: Sequence[int] | None = None,
                 reporting: Sequence[bool] | None = None, balance_data: bool = False,
                 on_first_push: Callable[[], object] | None = None):
        self.workers = list(workers)
        self.on_first_push = on_first_push  # called once the first push has ended
        # train.balance_data: replicas get equal token sums rather than contiguous samples
        self.balance_data = balance_data
        self.data_ranks = list(data_ranks) if data_ranks is not None else list(range(len(workers)))
        self.reporting = list(reporting) if reporting is not None else [True] * len(workers)
        self.replicas = max(self.data_ranks) + 1
        self._route: tuple | None = None  # (the engines it was decided for, SyncRoute)
        self.export_seconds = 0.0  # of the last push, on its slowest rank
        # the last offload's and onload's seconds on the slowest rank, and the bytes moved off
        self.moves: dict[str, float] = {}
        if sorted(d for d, r in zip(self.data_ranks, self.reporting, strict=True) if r) \
                != list(range(self.replicas)):
            raise ValueError("every data-parallel replica needs exactly one reporting rank: "
                             f"dp {self.data_ranks}, reporting {self.reporting}")

    @classmethod
    def from_layout(cls, workers: Sequence, layout: Layout, balance_data: bool = False,
                    on_first_push: Callable[[], object] | None = None) -> TrainGroup:
        """Rank r of `workers` at layout.coordinates(r): its data-parallel replica, and
        whether it reports for it (tensor and context rank 0).

        Raises:
            ValueError: the layout has another number of ranks.
        """
        if len(workers) != layout.world_size:
            raise ValueError(f"{len(workers)} training ranks for a layout of "
                             f"{layout.world_size}")
        coords = [layout.coordinates(rank) for rank in range(layout.world_size)]
        return cls(workers, [c["dp"] for c in coords],
                   [c["tp"] == 0 and c["cp"] == 0 for c in coords], balance_data, on_first_push)

    @property
    def size(self) -> int:
        return len(self.workers)

    def _assignment(self, batch: TrainBatch) -> list[list[int]]:
        """The sample indices of each replica: contiguous runs, or with balance_data the same
        counts with even token sums (prompt + response, what a forward costs)."""
        if self.balance_data and self.replicas > 1:
            return balanced_split([len(tokens) for tokens in batch.tokens], self.replicas)
        return [list(share) for share in split(len(batch), self.replicas)]

    def _shares(self, batch: TrainBatch, assignment: list[list[int]]) -> list[TrainBatch]:
        return [batch.select(assignment[d]) for d in self.data_ranks]

    def _reports(self, results: list) -> list:
        """One result per replica, in replica order."""
        by_replica = {d: r for d, r, on in zip(self.data_ranks, results, self.reporting,
                                                strict=True) if on}
        return [by_replica[d] for d in range(self.replicas)]

    def log_probs(self, batch: TrainBatch, model: str) -> list[list[float]]:
        """Per sample, in the batch's order."""
        assignment = self._assignment(batch)
        results = _call_all(self.workers, "log_probs", per_handle=[
            (share, model) for share in self._shares(batch, assignment)])
        ordered: list = [None] * len(batch)
        for indices, part in zip(assignment, self._reports(results), strict=True):
            for index, values in zip(indices, part, strict=True):
                ordered[index] = values
        return ordered

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        shares = self._shares(batch, self._assignment(batch))
        results = self._reports(_call_all(self.workers, "train_step",
                                          per_handle=[(s,) for s in shares]))
        combined = {k: v for k, v in results[0].items() if k.startswith("step/")}
        for key in results[0]:
            if not key.startswith("step/"):
                combined[key] = sum(r.get(key, 0.0) for r in results)
        return combined

    def sync_route(self, rollout: RolloutGroup) -> SyncRoute:
        """How weights reach these engines (runtime/workers/weight_sync.py), decided on the first
        sync to this set of engines (a replaced engine makes a new set: a new NCCL
        rendezvous) and kept."""
        engines = tuple(_handle_key(h) for h in rollout.workers)
        if self._route is None or self._route[0] != engines:
            processes = {(w["host"], w["pid"]) for w in _call_all(self.workers, "where")}
            shared = any((w["host"], w["pid"]) in processes
                         for w in _call_all(rollout.workers, "where"))
            decided = weight_sync.route(_call_all(rollout.workers, "transfer_backend"),
                                        _call_all(self.workers, "export_traits"), shared)
            if decided.path == "nccl":
                # every rank answers (a torchrun world takes calls on all ranks); rank 0's
                # node hosts the rendezvous
                master = _call_all(self.workers, "rendezvous")[0]
                decided = weight_sync.with_rendezvous(
                    decided, master, _call_all(rollout.workers, "call", "world_size"))
            self._route = (engines, decided)
            print(f"vime: weights reach {len(engines)} engine(s) by {decided.path}"
                  + (" (same process)" if shared else ""), flush=True)
        return self._route[1]

    def push_weights(self, rollout: RolloutGroup, version: int, bucket_bytes: int) -> int:
        """Weights `version` to every engine of rollout; an engine that dies in the push is
        the rollout group's to handle (RolloutGroup.receive_weights). Returns bytes sent."""
        sent = rollout.receive_weights(lambda: self._push(rollout, version, bucket_bytes))
        first, self.on_first_push = self.on_first_push, None
        if first is not None:
            first()
        return sent

    def _push(self, rollout: RolloutGroup, version: int, bucket_bytes: int) -> int:
        route = self.sync_route(rollout)
        if route.transfer:
            sent = sum(_call_all(self.workers, "send_weights", rollout.workers, version,
                                 bucket_bytes, route))
        else:
            sent = sum(_call_all(self.workers, "push_weights", rollout.workers, version,
                                 bucket_bytes))
            _call_all(rollout.workers, "update_weights", WeightBucket(version, {}, last=True))
        versions = _call_all(rollout.workers, "weight_version")
        if any(v != version for v in versions):
            raise RuntimeError(f"weight update {version}: the engines report {versions}")
        self.export_seconds = max(_call_all(self.workers, "take_export_seconds"))
        return sent

    def offload(self) -> None:
        moved = _call_all(self.workers, "offload")
        self.moves["offload/actor_out_s"] = max(seconds for seconds, _ in moved)
        self.moves["offload/actor_gb"] = sum(held for _, held in moved) / 1e9

    def onload(self) -> None:
        self.moves["offload/actor_in_s"] = max(_call_all(self.workers, "onload"))

    def save(self, path) -> None:
        _call_all(self.workers, "save", path)

    def begin_save(self, path) -> None:
        """Every rank's state copied to its host memory; the writes go on in the background."""
        _call_all(self.workers, "begin_save", path)

    def finish_save(self) -> float:
        """Every rank's background write waited for; the slowest rank's seconds of writing."""
        return max(_call_all(self.workers, "finish_save"))

    def load(self, path) -> None:
        _call_all(self.workers, "load", path)

    def save_hf(self, path) -> None:
        _call_all(self.workers, "save_hf", path)

    def resident_bytes(self) -> int:
        return sum(_call_all(self.workers, "resident_bytes"))

    def where(self) -> list[dict]:
        return _call_all(self.workers, "where")

    def stop(self) -> None:
        _call_all(self.workers, "stop")


class RolloutGroup:
    """Every engine; a generate call is split evenly over them."""

    def __init__(self, workers: Sequence):
        self.workers = list(workers)

    @property
    def size(self) -> int:
        return len(self.workers)

    def generate(self, requests, params):
        shares = split(len(requests), self.size)
        results = _call_all(self.workers, "generate",
                            per_handle=[([requests[i] for i in s], params) for s in shares])
        return [g for part in results for g in part]

    def sleep(self, level: int) -> None:
        _call_all(self.workers, "sleep", level)

    def wake(self, tags) -> None:
        _call_all(self.workers, "wake", list(tags))

    def resident_bytes(self) -> int:
        return sum(_call_all(self.workers, "resident_bytes"))

    def weight_versions(self) -> list[int]:
        """The weight version each engine generates with (its last complete update)."""
        return _call_all(self.workers, "weight_version")

    def where(self) -> list[dict]:
        return _call_all(self.workers, "where")

    def rollout_numbers(self) -> dict[str, float]:
        """Return the group's own numbers for a rollout's metrics: none for engines that
        nobody restarts (runtime/workers/supervisor.py reports its restarts)."""
        return {}

    def receive_weights(self, push: Callable[[], int]) -> int:
        """push() sends the weights to these engines; a group that restarts engines
        (runtime/workers/supervisor.py) retries it after replacing one that died."""
        return push()

    def stop(self) -> None:
        _call_all(self.workers, "stop")
