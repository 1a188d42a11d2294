"""`vime submit` against a real Slurm (two slurmd on this machine, fake GPUs, accounting) and
a real Ray with logical GPUs: the cluster comes from the `slurm_cluster` fixture."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from launchkit import (
    DRIVERS,
    SMOKE,
    job_state,
    marked_processes,
    spec_sets,
    submitted_id,
    vime,
    wait_finished,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]
CHECK = {"VIME_DRIVER": f"{DRIVERS}:check"}
PROGRESS = {"VIME_DRIVER": f"{DRIVERS}:progress"}
ROLLOUTS = {"VIME_DRIVER": f"{DRIVERS}:rollouts"}


def _job_folder(job_id: str):
    from vime.launch import follow

    return follow.find(job_id).path


def _ray_of(job_id: str) -> list[int]:
    return marked_processes(f"VIME_RAY_NODE=/tmp/vime-{job_id}-".encode())


def _follow(job_id: str, *extra: str, stdout=subprocess.PIPE) -> subprocess.Popen:
    """`vime logs -f JOB`, from another folder than the one the job was submitted from."""
    return subprocess.Popen([str(Path(sys.executable).with_name("vime")), "logs", job_id, "-f",
                             *extra], cwd="/", stdout=stdout, stderr=subprocess.PIPE, text=True)


def _comment(job_id: str) -> str:
    # slurmctld keeps finished jobs for MinJobAge; accounting stores no comment by default
    return subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%k"],
                          capture_output=True, text=True).stdout.rstrip("\n")


def test_two_nodes_boot_ray_and_hostile_strings_stay_data(tmp_path, request):
    """The issue's first test, with quotes, $(), backticks, ; and newlines in the experiment
    folder, in [cluster.env] values and in sbatch extra args."""
    # a short trap folder: its path is in the experiment folder's name three times, and a
    # name has at most 255 bytes wherever the test's own folder is (pytest-xdist's are longer)
    trap = Path(tempfile.mkdtemp(prefix="vt", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(trap, ignore_errors=True))
    hostile = f"$(touch {trap}/1) `touch {trap}/2`; touch {trap}/3 'q' \"dq\" #h \\"
    # '/' would make folders; '\\' and '%' are refused (Slurm reads them in file names)
    output_dir = tmp_path / ("runs " + hostile.replace("/", "_").rstrip(" \\"))
    env_value = hostile + "\nline 2 $(touch " + str(trap) + "/4)"
    sets = spec_sets(output_dir, **{
        "cluster.env": "{VIME_TEST_ENV = " + json.dumps(env_value) + ", VIME_TEST_ENV2 = "
                       + json.dumps("`touch " + str(trap) + "/5`") + "}",
        "cluster.slurm.extra_args": json.dumps(["--comment=" + hostile])})
    job_id = submitted_id(vime("submit", str(SMOKE), *sets, env=CHECK, cwd=tmp_path))
    assert wait_finished(job_id) == "COMPLETED", vime("logs", job_id).stdout
    folder = _job_folder(job_id)
    assert folder.parent == output_dir / "qwen3-30b-a3b-smoke"
    seen = json.loads((folder / "driver.json").read_text())
    assert (seen["nodes"], seen["gpus"], seen["bundles"]) == (2, 8.0, 8)
    assert seen["bundles_per_node"] == [4, 4] and seen["probe_nodes"] == 2
    assert sorted(len(ids) for ids in seen["probe_gpu_ids"]) == [1] * 8
    assert seen["env"]["VIME_TEST_ENV"] == env_value
    assert seen["env"]["VIME_TEST_ENV2"] == "`touch " + str(trap) + "/5`"
    assert _comment(job_id) == hostile
    assert list(trap.iterdir()) == []
    assert not _ray_of(job_id)
    status = vime("status", job_id)
    assert status.returncode == 0, status.stderr
    assert "COMPLETED" in status.stdout and "outcome    succeeded" in status.stdout
    assert "Ray ready at" in vime("logs", job_id).stdout
    assert "node=1(2)" in vime("logs", str(folder), "--node", "1").stdout


def test_a_node_that_cannot_join_fails_the_job_within_the_timeout(tmp_path):
    timeout_s = 15
    sets = spec_sets(tmp_path, **{"cluster.ray.startup_timeout_s": str(timeout_s)})
    started = time.time()
    job_id = submitted_id(vime("submit", str(SMOKE), *sets,
                               env={**CHECK, "VIME_TEST_NO_JOIN": "1"}))
    assert wait_finished(job_id, timeout=120) == "FAILED"
    took = time.time() - started
    outcome = json.loads((_job_folder(job_id) / "outcome.json").read_text())
    assert "node 1 (n2) never joined" in outcome["error"], outcome
    assert "4 of 8 GPUs joined" in outcome["error"]
    assert took < timeout_s + 45, took  # Ray's own start-up and teardown on 2 cores
    assert "never joined" in vime("status", job_id).stdout
    assert not _ray_of(job_id)


def test_two_jobs_on_the_same_nodes_at_once_both_finish(tmp_path):
    # two experiments: one experiment runs one job at a time (vime/launch/lock.py)
    ids = [submitted_id(vime("submit", str(SMOKE), *spec_sets(
        tmp_path, nodes=2, gpus_per_node=2, **{"experiment.name": f'"smoke-{n}"'}), env=CHECK))
        for n in range(2)]
    wait_until(lambda: all(job_state(i) == "RUNNING" for i in ids), 60, "both jobs running")
    assert [wait_finished(i) for i in ids] == ["COMPLETED", "COMPLETED"]
    addresses = set()
    for job_id in ids:
        folder = _job_folder(job_id)
        seen = json.loads((folder / "driver.json").read_text())
        assert (seen["nodes"], seen["gpus"], seen["bundles_per_node"]) == (2, 4.0, [2, 2])
        addresses.add((folder / "ray_address").read_text())
    assert len(addresses) == 2


def test_cancel_ends_the_job_and_its_ray(tmp_path):
    job_id = submitted_id(vime("submit", str(SMOKE), *spec_sets(tmp_path),
                               env={**PROGRESS, "VIME_TEST_STEPS": "600"}))
    folder = wait_until(lambda: job_state(job_id) == "RUNNING" and _job_folder(job_id), 60,
                        "the job to run")
    wait_until(lambda: (folder / "progress.json").exists(), 90, "the driver to start")
    assert len(_ray_of(job_id)) > 0
    cancelled = vime("cancel", job_id)
    assert cancelled.returncode == 0 and "cancelled job" in cancelled.stdout
    assert wait_finished(job_id, timeout=60).startswith("CANCELLED")
    wait_until(lambda: not _ray_of(job_id), 20, f"job {job_id}'s Ray processes to end")
    # within Slurm's KillWait (5 s here): the nodes' Ray temp folders are gone too
    wait_until(lambda: not list(Path("/tmp").glob(f"vime-{job_id}-*")), 20,
               f"job {job_id}'s Ray temp folders to be removed")


def test_a_requeued_job_resumes_where_it_stopped(tmp_path):
    env = {**PROGRESS, "VIME_TEST_STEPS": "6", "VIME_TEST_STEP_S": "1"}
    job_id = submitted_id(vime("submit", str(SMOKE), *spec_sets(tmp_path), env=env))
    folder = wait_until(lambda: job_state(job_id) == "RUNNING" and _job_folder(job_id), 60,
                        "the job to run")
    progress = folder / "progress.json"
    wait_until(lambda: progress.exists() and json.loads(progress.read_text())["step"] >= 2, 90,
               "two steps of progress")
    # what Slurm sends 120 s before the time limit (#SBATCH --signal=USR2@120)
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    wait_until(lambda: job_state(job_id) in ("PENDING", "REQUEUED"), 60, "the requeue")
    # a requeued job waits ~120 s (BeginTime) before it is eligible again
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True)
    assert wait_finished(job_id, timeout=180) == "COMPLETED"
    record = json.loads(progress.read_text())
    assert record["step"] == 6
    first, second = record["starts"]
    assert first["resume"] is False and first["from_step"] == 0
    assert second["resume"] is True and second["from_step"] >= 2
    assert second["restart_count"] == "1"
    assert not _ray_of(job_id)


def test_the_build_folders_script_runs_as_it_is(tmp_path):
    # the build folder's job.sbatch is the script that runs; plain sbatch, from the
    # folder vime compile ran in, and the job writes its own job folder
    sets = spec_sets(tmp_path / "runs")
    compiled = vime("compile", str(SMOKE), *sets, "-o", "build/smoke", cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    script = tmp_path / "build" / "smoke" / "job.sbatch"
    done = subprocess.run(["sbatch", "--parsable", "build/smoke/job.sbatch"], cwd=tmp_path,
                          env=dict(os.environ, **CHECK), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().split(";")[0]
    held = subprocess.run(["sbatch", "--parsable", "--hold", "build/smoke/job.sbatch"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    held_id = held.stdout.strip().split(";")[0]
    try:  # before its first step ran, such a job has no folder to find
        pending = vime("status", held_id)
        assert pending.returncode == 2 and (f"job {held_id} is PENDING and has no job folder "
                                            "yet") in pending.stderr, pending.stderr
    finally:
        subprocess.run(["scancel", held_id], timeout=60)
    batch_log = tmp_path / f"slurm-{job_id}.out"
    assert wait_finished(job_id) == "COMPLETED", batch_log.read_text()
    folder = tmp_path / "runs" / "qwen3-30b-a3b-smoke" / job_id
    assert f"vime: job {job_id}: job folder {folder}, written from the build folder " \
        f"{script.parent}" in batch_log.read_text()
    seen = json.loads((folder / "driver.json").read_text())
    assert (seen["nodes"], seen["gpus"], seen["bundles_per_node"]) == (2, 8.0, [4, 4])
    assert (folder / "job.sbatch").read_text() == script.read_text()
    assert not _ray_of(job_id)
    status = vime("status", job_id)  # from any folder, as for `vime submit`
    assert status.returncode == 0 and "outcome    succeeded" in status.stdout, status.stdout


def test_prompts_the_node_cannot_read_fail_the_job_before_ray_starts(tmp_path):
    # not after the queue wait and Ray's start-up; the path may exist only on
    # the cluster, so the head checks it (the default driver: no VIME_DRIVER)
    assert "VIME_DRIVER" not in os.environ
    job_id = submitted_id(vime("submit", str(SMOKE), *spec_sets(tmp_path)))
    assert wait_finished(job_id, timeout=90) == "FAILED"
    folder = _job_folder(job_id)
    error = json.loads((folder / "outcome.json").read_text())["error"]
    # the message of the --local preflight (tests/launch/test_start.py)
    assert error == (f"data.prompt_data: /root/dapo-math-17k/dapo-math-17k.jsonl: no such file "
                     f"(looked in {SMOKE.parent} and {folder.parent})"), error
    assert f"vime: job failed: {error}" in (folder / "logs" / "node-0.log").read_text()
    assert f"outcome    failed (attempt 0): {error}" in vime("status", job_id).stdout
    assert not (folder / "logs" / "ray-node-0.log").exists()  # Ray never started
    assert not (folder / "ray_address").exists()


def test_logs_f_shows_the_progress_of_a_slurm_job_until_it_ends(tmp_path):
    # what `vime submit --local` prints, for a job on Slurm
    sets = spec_sets(tmp_path, **{"rollout.num_rollout": "6"})
    done = vime("submit", str(SMOKE), *sets, "--quiet", env={
        **ROLLOUTS, "VIME_TEST_STEPS": "6", "VIME_TEST_STEP_S": "0.5"})
    job_id = done.stdout.strip()  # --quiet: only the job id, for job=$(vime submit --quiet ...)
    assert done.returncode == 0 and job_id.isdigit(), done.stdout + done.stderr
    follower, quiet = _follow(job_id), _follow(job_id, "--quiet")
    out, err = follower.communicate(timeout=180)
    assert follower.returncode == 0, out + err
    assert job_state(job_id) == "COMPLETED"
    folder = _job_folder(job_id)
    lines = out.splitlines()
    assert lines[0].startswith(f"vime: job {job_id}: qwen3-30b-a3b-smoke, 2 nodes × 4 GPUs, "
                               "on Slurm ("), lines
    assert lines[1:3] == [f"  folder  {folder}",
                          f"  logs    {folder / 'logs' / 'node-0.log'} (head and driver)"]
    assert any(line.startswith("vime: Ray ready at") for line in lines)
    line = next(line for line in lines if line.startswith("rollout 2 |"))
    assert "3/6 [" in line and "reward 0.200" in line and "100 tok/s" in line and "ETA " in line
    assert lines[-1].startswith(f"job {job_id} succeeded: rollouts 0 to 5 of 6 in "), lines
    assert lines[-1].endswith(", reward 0.000 -> 0.500")
    quiet_out, _ = quiet.communicate(timeout=30)
    assert quiet.returncode == 0 and quiet_out.splitlines() == lines[-1:]


def test_ctrl_c_on_logs_f_leaves_the_job_running(tmp_path):
    sets = spec_sets(tmp_path, nodes=1, gpus_per_node=2, **{"rollout.num_rollout": "1000"})
    job_id = submitted_id(vime("submit", str(SMOKE), *sets, env={
        **ROLLOUTS, "VIME_TEST_STEPS": "100000", "VIME_TEST_STEP_S": "0.3"}))
    shown = tmp_path / "follower.txt"
    with open(shown, "w") as terminal:
        follower = _follow(job_id, stdout=terminal)
    try:
        wait_until(lambda: "rollout    2 |" in shown.read_text(), 120, "rollout lines")
    except AssertionError:
        follower.kill()
        raise
    follower.send_signal(signal.SIGINT)
    assert follower.wait(timeout=10) == 130
    assert (f"vime: stopped following job {job_id}; the job goes on (vime cancel {job_id} "
            "stops it)") in follower.stderr.read()
    metrics = _job_folder(job_id) / "metrics.jsonl"
    seen = len(metrics.read_text().splitlines())
    wait_until(lambda: len(metrics.read_text().splitlines()) > seen + 2, 30, "more rollouts")
    assert job_state(job_id) == "RUNNING"
    assert vime("cancel", job_id).returncode == 0
    assert wait_finished(job_id, timeout=60).startswith("CANCELLED")
    wait_until(lambda: not _ray_of(job_id), 20, f"job {job_id}'s Ray processes to end")
    ended = vime("logs", job_id, "-f", "--quiet")  # a job that has ended: its outcome at once
    assert ended.returncode == 4, ended.stdout + ended.stderr
    checkpoints = _job_folder(job_id).parent / "checkpoints"
    latest = checkpoints / (checkpoints / "latest").read_text().strip()
    assert ended.stdout.startswith(f"job {job_id} cancelled (scancel or vime cancel) after "
                                   "rollout "), ended.stdout
    resumed_by = json.loads((_job_folder(job_id) / "job.json").read_text())["resume"]
    assert ended.stdout.endswith(f"; {resumed_by} resumes it from rollout "
                                 f"{int(latest.name.split('_')[1]) + 1} (checkpoint {latest})\n")
