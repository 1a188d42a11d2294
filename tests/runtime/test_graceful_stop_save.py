"""A graceful stop (SIGTERM, Ctrl-C) between a rollout's save and its commit leaves no
`.partial-*` folder: the save is finished when its metrics line is written, removed when
not. A real process runs the in-process loop under the head node's signal handlers and is
signalled at that moment."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from runtimekit import ROOT, metrics

STOPPED = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from runtimekit import in_process_loop, job_config
from runtime.node import job
from runtime.rl.checkpoint import Checkpoints
from runtime.rl.metrics import MetricsLogger

_, _, config = job_config(Path({tmp!r}), "stopped", rollout__num_rollout="3",
                          checkpoint__save_interval="1", eval__datasets="[]")
loop = in_process_loop(config)
job._stop_on_signals()  # the head node's: SIGTERM and SIGINT raise to stop the job
log, commit = MetricsLogger.log, Checkpoints.commit

def log_then_stop(self, rollout_id, numbers):
    if rollout_id == 1 and {where!r} == "before_line":
        os.kill(os.getpid(), {signum})  # the rollout's save prepared, its line not written
    log(self, rollout_id, numbers)

def stop_then_commit(self, pending):
    if pending.rollout_id == 1 and {where!r} == "after_line":
        os.kill(os.getpid(), {signum})  # its line written, the save not yet renamed
    return commit(self, pending)

MetricsLogger.log, Checkpoints.commit = log_then_stop, stop_then_commit
try:
    loop.run()
except job._Terminated as stop:
    sys.exit(stop.code)
"""


@pytest.mark.parametrize("where, signum", [("before_line", signal.SIGTERM),
                                            ("after_line", signal.SIGINT)])
def test_a_graceful_stop_finishes_or_removes_the_save_in_progress(tmp_path, where, signum):
    child = subprocess.run([sys.executable, "-c", STOPPED.format(
        tests=str(ROOT / "tests" / "runtime"), tmp=str(tmp_path), where=where,
        signum=int(signum))], timeout=300, capture_output=True, text=True)
    assert child.returncode == 128 + signum, child.stderr
    save_dir = tmp_path / "runs" / "tiny-cpu" / "checkpoints"
    assert not [p.name for p in save_dir.iterdir() if p.name.startswith(".")], \
        sorted(p.name for p in save_dir.iterdir())
    logged = [r["rollout"] for r in metrics(tmp_path / "runs" / "tiny-cpu" / "stopped")]
    newest = (save_dir / "latest").read_text().strip()
    if where == "before_line":  # removed: a resume repeats rollout 1, whose line is missing
        assert logged == [0] and newest == "rollout_000000"
        assert not (save_dir / "rollout_000001").exists()
    else:  # finished: its line is there
        assert logged == [0, 1] and newest == "rollout_000001"
