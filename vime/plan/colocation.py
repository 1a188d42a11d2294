"""How a colocated actor and its engines share a GPU: both resident, or taking turns.

Taking turns (the actor offloads its state to the host, the engines sleep) costs a copy of the
actor's weights, fp32 main parameters and Adam moments each way every rollout, and the engines'
weights and KV cache too. When the actor's training peak and the awake engine fit on the GPU
together, neither has to move. `train.offload` picks: auto (the memory plan decides), always,
never. The runtime reads the mode from plan.json's "colocation" (runtime/core/slices.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from vime.plan.memory import CUDA_CONTEXT, GiB, MemoryPlan
from vime.resolve.spec import Spec

RESIDENT, OFFLOAD = "resident", "offload"

# the train phase's term for the engine asleep beside the actor (vime/plan/memory.py)
_SLEEPING = "sleeping engine"


@dataclass(frozen=True)
class Colocation:
    mode: str  # resident | offload
    setting: str  # train.offload
    why: str
    actor_bytes: float | None  # the actor's training peak without the sleeping engine
    engine_bytes: float | None  # the awake engine: vLLM's budget and its CUDA context
    gpu_bytes: float | None

    @property
    def together_bytes(self) -> float | None:
        if self.actor_bytes is None or self.engine_bytes is None:
            return None
        return self.actor_bytes + self.engine_bytes

    def sums(self, utilization: float) -> str:
        """The arithmetic of the fit, in words."""
        return (f"actor {_gib(self.actor_bytes)} (training peak) + engine "
                f"{_gib(self.engine_bytes)} (gpu_memory_utilization {utilization} + its CUDA "
                f"context) = {_gib(self.together_bytes)} of {_gib(self.gpu_bytes)}")

    @property
    def fits(self) -> bool | None:
        """Whether both fit on the GPU at once (None: not planned)."""
        together = self.together_bytes
        return None if together is None else together <= self.gpu_bytes


def _gib(value: float) -> str:
    return f"{value / GiB:.1f} GiB"


def sizes(spec: Spec, memory: MemoryPlan) -> tuple[float, float]:
    """The actor's training peak alone and the awake engine's footprint on one GPU."""
    actor = sum(t.bytes for t in memory.train.terms if t.name != _SLEEPING)
    engine = spec.inference.gpu_memory_utilization * memory.gpu_bytes + CUDA_CONTEXT
    return actor, engine


def largest_resident_utilization(spec: Spec, memory: MemoryPlan) -> float:
    """The largest gpu_memory_utilization (two decimals) at which the engine fits beside the
    actor's training peak."""
    actor, _engine = sizes(spec, memory)
    room = memory.gpu_bytes - actor - CUDA_CONTEXT
    return max(int(room / memory.gpu_bytes * 100) / 100, 0.0)


def plan_colocation(spec: Spec, memory: MemoryPlan | None) -> Colocation | None:
    """The mode of a colocated spec and why; None when actor and engines have GPUs of their
    own."""
    if not spec.train.colocate:
        return None
    setting = spec.train.offload
    if memory is None:
        mode = RESIDENT if setting == "never" else OFFLOAD
        return Colocation(mode, setting, f"train.offload = {setting!r}; memory not planned",
                          None, None, None)
    actor, engine = sizes(spec, memory)
    planned = Colocation(OFFLOAD, setting, "", actor, engine, memory.gpu_bytes)
    sums = planned.sums(spec.inference.gpu_memory_utilization)
    if setting == "always":
        mode, why = OFFLOAD, f"train.offload = 'always' ({sums})"
    elif setting == "never":
        mode, why = RESIDENT, f"train.offload = 'never' ({sums})"
    elif planned.fits:
        mode, why = RESIDENT, f"both fit: {sums}"
    else:
        mode, why = OFFLOAD, f"both do not fit: {sums}"
    return Colocation(mode, setting, why, actor, engine, memory.gpu_bytes)
