"""`vime cancel` says where the next submit of the spec starts, in the words of the job's
last line (vime/launch/progress.py, next_submit): from the job folder's resolved.toml and the
checkpoints really written in its save folder. A local job's node is a real process here
(`sleep`), stopped as `vime cancel` stops one; a Slurm job is a real one on the CI cluster."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from checkpointkit import FakeTrain

from runtime.rl.checkpoint import Checkpoints
from vime.launch import follow
from vime.launch.jobdir import JobFolder
from vime.launch.progress import Progress
from vime.launch.resume import StartPoint


def _job_folder(tmp_path: Path, launcher: str, job_id: str, on_corrupt: str = "stop") -> Path:
    folder = tmp_path / "runs" / "exp" / job_id
    (folder / "logs").mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({
        "job_id": job_id, "launcher": launcher, "experiment": "exp", "nodes": 1,
        "gpus_per_node": 1}) + "\n")
    (folder / "resolved.toml").write_text(
        f'[rollout]\nnum_rollout = 40\n\n[model]\nsave = "{tmp_path / "ckpt"}"\n\n'
        f'[checkpoint]\non_corrupt = "{on_corrupt}"\n')
    return folder


def _cancel_running_local_job(folder: Path) -> str:
    node = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        (folder / "local.json").write_text(json.dumps({"launcher_pid": node.pid,
                                                       "pids": [node.pid]}) + "\n")
        said = follow.cancel(JobFolder(folder))
    finally:
        node.kill()
        node.wait()
    assert said.startswith(f"cancelled job {folder.name}: 1 node process(es)"), said
    return said


def test_cancel_of_a_job_with_no_checkpoint_says_the_next_submit_starts_fresh(tmp_path):
    said = _cancel_running_local_job(_job_folder(tmp_path, "local", "local-1"))
    assert said.endswith("; the next `vime submit` of this spec starts fresh (no checkpoint "
                         "yet)"), said


def test_cancel_names_the_checkpoint_and_rollout_the_next_submit_resumes_from(tmp_path):
    checkpoints = Checkpoints(tmp_path / "ckpt")
    checkpoints.save(9, FakeTrain("older"), {"next_rollout": 10})
    newest = checkpoints.save(19, FakeTrain("newest"), {"next_rollout": 20})
    said = _cancel_running_local_job(_job_folder(tmp_path, "local", "local-2"))
    assert said.endswith(f"; the next `vime submit` of this spec resumes from rollout 20 "
                         f"(checkpoint {newest})"), said


def test_cancel_honours_on_corrupt(tmp_path):
    checkpoints = Checkpoints(tmp_path / "ckpt")
    older = checkpoints.save(9, FakeTrain("older"), {"next_rollout": 10})
    newest = checkpoints.save(19, FakeTrain("newest"), {"next_rollout": 20})
    weights = newest / "train" / "weights.txt"
    weights.write_text("NEWEST")  # the size kept: only the checksum tells
    said = _cancel_running_local_job(_job_folder(tmp_path, "local", "local-3", "previous"))
    assert f"resumes from rollout 10 (checkpoint {older})" in said, said

    weights.unlink()  # "stop" sees a missing file, and the next submit stops there
    said = _cancel_running_local_job(_job_folder(tmp_path, "local", "local-4", "stop"))
    assert f"; the next `vime submit` of this spec does not start: checkpoint {newest} is " \
        "corrupt or incomplete" in said, said
    assert "checkpoint.on_corrupt = \"previous\"" in said, said


def test_the_jobs_last_line_says_a_corrupt_checkpoint_stops_the_next_submit(tmp_path):
    corrupt = StartPoint(tmp_path, tmp_path / "rollout_000019", 0, "train/weights.txt missing")
    line = Progress(tmp_path, 40, quiet=True).ending("7", "interrupted", None, tmp_path, corrupt)
    assert "resumes from rollout 0" not in line, line
    assert line.startswith("job 7 interrupted; the next `vime submit` of this spec does not "
                           f"start: checkpoint {tmp_path / 'rollout_000019'} is corrupt"), line


@pytest.mark.slurm
def test_cancel_on_slurm_says_where_the_next_submit_resumes_now(tmp_path, slurm_cluster):
    newest = Checkpoints(tmp_path / "ckpt").save(4, FakeTrain("w"), {"next_rollout": 5})
    submitted = subprocess.run(["sbatch", "--parsable", "-p", "debug", "-N", "1",
                                f"--chdir={tmp_path}", "--wrap", "sleep 300"],
                               capture_output=True, text=True, check=True)
    job_id = submitted.stdout.strip().split(";")[0]
    folder = _job_folder(tmp_path, "slurm", job_id)
    said = follow.cancel(JobFolder(folder))
    assert said.startswith(f"cancelled job {job_id} (scancel"), said
    assert f"now: the next `vime submit` of this spec resumes from rollout 5 (checkpoint " \
        f"{newest})" in said, said
    deadline = time.time() + 60
    while follow.live_state(JobFolder(folder))[0] not in ("CANCELLED", "COMPLETED") and \
            time.time() < deadline:
        time.sleep(1)
