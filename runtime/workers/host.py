"""The hosts of the backends: one per training rank (TrainWorker) and per rollout engine
(RolloutWorker), a Ray actor pinned to its bundle or an in-process object. A host adds what
only the runtime knows: its GPU, the rank-0 address, pushing exported weights to the engines."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator, Sequence

from runtime import backends
from runtime.core.hosts import call_all as _call_all
from runtime.core.interfaces import TrainBatch, WeightBucket
from runtime.core.slices import EngineSlice, TrainSlice
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

    def init(self, slice: TrainSlice) -> float:
        """The backend built and its weights loaded; returns the seconds it took."""
        began = time.perf_counter()
        self.rank, self.world = slice.rank, slice.world_size
        self.backend.init(slice)
        return time.perf_counter() - began

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

    def begin_save(self, path) -> None:
        self.backend.begin_save(path)

    def finish_save(self) -> float:
        return self.backend.finish_save()

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

    def start(self, slice: EngineSlice) -> float:
        """The engine started (weights, warm-up, KV cache); returns the seconds it took."""
        began = time.perf_counter()
        if slice.dp > 1 and slice.dp_rank is None:
            from runtime.workers.dp_engine import DataParallelEngine

            # its ranks' hosts are RolloutWorkers too, handed down rather than imported there
            self.backend = DataParallelEngine(self.backend_name, RolloutWorker)
        self.backend.start(slice)
        return time.perf_counter() - began

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


def _handle_key(handle):
    """What tells engine hosts apart across calls: a Ray actor's id, else the object."""
    actor_id = getattr(handle, "_actor_id", None)
    return actor_id.hex() if actor_id is not None else id(handle)
