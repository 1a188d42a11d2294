"""One job, one duration: the time `vime submit --local` says a job took and the time
`vime logs -f` says are the same measure, from the job's start record (ray/ready-*.json
job_start, the head node's start) to its outcome record (outcome.json finished, when the
driver ended)."""

from __future__ import annotations

import json
import re
import time

import pytest
from launchkit import DRIVERS, SMOKE, spec_sets, vime

from vime.launch.progress import Progress, job_times


def _ended_job(folder, start: float, finished: float):
    (folder / "logs").mkdir(parents=True)
    (folder / "ray").mkdir()
    (folder / "ray" / "ready-0.json").write_text(json.dumps({"attempt": 0, "job_start": start}))
    (folder / "outcome.json").write_text(json.dumps({"attempt": 0, "state": "succeeded",
                                                     "finished": finished}))


def test_the_duration_runs_from_the_start_record_to_the_outcome_record(tmp_path):
    _ended_job(tmp_path, start=1000.0, finished=1135.0)
    assert job_times(tmp_path) == (1000.0, 1135.0)
    # the launcher's Progress starts when it writes the job folder and ends when it prints
    shown = Progress(tmp_path, 10, quiet=True, started=time.time())
    shown.records = [{"rollout": 0, "reward/mean": 0.1}, {"rollout": 9, "reward/mean": 0.5}]
    assert shown.ending("local-1", "succeeded", None, tmp_path / "logs") == \
        "job local-1 succeeded: rollouts 0 to 9 of 10 in 2:15, reward 0.100 -> 0.500"


def test_a_requeued_job_runs_from_its_first_attempts_start(tmp_path):
    _ended_job(tmp_path, start=1000.0, finished=1135.0)
    (tmp_path / "ray" / "ready-1.json").write_text(json.dumps({"attempt": 1, "job_start": 1100}))
    assert job_times(tmp_path).started == 1000.0


def test_a_job_with_no_records_yet_has_no_times(tmp_path):
    assert job_times(tmp_path) == (None, None)


def _duration(text: str) -> str:
    found = re.search(r"succeeded: rollouts 0 to 1 of \d+ in (\d+:\d\d)", text)
    assert found, text
    return found.group(1)


@pytest.mark.slow
def test_submit_and_logs_f_say_the_same_duration_of_a_real_local_job(tmp_path):
    done = vime("submit", str(SMOKE), "--local", *spec_sets(tmp_path, nodes=1, gpus_per_node=2),
                env={"VIME_DRIVER": f"{DRIVERS}:rollouts", "VIME_TEST_STEPS": "2",
                     "VIME_STATE_DIR": str(tmp_path / "state")})
    assert done.returncode == 0, done.stdout + done.stderr
    [folder] = (tmp_path / "qwen3-30b-a3b-smoke").glob("local-*")
    followed = vime("logs", str(folder), "-f", timeout=60)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert _duration(done.stdout) == _duration(followed.stdout)
    started, finished = job_times(folder)
    seconds = int(round(finished - started))
    assert _duration(done.stdout) == f"{seconds // 60}:{seconds % 60:02d}"
