"""Helpers of the launcher's tests: the CI cluster's spec settings, the vime command line,
waiting for Slurm jobs, and finding vime's Ray processes by their environment marker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SLURM_CI = ROOT / ".ci" / "slurm"
SMOKE = ROOT / "specs" / "qwen3_30b_smoke.toml"
DRIVERS = Path(__file__).resolve().parent / "drivers.py"
# Every job this test session starts inherits it (sbatch exports the environment; Ray's
# processes inherit theirs), so the leftover check counts this session's processes only:
# other sessions on the machine run their own jobs at the same time.
SESSION = os.environ.setdefault("VIME_TEST_SESSION", f"{os.getpid()}-{time.time():.0f}")


def marked_processes(needle: bytes = b"VIME_RAY_NODE=") -> list[int]:
    """Live processes of this session's vime jobs whose environment has a variable starting
    with needle."""
    session = f"VIME_TEST_SESSION={SESSION}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[0] != "Z" and session in env and any(
                    v.startswith(needle) for v in env):
                found.append(int(entry))
    return found


def spec_sets(output_dir: Path, nodes: int = 2, gpus_per_node: int = 4, **extra) -> list[str]:
    """--set arguments for the smoke spec on the CI cluster; extra: key=TOML value."""
    sets = {"experiment.output_dir": json.dumps(str(output_dir)), "cluster.nodes": str(nodes),
            "cluster.gpus_per_node": str(gpus_per_node), "cluster.slurm.partition": '"debug"',
            "cluster.slurm.time": '"10"', "cluster.slurm.exclusive": "false",
            "cluster.ray.startup_timeout_s": "90"}
    if gpus_per_node * nodes < 8:  # a dense model, so small layouts stay valid
        sets.update({"model.preset": '"qwen3-4b"', "model.hf_checkpoint": '"/nonexistent"',
                     "train.parallel.tp": str(min(gpus_per_node, 2)), "train.parallel.ep": "1",
                     "inference.gpus_per_engine": str(min(gpus_per_node, 2)),
                     "inference.expert_parallel": "false"})
    sets.update(extra)
    return [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]


def vime(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
         cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The vime command line, as a user runs it."""
    return subprocess.run([str(Path(sys.executable).with_name("vime")), *args], cwd=cwd,
                          env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                          timeout=timeout)


def submitted_id(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("submitted job "), done.stdout
    return first.split()[2].rstrip(":")


def job_state(job_id: str) -> str:
    from vime.launch import slurm

    return slurm.state(job_id).state


def wait_until(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_finished(job_id: str, timeout: float = 180) -> str:
    from vime.launch import slurm

    def terminal():
        state = slurm.state(job_id).state
        return state.split()[0] in slurm.TERMINAL and state

    return wait_until(terminal, timeout, f"job {job_id} to finish")
