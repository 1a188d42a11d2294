"""Which GPU runs what: the actor takes GPUs in (node, gpu) order; the rollout engines take
the same GPUs when colocated, else the GPUs after the actor's, engine after engine."""

from __future__ import annotations

from vime.plan.groups import Layout
from vime.resolve.spec import Spec

Gpu = tuple[int, int]  # (node, gpu on the node)


def gpu_at(index: int, gpus_per_node: int) -> Gpu:
    return divmod(index, gpus_per_node)


def actor_layout(spec: Spec) -> Layout:
    """The actor's Megatron layout: its GPUs and the spec's parallel sizes."""
    par = spec.train.parallel
    return Layout(spec.train.num_gpus, par.tp, par.cp, par.pp, par.ep, par.etp)


def actor_gpus(spec: Spec) -> list[Gpu]:
    return [gpu_at(i, spec.cluster.gpus_per_node) for i in range(spec.train.num_gpus)]


def rollout_start(spec: Spec) -> int:
    return 0 if spec.train.colocate else spec.train.num_gpus


def engine_gpus(spec: Spec) -> list[list[Gpu]]:
    """The GPUs of each whole engine (a partial engine at the end is left out)."""
    size = spec.inference.gpus_per_engine
    start = rollout_start(spec)
    return [
        [gpu_at(start + e * size + i, spec.cluster.gpus_per_node) for i in range(size)]
        for e in range(spec.derived.num_engines)
    ]
