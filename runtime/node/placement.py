"""One Ray placement group shaped by the plan: a bundle of one GPU per (node, GPU) that the
plan uses (train.ranks and rollout.engines), ordered by (node, GPU), each pinned to its node.

vime's job gives every Ray node a custom resource `vime_node_<i>` (runtime/node/ray_bootstrap.py),
so a bundle asks for a sliver of it and lands on exactly the plan's node. On a Ray cluster
without those resources (`--ray-address`, a bare `ray.init()` in tests) the bundles are
packed, and nodes are numbered as the job does: the head first, then by address.

Which physical GPU a bundle got is only known once something runs in it, so each bundle is
probed by a tiny task (slime does the same, then sorts by node address and GPU id): the
bundles of node n sorted by their GPU id give the plan's GPUs 0, 1, ... of that node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

NODE_RESOURCE = "vime_node_{}"  # runtime/node/ray_bootstrap.py
PIN = 0.001  # of a vime_node_<i> resource: enough to pin, small enough for any bundle count
READY_TIMEOUT_S = 300


@dataclass(frozen=True)
class BundleInfo:
    bundle: int
    node: int  # the job's node index
    ray_node_id: str
    gpu_ids: tuple  # what Ray assigned (logical ids on machines without GPUs)


@dataclass(frozen=True)
class Placement:
    group: object  # ray.util.placement_group.PlacementGroup
    bundles: tuple[BundleInfo, ...]
    by_gpu: dict  # (node, gpu) of the plan -> bundle index

    def bundle(self, node: int, gpu: int) -> int:
        return self.by_gpu[(node, gpu)]

    def describe(self) -> str:
        rows = [f"  node {n} gpu {g} -> bundle {b} (Ray GPU {self.bundles[b].gpu_ids})"
                for (n, g), b in sorted(self.by_gpu.items())]
        return "placement group: " + f"{len(self.bundles)} bundle(s)\n" + "\n".join(rows)


def plan_gpus(plan: dict) -> list[tuple[int, int]]:
    """Every (node, GPU) the plan uses, sorted."""
    used = {(r["node"], r["gpu"]) for r in plan["train"]["ranks"]}
    for engine in plan["rollout"]["engines"]:
        used |= {(g["node"], g["gpu"]) for g in engine["gpus"]}
    return sorted(used)


def _node_index_of(ray_nodes: list[dict]) -> dict[str, int]:
    """Ray node id -> the job's node index: from vime_node_<i> when present, else the head
    first, then by address."""
    found = {}
    for info in ray_nodes:
        for key in info.get("Resources", {}):
            if key.startswith("vime_node_") and key[len("vime_node_"):].isdigit():
                found[info["NodeID"]] = int(key[len("vime_node_"):])
    if found:
        return found
    alive = [n for n in ray_nodes if n.get("Alive")]
    head = [n for n in alive if n.get("Resources", {}).get("node:__internal_head__")]
    rest = sorted((n for n in alive if n not in head), key=lambda n: n["NodeManagerAddress"])
    return {info["NodeID"]: index for index, info in enumerate(head + rest)}


def create(plan: dict, timeout_s: float = READY_TIMEOUT_S) -> Placement:
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    gpus = plan_gpus(plan)
    pinned = any(k.startswith("vime_node_") for k in ray.cluster_resources())
    bundles = [{"GPU": 1.0, **({NODE_RESOURCE.format(node): PIN} if pinned else {})}
               for node, _ in gpus]
    group = placement_group(bundles, strategy="PACK", name=f"vime-{time.time_ns()}")
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except Exception as err:
        have = ray.cluster_resources()
        raise RuntimeError(
            f"the placement group of {len(bundles)} one-GPU bundle(s) was not ready after "
            f"{timeout_s:.0f} s; the Ray cluster has {have.get('GPU', 0):g} GPU(s) "
            f"({type(err).__name__})") from None

    @ray.remote(num_cpus=0, num_gpus=0.01)
    def probe():
        return ray.get_runtime_context().get_node_id(), tuple(ray.get_gpu_ids())

    seen = ray.get([probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        group, placement_group_bundle_index=i)).remote() for i in range(len(bundles))])
    node_index = _node_index_of(ray.nodes())
    infos = tuple(BundleInfo(i, node_index.get(node_id, -1), node_id, gpu_ids)
                  for i, (node_id, gpu_ids) in enumerate(seen))
    by_gpu = {}
    for node in sorted({n for n, _ in gpus}):
        wanted = [g for n, g in gpus if n == node]
        here = sorted((b for b in infos if b.node == node), key=_gpu_order)
        if len(here) != len(wanted):
            raise RuntimeError(f"node {node}: the plan uses {len(wanted)} GPU(s) there, the "
                               f"placement group put {len(here)} bundle(s) on it")
        by_gpu.update({(node, gpu): b.bundle for gpu, b in zip(wanted, here, strict=True)})
    return Placement(group, infos, by_gpu)


def _gpu_order(info: BundleInfo):
    """Numeric GPU ids in numeric order (10 after 9); UUIDs after them, as text."""
    ids = tuple((0, int(x), "") if str(x).isdigit() else (1, 0, str(x)) for x in info.gpu_ids)
    return ids, info.bundle


def remove(placement: Placement) -> None:
    from ray.util.placement_group import remove_placement_group

    remove_placement_group(placement.group)
