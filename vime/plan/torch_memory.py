"""The torch backends' memory (runtime/backends/torch_model.py): an fp32 model, whole on each
device. vime/plan/memory.py's model is Megatron's and vLLM's, which the torch backends do not
share; `vime plan` prints this instead."""

from __future__ import annotations

from dataclasses import dataclass

from vime.resolve.spec import Spec


def uses_torch_backend(spec: Spec) -> bool:
    return "torch" in (spec.train.backend, spec.inference.backend)


@dataclass(frozen=True)
class TorchMemory:
    """The torch backends' fp32 model, whole on each device (runtime/backends/torch_model.py):
    what a rank and an engine hold, activations and the batch's KV not counted."""

    actor_bytes: float  # weights, gradients and two Adam moments
    engine_bytes: float  # weights


def torch_memory(spec: Spec) -> TorchMemory | None:
    if spec.arch is None or not uses_torch_backend(spec):
        return None
    params = spec.arch.params_total
    return TorchMemory(actor_bytes=16 * params, engine_bytes=4 * params)
