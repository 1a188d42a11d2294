"""Stage 5, plan: Spec -> Plan. Ranks, groups, engines and batch numbers (pure arithmetic).

Runs only on a spec that check accepted, so every division here is exact.

The actor's ranks and the rollout's engines are sequences computed on demand, and by columns
for the renderers: a plan of the largest cluster the schema admits has 262,144 of each, and
`vime plan` must still answer within a second (benchmarks/plan_startup.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from vime.layout import Layout
from vime.plan.colocation import Colocation, plan_colocation
from vime.plan.forecast import Forecast, step_forecast
from vime.plan.memory import MemoryPlan, memory_plan
from vime.plan.placement import Gpu, actor_layout, gpu_at, gpu_columns, rollout_start
from vime.plan.stages import Pipeline, pipeline
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


def _index(sequence: Sequence, index):
    """`index` of a sequence of len(sequence) items checked and made positive, or the range
    of a slice."""
    if isinstance(index, slice):
        return range(*index.indices(len(sequence)))
    if not -len(sequence) <= index < len(sequence):
        raise IndexError(f"{type(sequence).__name__} index out of range")
    return index % len(sequence)


@dataclass(frozen=True, eq=False)
class Ranks(Sequence):
    """The actor's ranks: rank r on the r-th GPU in (node, gpu) order."""

    layout: Layout
    gpus_per_node: int

    def __len__(self) -> int:
        return self.layout.world_size

    def __getitem__(self, index):
        where = _index(self, index)
        if isinstance(where, range):
            return tuple(self[i] for i in where)
        node, gpu = gpu_at(where, self.gpus_per_node)
        return ActorRank(where, node, gpu, self.layout.coordinates(where))

    def columns(self) -> dict[str, Sequence[int]]:
        """rank, node, gpu and the coordinates (ActorRank.coords) of every rank, by columns."""
        nodes, gpus = gpu_columns(0, len(self), self.gpus_per_node)
        return {"rank": range(len(self)), "node": nodes, "gpu": gpus, **self.layout.columns()}

    def __eq__(self, other):
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None


@dataclass(frozen=True, eq=False)
class Engines(Sequence):
    """The rollout's engines, engine e on `size` GPUs from GPU start + e × size in (node, gpu)
    order; every engine has the same TP, DP, EP and experts."""

    num_engines: int  # not `count`: Sequence.count is a method
    start: int
    size: int
    gpus_per_node: int
    tp: int
    dp: int
    ep: int
    physical_experts: int
    redundant_experts: int
    experts_per_gpu: int

    def __len__(self) -> int:
        return self.num_engines

    def __getitem__(self, index):
        where = _index(self, index)
        if isinstance(where, range):
            return tuple(self[i] for i in where)
        first = self.start + where * self.size
        gpus = tuple(gpu_at(g, self.gpus_per_node) for g in range(first, first + self.size))
        return Engine(where, self.tp, self.dp, self.ep, gpus, self.physical_experts,
                      self.redundant_experts, self.experts_per_gpu)

    def index_of(self, gpu: Gpu) -> int | None:
        node, on_node = gpu
        offset = node * self.gpus_per_node + on_node - self.start
        return offset // self.size if 0 <= offset < self.num_engines * self.size else None

    @functools.cached_property
    def _gpu_columns(self) -> tuple[list[int], list[int]]:
        return gpu_columns(self.start, self.num_engines * self.size, self.gpus_per_node)

    def gpu_columns(self) -> tuple[list[int], list[int]]:
        """The node and the GPU on the node of each engine's GPUs, engine after engine."""
        return self._gpu_columns

    def node_ends(self) -> tuple[list[int], list[int]]:
        """Each engine's first node and last node: an engine's GPUs are consecutive, so
        Engine.nodes is range(first, last + 1)."""
        nodes = self._gpu_columns[0]
        return nodes[::self.size], nodes[self.size - 1::self.size]

    def __eq__(self, other):
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None


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
    ranks: Ranks
    engines: Engines
    batch: Batch
    memory: MemoryPlan | None
    colocation: Colocation | None = None  # None when actor and engines have GPUs of their own
    forecast: Forecast | None = None  # seconds per rollout by phase; None without a memory plan
    pipeline: Pipeline | None = None  # the stages and their micro-batches; None at pp = 1

    @functools.cached_property
    def groups(self) -> dict[str, list[list[int]]]:
        # on demand: the renderers read them flat from layout.members()
        return self.layout.groups()

    def engine_of(self, gpu: Gpu) -> int | None:
        return self.engines.index_of(gpu)


def _engines(spec: Spec) -> Engines:
    inf, arch = spec.inference, spec.arch
    experts = arch.num_experts if arch is not None and arch.is_moe else 0
    redundant = inf.eplb.num_redundant_experts if inf.eplb.enabled else 0
    ep = spec.derived.vllm_ep
    physical = experts + redundant
    # with EP an uneven split (no EPLB) gives the first ranks one more; without EP every GPU
    # holds a TP slice of every expert
    per_gpu = -(-physical // ep) if experts and inf.expert_parallel else experts
    return Engines(spec.derived.num_engines, rollout_start(spec), inf.gpus_per_engine,
                   spec.cluster.gpus_per_node, spec.derived.vllm_tp, inf.data_parallel_size, ep,
                   physical, redundant, per_gpu)


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
    if layout.problems():  # check refuses these; a plan never lists impossible groups
        raise ValueError("; ".join(layout.problems()))
    memory = memory_plan(spec)
    sharing = plan_colocation(spec, memory)
    return Plan(spec, layout, Ranks(layout, spec.cluster.gpus_per_node), _engines(spec),
                _batch(spec), memory, sharing, step_forecast(spec, memory, sharing),
                pipeline(spec))
