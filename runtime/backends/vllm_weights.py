"""The actor's side of vLLM's weight-transfer engine (distributed/weight_transfer/).

vLLM 0.32+ ships trainer engines that drive an update round (start, update, finish) through a
"client" and read the weights from a `WeightSource`; vLLM 0.26 has a static
`trainer_send_weights` for IPC (runtime/backends/vllm_compat.py holds the differences). Here:
`ExportSource` (a training backend's export as vLLM's source), `EngineClient` (the client over
vime's engine hosts), vLLM's init and update dataclasses filled from the plan, and
`trainer_engine` / `send` (one sync, then the version and the sample check). Imported only
by an actor that takes this path (`vllm_rollout.weight_path`); it imports vLLM at the top.
Each piece in detail: docs/design.md, "The actor's side of vLLM's weight transfer".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from functools import cached_property

from vllm.distributed.weight_transfer.base import ParamMeta

from runtime.backends import vllm_compat
from runtime.core import weights
from runtime.core.hosts import call_all as _call_all


class ExportSource:
    """The actor's export as what vLLM reads. Every rank owns every name it yields
    (owners None), so the NCCL trainer engine sends from rank 0 and IPC merges by position.
    `device`: where vLLM's trainer engines need the tensors (the rank's GPU: the NCCL
    communicator and the IPC buffer live there); the backends export there (on_device), so
    the move is a no-op unless a backend could not."""

    def __init__(self, export: Callable[[], Iterator[dict]], device=None):
        self._export = export
        self.device = device
        self.sample: dict = {}  # the sampled tensors of the last pass, for the check
        self.sent_bytes = 0  # bytes yielded by the last pass
        self.vllm = vllm_compat.weight_source(lambda: self.metadata, self.stream)

    @cached_property
    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, tensor.dtype, tuple(tensor.shape))
                for bucket in self._export() for name, tensor in bucket.items()]

    @cached_property
    def sample_names(self) -> frozenset[str]:
        return frozenset(weights.sample_names(m.name for m in self.metadata))

    def stream(self):
        self.sample, self.sent_bytes = {}, 0
        for bucket in self._export():
            for name, tensor in bucket.items():
                if name in self.sample_names:
                    self.sample[name] = tensor.detach().to("cpu", copy=True)
                self.sent_bytes += tensor.numel() * tensor.element_size()
                yield name, (tensor if self.device is None else tensor.to(self.device))


class EngineClient:
    """vLLM's VLLMWeightSyncClient protocol (structural) over vime's engine hosts."""

    def __init__(self, engines: Sequence, engine_worlds: Sequence[int]):
        self.engines = list(engines)
        self.engine_worlds = list(engine_worlds)

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        payloads = per_engine_init(init_info, self.engine_worlds)
        _call_all(self.engines, "call", per_handle=[("init_weight_transfer", p) for p in payloads])

    def start_weight_update(self) -> None:
        _call_all(self.engines, "call", "start_weight_update")

    def update_weights(self, update_info) -> None:
        _call_all(self.engines, "call", "receive_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = None if weight_version is None else int(weight_version)
        _call_all(self.engines, "call", "finish_weight_update", version)


def per_engine_init(init_info: dict, engine_worlds: Sequence[int]) -> list[dict]:
    """The workers' init payload for each engine: NCCL ranks follow the sender (rank 0)
    engine after engine; IPC payloads are the same for all."""
    if "rank_offset" not in init_info:
        return [dict(init_info) for _ in engine_worlds]
    out, offset = [], int(init_info["rank_offset"])
    for world in engine_worlds:
        out.append(dict(init_info, rank_offset=offset))
        offset += world
    return out


def trainer_init_info(backend: str, rank: int, bucket_bytes: int,
                      master: tuple[str, int] | None = None,
                      engine_worlds: Sequence[int] = ()):
    """vLLM's trainer-side init info (0.32+): the packed buffer is one bucket; NCCL's group is
    the sender plus every worker of every engine."""
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        if master is None:
            raise ValueError("an NCCL weight transfer needs the sender's address and port")
        return NCCLTrainerInitInfo(rank=rank, master_address=master[0], master_port=master[1],
                                   world_size=1 + sum(engine_worlds), packed=True,
                                   packed_buffer_size_bytes=bucket_bytes)
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=bucket_bytes)
    raise ValueError(f"no trainer side for weight-transfer backend {backend!r}")


def worker_init_infos(info, engine_worlds: Sequence[int]) -> list[dict]:
    """What each engine's workers receive at the handshake, as vLLM's trainer engines build it
    (nccl_common.build_worker_init_payload), with each engine's own rank offset."""
    if hasattr(info, "master_address"):
        from vllm.distributed.weight_transfer.nccl_common import (
            NCCLWeightTransferInitInfo,
            worker_init_payload,
        )

        worker = NCCLWeightTransferInitInfo(
            master_address=info.master_address, master_port=info.master_port, rank_offset=1,
            world_size=info.world_size, packed=info.packed,
            packed_buffer_size_bytes=info.packed_buffer_size_bytes,
            packed_num_buffers=info.packed_num_buffers)
        return per_engine_init(worker_init_payload(worker), engine_worlds)
    return per_engine_init(vllm_compat.ipc_init_payload(info.packed), engine_worlds)


def update_info(backend: str, metadata: Sequence[ParamMeta], ipc_handles=None,
                tensor_sizes: list[int] | None = None) -> dict:
    """One round's update info, through vLLM's dataclass (which checks the lengths)."""
    names = [m.name for m in metadata]
    dtypes = [str(m.dtype).removeprefix("torch.") for m in metadata]
    shapes = [list(m.shape) for m in metadata]
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

        return asdict(NCCLWeightTransferUpdateInfo(names=names, dtype_names=dtypes,
                                                   shapes=shapes))
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferUpdateInfo

    return asdict(IPCWeightTransferUpdateInfo(names=names, dtype_names=dtypes, shapes=shapes,
                                              ipc_handles=ipc_handles,
                                              tensor_sizes=tensor_sizes))


def check_sample(engines: Sequence, actor_tensors: dict) -> None:
    """Compare the sampled tensors of every worker of every engine with the actor's."""
    names = sorted(actor_tensors)
    if not names:
        return
    for index, workers in enumerate(_call_all(engines, "call", "fingerprints", names)):
        for worker, reported in enumerate(workers):
            wrong = weights.mismatches(actor_tensors, reported)
            if wrong:
                raise RuntimeError(f"weight sync: engine {index}, worker {worker}: "
                                   + "; ".join(wrong))


def trainer_engine(engines: Sequence, route, rank: int, source: ExportSource,
                   bucket_bytes: int):
    """vLLM's trainer engine of this actor rank for a route (runtime/workers/weight_sync.py): the
    init info from the route (NCCL: rank 0's rendezvous, one rank range per engine), a
    client over the engines on the rank that drives them (rank 0; the others get none and
    vLLM never calls theirs), and the export as its source. On rank 0 this is the
    rendezvous: the engines' previous trainer connection is released first. On vLLM 0.26
    (no trainer engines) IPC goes through its static sender (vllm_compat.StaticIPCSender)."""
    driving = route.drives(rank)
    worlds = list(route.engine_worlds) or [1] * len(engines)
    if route.path == "ipc":
        # vLLM's packed IPC refuses a tensor larger than its buffer (packed_ipc_producer);
        # the metadata pass is collective, and every IPC rank takes it
        bucket_bytes = max([bucket_bytes] + [_nbytes(m) for m in source.metadata])
    if driving:
        _call_all(engines, "call", "shutdown_weight_transfer")
    client = EngineClient(engines if driving else [], worlds if driving else [])
    if route.path not in vllm_compat.trainer_engines():
        if route.path != "ipc":
            raise ValueError(f"vLLM {vllm_compat.version()} has no trainer side for "
                             f"{route.path!r} that vime drives")
        if driving:
            client.init_weight_transfer_engine(vllm_compat.ipc_init_payload())
        return vllm_compat.StaticIPCSender(client, source, rank, bucket_bytes)
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    info = trainer_init_info(route.path, rank, bucket_bytes, route.master, worlds)
    return WeightTransferTrainerFactory.trainer_init(init_info=info, client=client,
                                                     source=source.vllm)


def _nbytes(meta: ParamMeta) -> int:
    import math

    return math.prod(meta.shape) * meta.dtype.itemsize


def send(engines: Sequence, version: int, rank: int, engine, source: ExportSource) -> int:
    """One weight sync through a trainer engine (`trainer_engine`, made on the first sync
    and kept for the next ones), then, on rank 0, the version set on every engine and the
    sample check. Every actor rank calls it. Returns the bytes this rank's export yielded."""
    engine.send_weights()
    if rank == 0:
        # send_weights finished the round without a version (a second finish would finalize
        # a reload that was never started): set it on its own, as LLM.update_weight_version
        _call_all(engines, "call", "set_weight_version", version)
        check_sample(engines, source.sample)
    return source.sent_bytes
