"""A run holds every folder it writes, not only its experiment folder: a second run whose
model.save is the checkpoint folder of a live run (another experiment, or `--fresh` before
the first save) is refused before it starts, with the other run's name."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from checkpointkit import FakeTrain
from launchkit import DRIVERS, ROOT, vime, wait_until

from runtime.rl.checkpoint import Checkpoints
from vime.launch import lock

TINY = ROOT / "specs" / "tiny_cpu.toml"

# The real `vime submit --local`, its job's processes replaced by a wait: the locks are the
# ones the submit takes.
HOLDER = """
import sys, time
from vime.launch import local
def run_local(job_dir, *args, **kwargs):
    print("running", flush=True)
    time.sleep(600)
    return 0
local.run_local = run_local
from vime import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def _sets(runs, save, name="tiny-cpu"):
    return ["--set", f"experiment.output_dir={json.dumps(str(runs))}",
            "--set", f"experiment.name={json.dumps(name)}",
            "--set", f"model.save={json.dumps(str(save))}"]


@pytest.fixture
def running_job(tmp_path):
    """A live `vime submit --local` of experiment tiny-cpu whose model.save is tmp/shared."""
    runs, save = tmp_path / "runs", tmp_path / "shared"
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "submit", "--local", "--quiet", str(TINY),
         *_sets(runs, save)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        wait_until(lambda: lock.read(runs / "tiny-cpu"), 60, "the first run's lock")
        yield runs, save, lock.read(runs / "tiny-cpu")
    finally:
        child.kill()
        child.wait()


def test_another_experiment_with_the_same_model_save_is_refused(running_job):
    runs, save, holder = running_job
    done = vime("submit", "--local", str(TINY), *_sets(runs, save, "other"),
                env={"VIME_DRIVER": f"{DRIVERS}:fail"}, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    for part in (f"checkpoint folder {save}", f"job {holder.job_id}",
                 "experiment tiny-cpu", "model.save"):
        assert part in done.stderr, (part, done.stderr)
    assert not (runs / "other").exists() or not list((runs / "other").glob("local-*"))


def test_fresh_before_the_first_save_is_refused_while_the_run_holds_model_save(running_job):
    runs, save, holder = running_job
    done = vime("submit", "--local", "--fresh", str(TINY), *_sets(runs, save),
                env={"VIME_DRIVER": f"{DRIVERS}:fail"}, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"checkpoint folder {save}" in done.stderr and f"job {holder.job_id}" in done.stderr
    assert not list((runs / "tiny-cpu-2").glob("local-*"))


def test_the_running_jobs_checkpoints_are_not_called_the_next_runs_own(running_job):
    # The live run has saved past the other spec's num_rollout: that is no finished run of
    # the other experiment, and nothing it prints may say so (exit 0, "other is finished").
    runs, save, holder = running_job
    Checkpoints(save).save(11, FakeTrain(), {"next_rollout": 12})
    done = vime("submit", "--local", str(TINY), *_sets(runs, save, "other"),
                "--set", "rollout.num_rollout=10", env={"VIME_DRIVER": f"{DRIVERS}:fail"},
                timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"checkpoint folder {save}" in done.stderr and f"job {holder.job_id}" in done.stderr
    assert "finished" not in done.stdout + done.stderr


def test_a_refused_run_keeps_none_of_the_locks_it_took(running_job):
    runs, save, holder = running_job
    mine = lock.holder_now("local-second", "local", os.getpid(), runs / "other")
    with pytest.raises(lock.ExperimentLocked) as held:
        lock.acquire_run(lock.run_folders(runs / "other", save), mine)
    assert held.value.holder.job_id == holder.job_id and held.value.role == "checkpoints"
    assert lock.read(runs / "other") is None  # its experiment's lock, taken first, released
    assert lock.read(save).job_id == holder.job_id


def test_a_job_submitted_by_hand_is_refused_on_its_head_node(running_job):
    # job.sbatch run without `vime submit`: the head node takes the locks itself
    from runtime.node.job import NodeContext, _hold_experiment
    from runtime.node.preflight import PreflightError

    runs, save, holder = running_job
    job_dir = runs / "other" / "12345"
    job_dir.mkdir(parents=True)
    (job_dir / "resolved.toml").write_text(f"[model]\nsave = {json.dumps(str(save))}\n")
    (job_dir / "job.json").write_text(json.dumps({"launcher": "slurm"}))
    ctx = NodeContext("12345", job_dir, 0, 1, ("n1",), 0, False)
    with pytest.raises(PreflightError, match=f"checkpoint folder {save} is in use by job "
                                             f"{holder.job_id}"):
        _hold_experiment(ctx)
    assert lock.read(runs / "other") is None
