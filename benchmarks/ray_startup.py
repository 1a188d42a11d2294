"""Time from a Slurm job's start to all of its GPUs ready in Ray, for 1 and 2 nodes.

Runs on the CI cluster of .ci/slurm/ (two slurmd on this machine, 4 fake GPUs each, Ray with
logical GPUs), which it starts and stops itself unless one is already up:

    .venv/bin/python benchmarks/ray_startup.py --runs 3

Each job runs `vime submit` with this file's no-op driver; the head records in
ray/ready-0.json when its task started and when nodes × gpus_per_node GPUs had joined.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "qwen3_30b_smoke.toml"
LAYOUTS = {  # nodes -> --set arguments that keep the seed smoke spec valid on 4-GPU nodes
    1: ["cluster.nodes=1", "cluster.gpus_per_node=4", "train.parallel.ep=4",
        "inference.gpus_per_engine=4"],
    2: ["cluster.nodes=2", "cluster.gpus_per_node=4"],
}


def noop(plan: dict, resolved_toml: str, job_dir: Path, resume: bool) -> None:
    """The driver: nothing, so the job measures Ray's start-up alone."""


def _slurm_up() -> bool:
    return subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0


def _run(nodes: int, runs_dir: Path) -> dict:
    sets = [*LAYOUTS[nodes], f"experiment.output_dir={json.dumps(str(runs_dir))}",
            'cluster.slurm.partition="debug"', 'cluster.slurm.time="10"',
            "cluster.slurm.exclusive=false"]
    vime = str(Path(sys.executable).with_name("vime"))
    submitted_at = time.time()
    done = subprocess.run([vime, "submit", str(SPEC), *[a for s in sets for a in ("--set", s)]],
                          capture_output=True, text=True,
                          env=dict(os.environ, VIME_DRIVER=f"{__file__}:noop"))
    if done.returncode:
        raise SystemExit(done.stdout + done.stderr)
    job_id = done.stdout.split()[2].rstrip(":")
    folder = runs_dir / "qwen3-30b-a3b-smoke" / job_id
    ready = folder / "ray" / "ready-0.json"
    while not (folder / "outcome.json").exists():
        time.sleep(0.2)
    timing = json.loads(ready.read_text())
    return {"job": job_id, "to_ready": timing["seconds_to_gpus_ready"],
            "submit_to_ready": timing["gpus_ready"] - submitted_at}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    lock = open("/tmp/vime-slurm-tests.lock", "w")  # noqa: SIM115 (taking turns with the tests)
    fcntl.flock(lock, fcntl.LOCK_EX)
    started_here = not _slurm_up()
    if started_here:
        subprocess.run(["bash", str(ROOT / ".ci/slurm/up.sh")], check=True,
                       env=dict(os.environ, NODES="2", GPUS_PER_NODE="4", CPUS_PER_NODE="4"),
                       stdout=subprocess.DEVNULL)
    try:
        with tempfile.TemporaryDirectory(prefix="vime-bench-") as tmp:
            print("| nodes × GPUs | runs | job start → all GPUs ready, median s (min–max) "
                  "| submit → ready, median s |")
            print("|---|---|---|---|")
            for nodes in (1, 2):
                results = [_run(nodes, Path(tmp)) for _ in range(args.runs)]
                ready = [r["to_ready"] for r in results]
                total = [r["submit_to_ready"] for r in results]
                print(f"| {nodes} × 4 | {len(results)} | {statistics.median(ready):.1f} "
                      f"({min(ready):.1f}–{max(ready):.1f}) | {statistics.median(total):.1f} |",
                      flush=True)
    finally:
        if started_here:
            subprocess.run(["bash", str(ROOT / ".ci/slurm/down.sh")], check=False)


if __name__ == "__main__":
    main()
