"""Stage 5, plan: Spec -> Plan. Ranks, groups, engines and batch numbers (pure arithmetic).

Runs only on a spec that check accepted, so every division here is exact.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from vime.plan.groups import Layout
from vime.plan.memory import MemoryPlan, memory_plan
from vime.plan.placement import Gpu, actor_gpus, actor_layout, engine_gpus
from vime.resolve.spec import Spec


@dataclass(frozen=True)
class ActorRank:
    rank: int
    node: int
    gpu: int
    coords: dict[str, int]  # tp, cp, dp, pp, ep, etp, edp


@dataclass(frozen=True)
class Engine:
    index: int
    tp: int
    dp: int
    ep: int
    gpus: tuple[Gpu, ...]
    physical_experts: int
    redundant_experts: int
    experts_per_gpu: int  # the most any GPU of the engine holds

    @property
    def nodes(self) -> list[int]:
        return sorted({node for node, _ in self.gpus})


@dataclass(frozen=True)
class Batch:
    rollout_batch_size: int
    n_samples_per_prompt: int
    samples_per_rollout: int
    global_batch_size: int
    steps_per_rollout: int
    micro_batch_size: int
    dynamic_batch: bool
    max_tokens_per_gpu: int
    samples_per_dp_rank: int  # per optimizer step
    micro_batches_per_step: int | None  # static batches only


@dataclass(frozen=True)
class Plan:
    spec: Spec
    layout: Layout
    groups: dict[str, list[list[int]]]
    ranks: tuple[ActorRank, ...]
    engines: tuple[Engine, ...]
    batch: Batch
    memory: MemoryPlan | None

    def engine_of(self, gpu: Gpu) -> int | None:
        return self._engine_by_gpu.get(gpu)

    @functools.cached_property
    def _engine_by_gpu(self) -> dict[Gpu, int]:
        # one lookup table, not a scan of every engine per GPU (quadratic on big clusters)
        return {gpu: engine.index for engine in reversed(self.engines) for gpu in engine.gpus}


def _engines(spec: Spec) -> tuple[Engine, ...]:
    inf, arch = spec.inference, spec.arch
    experts = arch.num_experts if arch is not None and arch.is_moe else 0
    redundant = inf.eplb.num_redundant_experts if inf.eplb.enabled else 0
    ep = spec.derived.vllm_ep
    physical = experts + redundant
    # with EP an uneven split (no EPLB) gives the first ranks one more; without EP every GPU
    # holds a TP slice of every expert
    per_gpu = -(-physical // ep) if experts and inf.expert_parallel else experts
    return tuple(
        Engine(i, spec.derived.vllm_tp, inf.data_parallel_size, ep, tuple(gpus), physical,
               redundant, per_gpu)
        for i, gpus in enumerate(engine_gpus(spec)))


def _batch(spec: Spec) -> Batch:
    roll, train, dp = spec.rollout, spec.train, spec.derived.dp
    per_rank = train.global_batch_size // dp
    return Batch(
        rollout_batch_size=roll.batch_size,
        n_samples_per_prompt=roll.n_samples_per_prompt,
        samples_per_rollout=spec.derived.samples_per_rollout,
        global_batch_size=train.global_batch_size,
        steps_per_rollout=train.steps_per_rollout,
        micro_batch_size=train.micro_batch_size,
        dynamic_batch=train.dynamic_batch,
        max_tokens_per_gpu=train.max_tokens_per_gpu,
        samples_per_dp_rank=per_rank,
        micro_batches_per_step=None if train.dynamic_batch else per_rank // train.micro_batch_size,
    )


def plan(spec: Spec) -> Plan:
    layout = actor_layout(spec)
    ranks = tuple(ActorRank(r, node, gpu, layout.coordinates(r))
                  for r, (node, gpu) in enumerate(actor_gpus(spec)))
    return Plan(spec, layout, layout.groups(), ranks, _engines(spec), _batch(spec),
                memory_plan(spec))
