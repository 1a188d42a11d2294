"""Test drivers with the runtime driver's signature (runtime/node/job.py), picked with VIME_DRIVER.

check     checks the Ray cluster the job built: alive nodes, GPUs, and a placement group of
          nodes × gpus_per_node one-GPU bundles spread gpus_per_node per node, each probed by a
          task that sees its own GPU; writes driver.json in the job folder.
progress  counts VIME_TEST_STEPS steps of VIME_TEST_STEP_S seconds, recording each in
          progress.json, and on resume continues from the last recorded step.
rollouts  the GRPO loop's outputs without its model: a Ray actor kept busy, then every
          VIME_TEST_STEP_S seconds one rollout (a metrics.jsonl record and the loop's console
          line), a checkpoint of the loop's format every 3 rollouts, VIME_TEST_STEPS rollouts.
fail      raises, for the failure paths.
actor_fails  a Ray actor's method raises, as a backend's would.
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


def rollouts(plan: dict, resolved_toml: str, job_dir: Path, resume: bool) -> None:
    import ray

    ray.init(address="auto", logging_level="WARNING")

    @ray.remote(num_cpus=0)
    class Busy:
        def spin(self) -> None:
            while True:
                time.sleep(0.1)

    busy = Busy.remote()
    busy.spin.remote()
    checkpoints = job_dir.parent / "checkpoints"
    steps, step_s = int(os.environ.get("VIME_TEST_STEPS", "6")), float(
        os.environ.get("VIME_TEST_STEP_S", "0.3"))
    for rollout in range(steps):
        time.sleep(step_s)
        with open(job_dir / "metrics.jsonl", "a") as out:
            out.write(json.dumps({"rollout": rollout, "reward/mean": 0.1 * rollout,
                                  "response_len/mean": 7.5, "time/generate": 0.1,
                                  "time/train": 0.2, "time/rollout": step_s,
                                  "throughput/generate_tokens_per_s": 100.0}) + "\n")
        print(f"rollout {rollout:5d} | reward {0.1 * rollout:.3f}", flush=True)
        if rollout % 3 == 2:
            folder = checkpoints / f"rollout_{rollout:06d}"
            folder.mkdir(parents=True, exist_ok=True)
            _write(folder / "state.json", {"format": 1, "rollout": rollout,
                                           "next_rollout": rollout + 1})
            (checkpoints / "latest").write_text(folder.name + "\n")
    ray.kill(busy)


def actor_fails(plan: dict, resolved_toml: str, job_dir: Path, resume: bool) -> None:
    import ray

    ray.init(address="auto", logging_level="WARNING")

    @ray.remote(num_cpus=0)
    class TrainWorker:
        def where(self) -> dict:
            return {"pid": os.getpid(), "host": "testhost"}

        def load(self, path: str) -> None:
            raise ValueError(f"size mismatch for {path}: [4, 64] vs [8, 64]\nmore")

    worker = TrainWorker.remote()
    _write(job_dir / "placement.json", {"train": [ray.get(worker.where.remote())],
                                        "rollout": []})
    ray.get(worker.load.remote("model.embed"))
