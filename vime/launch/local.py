"""The local twins of a Slurm job: `--local` runs one process per node on this machine (Ray
with logical GPUs where there are none), `--ray-address` runs the driver against a Ray
cluster someone started by hand. Both block until the job ends; output goes to the job
folder's logs, as on Slurm."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HEAD_GONE_GRACE_S = 30.0


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _record(job_dir: Path, processes: list[subprocess.Popen]) -> None:
    (job_dir / "local.json").write_text(json.dumps(
        {"launcher_pid": os.getpid(), "pids": [p.pid for p in processes]}) + "\n")


def _visible_devices(node: int, gpus_per_node: int) -> str | None:
    """On a machine with real GPUs (CUDA_VISIBLE_DEVICES set), node i gets its own slice."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    devices = [d for d in visible.split(",") if d.strip()]
    return ",".join(devices[node * gpus_per_node:(node + 1) * gpus_per_node])


def _wait(processes: list[subprocess.Popen]) -> list[int]:
    """Wait for every node; if the head is gone, the workers get a grace period, then SIGTERM."""
    head_gone = None
    try:
        while any(p.poll() is None for p in processes):
            if processes[0].poll() is not None:
                head_gone = head_gone or time.time()
                if time.time() - head_gone > HEAD_GONE_GRACE_S:
                    for p in processes[1:]:
                        if p.poll() is None:
                            p.send_signal(signal.SIGTERM)
            time.sleep(0.3)
    except KeyboardInterrupt:
        for p in processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in processes:
            p.wait()
    return [p.wait() for p in processes]


def run_local(job_dir: Path, nodes: int, gpus_per_node: int, env: dict[str, str]) -> int:
    processes = []
    for node in range(nodes):
        node_env = dict(os.environ, **env)
        devices = _visible_devices(node, gpus_per_node)
        if devices is not None:
            node_env["CUDA_VISIBLE_DEVICES"] = devices
        argv = [sys.executable, "-m", "runtime.node.job", "node", "--job-dir", str(job_dir),
                "--node", str(node)]
        processes.append(_spawn(argv, job_dir / "logs" / f"node-{node}.log", node_env))
    _record(job_dir, processes)
    codes = _wait(processes)
    return codes[0] or next((c for c in codes if c), 0)


def run_attached(job_dir: Path, address: str, env: dict[str, str]) -> int:
    argv = [sys.executable, "-m", "runtime.node.job", "attach", "--job-dir", str(job_dir),
            "--address", address]
    process = _spawn(argv, job_dir / "logs" / "node-0.log", dict(os.environ, **env))
    _record(job_dir, [process])
    return _wait([process])[0]
