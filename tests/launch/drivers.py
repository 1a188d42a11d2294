"""Test drivers with the runtime driver's signature (runtime/node/job.py), picked with VIME_DRIVER.

check     checks the Ray cluster the job built: alive nodes, GPUs, and a placement group of
          nodes × gpus_per_node one-GPU bundles spread gpus_per_node per node, each probed by a
          task that sees its own GPU; writes driver.json in the job folder.
progress  counts VIME_TEST_STEPS steps of VIME_TEST_STEP_S seconds, recording each in
          progress.json, and on resume continues from the last recorded step.
fail      raises, for the failure paths.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path


def _write(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def check(plan: dict, resolved_toml: str, job_dir: Path, resume: bool) -> None:
    import ray
    from ray.util.placement_group import placement_group, placement_group_table

    nodes, per_node = plan["cluster"]["nodes"], plan["cluster"]["gpus_per_node"]
    ray.init(address="auto", logging_level="WARNING")
    alive = [n for n in ray.nodes() if n["Alive"]]
    gpus = ray.cluster_resources().get("GPU", 0)
    group = placement_group([{"GPU": 1}] * (nodes * per_node), strategy="SPREAD")
    ray.get(group.ready(), timeout=60)
    table = placement_group_table(group)
    spread = Counter(table["bundles_to_node_id"].values())

    @ray.remote(num_gpus=1, num_cpus=0)
    def probe():
        return ray.get_runtime_context().get_node_id(), ray.get_gpu_ids(), os.environ.get(
            "CUDA_VISIBLE_DEVICES")

    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    probes = ray.get([probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        group, placement_group_bundle_index=i)).remote() for i in range(nodes * per_node)],
        timeout=120)
    _write(job_dir / "driver.json", {
        "nodes": len(alive), "gpus": gpus, "bundles": nodes * per_node,
        "bundles_per_node": sorted(spread.values()),
        "probe_nodes": len({p[0] for p in probes}), "probe_gpu_ids": [p[1] for p in probes],
        "env": {k: os.environ.get(k) for k in ("RAY_ADDRESS", "VIME_TEST_ENV", "VIME_TEST_ENV2",
                                                "RAY_AUTH_MODE")},
        "resume": resume, "plan_world_size": plan["cluster"]["world_size"],
        "resolved_has_name": "[experiment]" in resolved_toml,
    })
    ray.shutdown()


def progress(plan: dict, resolved_toml: str, job_dir: Path, resume: bool) -> None:
    path = job_dir / "progress.json"
    record = json.loads(path.read_text()) if path.exists() else {"step": 0, "starts": []}
    record["starts"].append({"resume": resume, "from_step": record["step"],
                             "restart_count": os.environ.get("SLURM_RESTART_COUNT")})
    _write(path, record)
    steps, step_s = int(os.environ.get("VIME_TEST_STEPS", "6")), float(
        os.environ.get("VIME_TEST_STEP_S", "1"))
    while record["step"] < steps:
        time.sleep(step_s)
        record["step"] += 1
        _write(path, record)


def fail(plan: dict, resolved_toml: str, job_dir: Path, resume: bool) -> None:
    raise RuntimeError("the test driver fails on purpose")
