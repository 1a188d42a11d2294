"""An engine of several vLLM data-parallel ranks: one host process per rank.

`DataParallelEngine` is the backend of an engine's host actor when the engine has dp > 1
(runtime/workers/host.py, RolloutWorker.start): one Ray actor per rank, each a RolloutWorker
with the engine's real backend and its rank's slice (vLLM 0.33 runs offline data parallelism
as one `LLM` per DP rank, vllm/entrypoints/llm.py). generate splits the requests over the
ranks, and a rank without requests gets a placeholder (the ranks of a MoE engine step
together); everything else goes to every rank.

Why, placement, start order and health: docs/design.md, "Engines of several data-parallel ranks".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from runtime.core.hosts import ENGINE_GPU_SHARE_COLOCATED, split
from runtime.core.interfaces import Generation, GenerationRequest, RolloutBackend, SamplingParams
from runtime.core.slices import EngineSlice


def rank_batches(requests: Sequence, ranks: int) -> tuple[list[list], list[bool]]:
    """Per rank, the requests it generates, and whether its results are kept: contiguous
    even shares in order; when some rank has work, a rank without any gets a copy of the
    first request (its result dropped), so that every rank steps. No requests: no calls."""
    if not requests:
        return [], []
    shares = split(len(requests), ranks)
    batches = [[requests[i] for i in share] or [requests[0]] for share in shares]
    return batches, [len(share) > 0 for share in shares]


def rank_host_gpus(rank: EngineSlice) -> float:
    """GPU share of a rank's host: none when the rank's TP workers are Ray actors on its
    bundles (more than one GPU), else the engine host's share (runtime/core/hosts.py)."""
    if len(rank.gpus) > 1:
        return 0.0
    return ENGINE_GPU_SHARE_COLOCATED if rank.colocated else 1.0


class DataParallelEngine(RolloutBackend):
    def __init__(self, backend_name: str, host: type):
        self.backend_name = backend_name
        self.host = host  # the class of the ranks' hosts: actors.RolloutWorker, the caller's
        self.ranks: list = []
        self.transfer_backend: str | None = None

    def start(self, slice: EngineSlice) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if slice.dp < 2 or slice.dp_rank is not None:
            raise ValueError(f"engine {slice.engine}: a data-parallel engine needs dp > 1 and "
                             f"the whole engine's slice (dp {slice.dp}, rank {slice.dp_rank})")
        if not ray.is_initialized():
            raise RuntimeError(f"engine {slice.engine}: its {slice.dp} DP ranks run in Ray "
                               "actors; this process is not in a Ray cluster")
        self.slice = slice
        group = ray.util.get_current_placement_group()
        host_cls = ray.remote(self.host)

        def host(rank: EngineSlice):
            options: dict = {"num_cpus": 0, "num_gpus": rank_host_gpus(rank)}
            if group is not None and rank.bundles:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=rank.bundles[0],
                    placement_group_capture_child_tasks=True)
            return host_cls.options(**options).remote(self.backend_name)

        first = host(slice.for_dp_rank(0, None))
        master = ray.get(first.rendezvous.remote())
        ranks = [slice.for_dp_rank(r, tuple(master)) for r in range(slice.dp)]
        self.ranks = [first] + [host(rank) for rank in ranks[1:]]
        self._all("start", per_rank=[(rank,) for rank in ranks])
        self.transfer_backend = self._all("transfer_backend")[0]

    # ------------------------------------------------------------------------- calling

    def _all(self, method: str, *args, per_rank: Sequence[tuple] | None = None) -> list:
        """method on every rank at once; the results in rank order. A rank that died takes
        this host down (the supervisor then restarts the whole engine)."""
        import ray

        calls = per_rank if per_rank is not None else [args] * len(self.ranks)
        refs = [getattr(r, method).remote(*a) for r, a in zip(self.ranks, calls, strict=True)]
        pending = list(refs)
        try:
            # in the order they finish: the other ranks of a MoE engine would wait for a dead
            # one forever, inside vLLM's DP all-reduce
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                ray.get(ready)
            return ray.get(refs)
        except ray.exceptions.RayActorError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            print(f"vime: engine {self.slice.engine}: a DP rank died during {method} "
                  f"({type(err).__name__}: {first[:200]}); its host exits with it",
                  file=sys.stderr, flush=True)
            os._exit(1)

    def _same(self, method: str, *args):
        """A value every rank must agree on."""
        values = self._all(method, *args)
        if any(v != values[0] for v in values):
            raise RuntimeError(f"engine {self.slice.engine}: its DP ranks disagree on "
                               f"{method}: {values}")
        return values[0]

    # ------------------------------------------------------------------------ the engine

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Generation]:
        batches, kept = rank_batches(list(requests), len(self.ranks))
        if not batches:
            return []
        parts = self._all("generate", per_rank=[(batch, params) for batch in batches])
        return [g for part, keep in zip(parts, kept, strict=True) if keep for g in part]

    def update_weights(self, bucket) -> None:
        self._all("update_weights", bucket)

    def weight_version(self) -> int:
        return self._same("weight_version")

    def sleep(self, level: int = 1) -> None:
        self._all("sleep", level)

    def wake(self, tags: Sequence[str] = ("weights", "kv_cache")) -> None:
        self._all("wake", list(tags))

    def healthy(self) -> bool:
        return all(self._all("ping"))

    def resident_bytes(self) -> int:
        return sum(self._all("resident_bytes"))

    def rank_hosts(self) -> list:
        """The ranks' Ray actors, in rank order."""
        return list(self.ranks)

    def where_ranks(self) -> list[dict]:
        return self._all("where")

    def stop(self) -> None:
        if self.ranks:
            self._all("stop")

    # vLLM's weight-transfer steps (runtime/backends/vllm_weights.py, EngineClient): every
    # rank of the engine, each with the engine's payload

    def world_size(self) -> int:
        """Workers of the engine: each rank's LLM reports TP x PP x DP, the whole engine."""
        return self._same("call", "world_size")

    def init_weight_transfer(self, init_info: dict) -> None:
        self._all("call", "init_weight_transfer", init_info)

    def start_weight_update(self) -> None:
        self._all("call", "start_weight_update")

    def receive_weights(self, update_info: dict) -> None:
        self._all("call", "receive_weights", update_info)

    def finish_weight_update(self, version: int | None = None) -> None:
        self._all("call", "finish_weight_update", version)

    def set_weight_version(self, version: int) -> None:
        self._all("call", "set_weight_version", version)

    def shutdown_weight_transfer(self) -> None:
        self._all("call", "shutdown_weight_transfer")

    def fingerprints(self, names: Sequence[str]) -> list[dict]:
        """Per worker of every rank, in rank order."""
        return [w for part in self._all("call", "fingerprints", list(names)) for w in part]
