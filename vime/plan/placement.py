"""Which GPU runs what: the actor takes GPUs in (node, gpu) order; the rollout engines take
the same GPUs when colocated, else the GPUs after the actor's, engine after engine."""

from __future__ import annotations

from itertools import chain, repeat

from vime.layout import Layout
from vime.resolve.spec import Spec

Gpu = tuple[int, int]  # (node, gpu on the node)


def gpu_at(index: int, gpus_per_node: int) -> Gpu:
    return divmod(index, gpus_per_node)


def gpu_columns(start: int, count: int, gpus_per_node: int) -> tuple[list[int], list[int]]:
    """The nodes and the GPUs on the node of GPUs start, start + 1, ... (count of them), as two
    lists, without a Python step per GPU (a plan of 262,144 GPUs: benchmarks/plan_startup.py)."""
    if count <= 0:
        return [], []
    first, last = start // gpus_per_node, (start + count - 1) // gpus_per_node
    nodes = list(chain.from_iterable(map(repeat, range(first, last + 1), repeat(gpus_per_node))))
    gpus = list(range(gpus_per_node)) * (last - first + 1)
    cut = start - first * gpus_per_node
    return nodes[cut:cut + count], gpus[cut:cut + count]


def actor_layout(spec: Spec) -> Layout:
    """The actor's Megatron layout: its GPUs and the spec's parallel sizes."""
    return spec.derived.layout


def rollout_start(spec: Spec) -> int:
    return 0 if spec.train.colocate else spec.train.num_gpus


def engine_gpus(spec: Spec, count: int | None = None) -> list[list[Gpu]]:
    """The GPUs of each whole engine (a partial engine at the end is left out); of the first
    `count` engines only, when given."""
    size, gpn = spec.inference.gpus_per_engine, spec.cluster.gpus_per_node
    start = rollout_start(spec)
    engines = spec.derived.num_engines if count is None else min(count, spec.derived.num_engines)
    return [list(map(divmod, range(start + e * size, start + (e + 1) * size), repeat(gpn)))
            for e in range(engines)]
