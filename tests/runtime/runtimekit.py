"""Helpers of the runtime's tests: the tiny spec compiled in-process, a JobConfig for a
temporary job folder, the in-process loop, a local Ray, and the vime command line."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from runtime.core.slices import JobConfig, compile_job
from runtime.node.driver import job_loop
from runtime.rl.loop import GRPOLoop
from runtime.rl.metrics import MetricsLogger
from runtime.workers import actors

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "specs" / "tiny_cpu.toml"


@contextlib.contextmanager
def local_ray(num_gpus: int = 4):
    """A local Ray with logical GPUs for one test module. Ray >= 2.5x turns token
    authentication on for a local ray.init() and writes ~/.ray/auth_token, which every later
    `ray start` on the machine then requires: this Ray runs without it."""
    import ray

    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=2, num_gpus=num_gpus, include_dashboard=False, logging_level="WARNING")
    try:
        yield
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


def compile_spec(path: Path = TINY, sets=()) -> tuple[dict, str]:
    """(plan.json as a dict, resolved.toml) as `vime submit` writes them in the job folder."""
    files = compile_job(path, sets)
    return json.loads(files["plan.json"]), files["resolved.toml"]


def sets_for(tmp_path: Path, **keys) -> list[str]:
    """--set arguments: output under tmp_path, plus key=TOML value pairs (dots as __)."""
    pairs = {"experiment.output_dir": json.dumps(str(tmp_path / "runs"))}
    pairs.update({k.replace("__", "."): v for k, v in keys.items()})
    return [f"{k}={v}" for k, v in pairs.items()]


def job_config(tmp_path: Path, job: str = "job", **keys) -> tuple[dict, str, JobConfig]:
    plan, resolved = compile_spec(TINY, sets_for(tmp_path, **keys))
    job_dir = tmp_path / "runs" / "tiny-cpu" / job
    job_dir.mkdir(parents=True, exist_ok=True)
    return plan, resolved, JobConfig.from_job(plan, resolved, job_dir)


def in_process_loop(config: JobConfig, log=lambda line: None) -> GRPOLoop:
    """The loop with one rank and one engine in this process (no Ray)."""
    train, rollout = actors.local_groups(config, cpu_threads=1)
    return job_loop(config, train, rollout,
                    MetricsLogger(config.job_dir, config.job_dir.name, print_fn=log), log=log)


def run_to_weights(config: JobConfig) -> dict:
    """The in-process loop resumed from the config's checkpoints and run to its end: the
    actor's weights after the last rollout, by parameter name."""
    loop = in_process_loop(config)
    loop.restore()
    loop.run()
    backend = loop.train.workers[0].backend
    backend.onload()
    return {n: p.detach().clone() for n, p in backend.params.items()}


def metrics(job_dir: Path) -> list[dict]:
    path = Path(job_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def vime(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
         cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("vime")), *args], cwd=cwd,
                          env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                          timeout=timeout)


def busy(host, within: float = 60.0, ping_s: float = 0.2) -> bool:
    """Whether a Ray actor host is seen in the middle of a call: an actor runs one call at a
    time, so a ping that does not come back within `ping_s` waits behind its generate. (A
    fixed sleep before a kill raced: on a loaded machine the call had not started, on an idle
    one it had already finished.)"""
    import ray

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            ray.get(host.ping.remote(), timeout=ping_s)
        except ray.exceptions.GetTimeoutError:
            return True
    return False
