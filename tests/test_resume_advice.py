"""The advice a stopped job ends with: the exact submit that resumes its run (a --fresh run's
experiment.name and every other --set included), and none for a run a later job has finished.
Job folders as `vime submit` writes them, read by `vime logs -f` (vime/launch/follow.py)."""

from __future__ import annotations

import io
import json
import shlex
from pathlib import Path

import pytest
from specsupport import ROOT, run_text

from vime.launch import follow, resume
from vime.launch.jobdir import JobFolder

TINY = ROOT / "specs" / "tiny_cpu.toml"
TOTAL = 4


def _checkpoint(experiment: Path, next_rollout: int) -> Path:
    folder = experiment / "checkpoints" / f"rollout_{next_rollout - 1:06d}"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps(
        {"format": 1, "rollout": next_rollout - 1, "next_rollout": next_rollout}))
    (experiment / "checkpoints" / "latest").write_text(folder.name + "\n")
    return folder


def _stopped_job(experiment: Path, job_id: str, resume_with: str | None) -> JobFolder:
    folder = experiment / job_id
    (folder / "logs").mkdir(parents=True)
    info = {"job_id": job_id, "launcher": "local", "experiment": experiment.name, "nodes": 1,
            "gpus_per_node": 1}
    if resume_with is not None:
        info["resume"] = resume_with
    (folder / "job.json").write_text(json.dumps(info))
    (folder / "resolved.toml").write_text(f"[rollout]\nnum_rollout = {TOTAL}\n[model]\n")
    (folder / "outcome.json").write_text(json.dumps({"state": "interrupted"}))
    return JobFolder(folder)


def _ending(folder: JobFolder) -> str:
    out = io.StringIO()
    assert follow.watch(folder, quiet=True, out=out) == 4
    return out.getvalue().strip().splitlines()[-1]


def test_the_resume_command_is_this_submits_spec_sets_and_launcher(tmp_path):
    sets = ['experiment.name="tiny-cpu-3"', "rollout.num_rollout=150"]
    spec = run_text(TINY.read_text(), sets, name="specs/tiny_cpu.toml").spec
    said = resume.command(spec.invocation, "local", None, tmp_path)
    command, where = said.split("` in ")
    assert where == str(tmp_path)
    assert shlex.split(command.strip("`")) == [
        "vime", "submit", "specs/tiny_cpu.toml", "--set", sets[0], "--set", sets[1], "--local"]
    ray = resume.command(spec.invocation, "ray-address", "10.0.0.1:6379", tmp_path)
    assert ray.split("` in ")[0].endswith("--ray-address 10.0.0.1:6379")


@pytest.mark.parametrize("recorded", [True, False], ids=["job.json", "older-job-folder"])
def test_a_stopped_job_says_how_its_run_resumes(tmp_path, recorded):
    experiment = tmp_path / "tiny-cpu-3"
    checkpoint = _checkpoint(experiment, 2)
    command = ("`vime submit specs/tiny_cpu.toml --set 'experiment.name=\"tiny-cpu-3\"' "
               "--local` in /w")
    line = _ending(_stopped_job(experiment, "local-1", command if recorded else None))
    assert line.startswith("job local-1 interrupted")
    if recorded:
        assert line.endswith(f"; {command} resumes it from rollout 2 (checkpoint {checkpoint})")
    else:
        assert line.endswith("; the next `vime submit` of this spec resumes from rollout 2 "
                             f"(checkpoint {checkpoint})")


def test_no_resume_advice_for_a_run_a_later_job_has_finished(tmp_path):
    experiment = tmp_path / "tiny-cpu"
    stopped = _stopped_job(experiment, "local-1",
                           "`vime submit specs/tiny_cpu.toml --local` in /w")
    finished = _checkpoint(experiment, TOTAL)  # written by a later job that ran to the end
    line = _ending(stopped)
    assert line.endswith(f"; a later job has since finished its run (checkpoint {finished} "
                         f"is at rollout {TOTAL} of {TOTAL}): there is nothing to resume")
