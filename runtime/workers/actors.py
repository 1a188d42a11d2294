"""Where the backends live: one host object per training rank and per rollout engine, and
the two groups the loop talks to.

A host wraps a backend and adds what only the runtime knows: which GPU it got, the rank-0
address for torch.distributed, and pushing exported weights to the engines. On Ray each host
is an actor pinned to its placement-group bundle (runtime/node/placement.py); in-process hosts
(`local=True`) run the same code without Ray, for tests and debugging of one rank and one
engine.

GPU shares per actor (runtime/core/hosts.py): colocated, a training rank takes 0.4 of its GPU
and an engine 0.2 (slime's numbers), so both fit on one bundle; disaggregated, each takes its
whole GPU. On a machine without GPUs the GPUs are Ray's logical ones and the backends use the CPU.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence

from runtime import backends
from runtime.core import hosts
from runtime.core.hosts import (
    ENGINE_GPU_SHARE_COLOCATED,
    TRAIN_GPU_SHARE_COLOCATED,
    balanced_split,
    split,
)
from runtime.core.hosts import call_all as _call_all
from runtime.core.interfaces import TrainBatch, WeightBucket
from runtime.core.slices import EngineSlice, JobConfig, TrainSlice
from runtime.workers import weight_sync
from runtime.workers.weight_sync import RankExport, SyncRoute


def _where() -> dict:
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        import ray

        if ray.is_initialized():
            context = ray.get_runtime_context()
            info.update(node_id=context.get_node_id(), gpu_ids=[str(g) for g in ray.get_gpu_ids()])
    except ImportError:
        pass
    return info


class _Host:
    """What both hosts answer the same way, whatever their backend."""

    def where(self) -> dict:
        return _where()

    def resident_bytes(self) -> int:
        return self.backend.resident_bytes()

    def stop(self) -> None:
        self.backend.stop()

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port: for a training rank 0 to be the
        process-group master or the NCCL weight-transfer rendezvous, for an engine's DP
        rank 0 to be vLLM's DP master."""
        try:
            import ray

            address = ray.util.get_node_ip_address()
        except Exception:
            address = "127.0.0.1"
        with socket.socket() as sock:
            sock.bind(("", 0))
            return address, sock.getsockname()[1]


def actor_on_cuda() -> bool:
    """Whether this process's actor rank can hand vLLM's trainer engines CUDA tensors."""
    import torch

    return torch.cuda.is_available()


class TrainWorker(_Host):
    """Host of one training rank."""

    def __init__(self, backend_name: str):
        self.backend = backends.load("training", backend_name)()
        self.rank, self.world = 0, 1
        self._transfer: tuple | None = None  # (made for, vLLM's trainer engine, source)
        self._export_s = 0.0  # seconds inside the backend's export since the last take

    def _timed(self, buckets: Iterator[dict]) -> Iterator[dict]:
        """The export's buckets, the time spent producing them (gather, copies, an offloaded
        actor's weights brought back) added up: a push's time less this is the transfer's."""
        buckets = iter(buckets)
        while True:
            began = time.perf_counter()
            try:
                bucket = next(buckets)
            except StopIteration:
                return
            finally:
                self._export_s += time.perf_counter() - began
            yield bucket

    def take_export_seconds(self) -> float:
        seconds, self._export_s = self._export_s, 0.0
        return seconds

    def init(self, slice: TrainSlice) -> None:
        self.rank, self.world = slice.rank, slice.world_size
        self.backend.init(slice)

    def log_probs(self, batch: TrainBatch, model: str):
        return self.backend.log_probs(batch, model)

    def train_step(self, batch: TrainBatch) -> dict:
        return self.backend.train_step(batch)

    def push_weights(self, engines: Sequence, version: int, bucket_bytes: int) -> int:
        """The fallback path: every exported bucket to every engine's update_weights;
        returns the bytes sent."""
        sent = 0
        for tensors in self._timed(self.backend.export_weights(bucket_bytes)):
            _call_all(engines, "update_weights", WeightBucket(version, tensors, last=False))
            sent += sum(t.numel() * t.element_size() for t in tensors.values())
        return sent

    def export_traits(self) -> RankExport:
        """What the choice of a sync path needs to know of this rank
        (runtime/workers/weight_sync.py). The training backends export on rank 0 by default;
        a backend with
        `exports_on_every_rank` (both of vime's: the torch one is data parallel, the
        Megatron gather leaves every full tensor on every rank) yields everything on every
        rank when asked, which vLLM's IPC path needs."""
        return RankExport(on_cuda=actor_on_cuda(),
                          holds_all=self.world == 1 or bool(self.backend.exports_on_every_rank))

    def send_weights(self, engines: Sequence, version: int, bucket_bytes: int,
                     route: SyncRoute) -> int:
        """One sync through vLLM's weight-transfer engine (route.path "nccl" or "ipc"). Every
        rank iterates its export inside vLLM's trainer engine, made on the first sync with
        these engines and kept for the next ones; rank 0 alone calls the engines. Returns
        the bytes of this rank's tensors that reached them."""
        import torch

        from runtime.backends import vllm_weights

        made_for = (route, bucket_bytes, tuple(_handle_key(e) for e in engines))
        if self._transfer is None or self._transfer[0] != made_for:
            if self._transfer is not None:
                self._transfer[1].shutdown()
            # IPC: every rank shares its own copies with the worker on its GPU; both paths
            # send from the GPU, so the export stays there
            every_rank = route.path == "ipc"
            source = vllm_weights.ExportSource(
                lambda: self._timed(self.backend.export_weights(
                    bucket_bytes, every_rank=every_rank, on_device=True)),
                torch.device("cuda", torch.cuda.current_device()))
            self._transfer = (made_for, vllm_weights.trainer_engine(
                engines, route, self.rank, source, bucket_bytes), source)
        _, engine, source = self._transfer
        sent = vllm_weights.send(engines, version, self.rank, engine, source)
        return sent if self.rank in route.senders else 0

    def offload(self) -> tuple[float, int]:
        """The backend offloaded; returns (seconds, device bytes it held before)."""
        held = self.resident_bytes()
        began = time.perf_counter()
        self.backend.offload()
        return time.perf_counter() - began, max(held, 0)

    def onload(self) -> float:
        began = time.perf_counter()
        self.backend.onload()
        return time.perf_counter() - began

    def save(self, path) -> None:
        self.backend.save(path)

    def load(self, path) -> None:
        self.backend.load(path)

    def save_hf(self, path) -> None:
        self.backend.save_hf(path)


class RolloutWorker(_Host):
    """Host of one rollout engine, or of one vLLM data-parallel rank of an engine. The host
    of an engine with dp > 1 holds its ranks' hosts (runtime/workers/dp_engine.py)."""

    # in a torchrun world the engines are rank 0's own objects (runtime/core/spmd.py)
    stays_on_rank_0 = True

    def __init__(self, backend_name: str):
        self.backend_name = backend_name
        self.backend = backends.load("rollout", backend_name)()

    def start(self, slice: EngineSlice) -> None:
        if slice.dp > 1 and slice.dp_rank is None:
            from runtime.workers.dp_engine import DataParallelEngine

            # its ranks' hosts are RolloutWorkers too, handed down rather than imported there
            self.backend = DataParallelEngine(self.backend_name, RolloutWorker)
        self.backend.start(slice)

    def where(self) -> dict:
        info = _where()
        ranks = self.backend.where_ranks()
        if ranks is not None:
            info["dp_ranks"] = ranks
        return info

    def transfer_backend(self) -> str | None:
        """vLLM's weight-transfer backend the engine started with; None for an engine
        without one (the torch engines), which takes the fallback."""
        return self.backend.transfer_backend

    def generate(self, requests, params):
        return self.backend.generate(requests, params)

    def update_weights(self, bucket: WeightBucket) -> None:
        self.backend.update_weights(bucket)

    def weight_version(self) -> int:
        return self.backend.weight_version()

    def sleep(self, level: int) -> None:
        self.backend.sleep(level)

    def wake(self, tags) -> None:
        self.backend.wake(tags)

    def ping(self) -> bool:
        """The supervisor's health check (runtime/workers/supervisor.py): the actor answers (and,
        for an engine of several DP ranks, so do its ranks)."""
        return self.backend.healthy()

    def call(self, method: str, *args):
        """A backend's own method (vLLM's weight-transfer steps, runtime/backends/
        vllm_weights.py)."""
        return getattr(self.backend, method)(*args)


# ------------------------------------------------------------------------------- calling

def _handle_key(handle):
    """What tells engine hosts apart across calls: a Ray actor's id, else the object."""
    actor_id = getattr(handle, "_actor_id", None)
    return actor_id.hex() if actor_id is not None else id(handle)


def spmd_group(config: JobConfig, rank: int, cpu_threads: int = 1) -> TrainGroup | None:
    """The training ranks as the processes of one torchrun world (runtime/core/spmd.py): every
    process calls this; rank 0 gets the group, the others serve rank 0's calls and get None
    when it stops them."""
    import os

    import torch
    import torch.distributed as dist

    from runtime.core import spmd

    if not dist.is_initialized():  # torchrun's environment (MASTER_ADDR, RANK, WORLD_SIZE)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    worker = TrainWorker(config.train_backend)
    worker.init(config.train_slice(rank, os.environ["MASTER_ADDR"],
                                   int(os.environ["MASTER_PORT"]), cpu_threads))
    if rank != 0:
        spmd.follow(worker)
        return None
    hosts.SPMD_WORKER[0] = worker
    return TrainGroup.from_plan([spmd.RankHandle(r) for r in range(len(config.ranks))],
                                config.ranks, config.train["balance_data"])


class TrainGroup:
    """Every rank of the actor. A call goes to all ranks; the ranks of one data-parallel
    replica (its tensor-parallel ranks) get the same share of the samples, and one of them
    (tensor rank 0) reports for the replica."""

    def __init__(self, workers: Sequence, data_ranks: Sequence[int] | None = None,
                 reporting: Sequence[bool] | None = None, balance_data: bool = False):
        self.workers = list(workers)
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
    def from_plan(cls, workers: Sequence, ranks: Sequence,
                  balance_data: bool = False) -> TrainGroup:
        """With the plan's coordinates of each rank (plan.json's train.ranks)."""
        return cls(workers, [r.get("dp", i) for i, r in enumerate(ranks)],
                   [r.get("tp", 0) == 0 and r.get("cp", 0) == 0 for r in ranks], balance_data)

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
        return rollout.receive_weights(lambda: self._push(rollout, version, bucket_bytes))

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


# ------------------------------------------------------------------------------ building

def local_groups(config: JobConfig, cpu_threads: int = 1) -> tuple[TrainGroup, RolloutGroup]:
    """One rank and one engine in this process (tests, debugging)."""
    if len(config.ranks) != 1 or len(config.engines) != 1:
        raise ValueError("in-process groups hold one rank and one engine; this plan has "
                         f"{len(config.ranks)} and {len(config.engines)}")
    trainer = TrainWorker(config.train_backend)
    trainer.init(config.train_slice(0, "127.0.0.1", 0, cpu_threads))
    engine = RolloutWorker(config.rollout_backend)
    engine.start(config.engine_slice(0, cpu_threads))
    return TrainGroup([trainer]), RolloutGroup([engine])


def ray_groups(config: JobConfig, placement, cpu_threads: int) -> tuple[TrainGroup, RolloutGroup]:
    """A Ray actor per rank and per engine, each on the bundle of its plan GPU."""
    import ray

    train_share = TRAIN_GPU_SHARE_COLOCATED if config.colocate else 1.0
    train_cls = ray.remote(TrainWorker)
    trainers = [train_cls.options(**_on(placement, placement.bundle(r["node"], r["gpu"]),
                                        train_share, False))
                .remote(config.train_backend) for r in config.ranks]
    engines = [new_engine_actor(config, placement, i) for i in range(len(config.engines))]
    address, port = ray.get(trainers[0].rendezvous.remote())
    ray.get([t.init.remote(config.train_slice(r, address, port, cpu_threads))
             for r, t in enumerate(trainers)])
    ray.get([e.start.remote(config.engine_slice(i, cpu_threads,
                                                engine_bundles(config, placement, i)))
             for i, e in enumerate(engines)])
    return (TrainGroup.from_plan(trainers, config.ranks, config.train["balance_data"]),
            RolloutGroup(engines))


def _on(placement, bundle: int, share: float, children: bool) -> dict:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    # an engine's own workers (vLLM's Ray executor) must land in the group too
    return {"num_cpus": 0, "num_gpus": share,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement.group, placement_group_bundle_index=bundle,
                placement_group_capture_child_tasks=children)}


def engine_bundles(config: JobConfig, placement, index: int) -> tuple[int, ...]:
    return tuple(placement.bundle(g["node"], g["gpu"]) for g in config.engines[index]["gpus"])


def engine_host_gpus(config: JobConfig, index: int) -> float:
    """The GPU share of an engine's host actor: an engine of several GPUs runs its workers as
    Ray actors on its bundles (vLLM's Ray executor), which take the GPUs; its host takes none
    (runtime/backends/vllm_rollout.py, `launch`)."""
    if len(config.engines[index]["gpus"]) > 1:
        return 0.0
    return ENGINE_GPU_SHARE_COLOCATED if config.colocate else 1.0


def new_engine_actor(config: JobConfig, placement, index: int):
    """An (unstarted) engine actor on the bundle of the engine's first GPU; also how the
    supervisor replaces a dead one (runtime/workers/supervisor.py)."""
    import ray

    engine_share = engine_host_gpus(config, index)
    return (ray.remote(RolloutWorker)
            .options(**_on(placement, engine_bundles(config, placement, index)[0], engine_share,
                           True))
            .remote(config.rollout_backend))
