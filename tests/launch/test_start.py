"""Where a run starts, said before anything starts: a finished run says so without
starting Ray, `--fresh` starts a new run folder beside the old one, and a prompt file the job
could not read is an error before the job exists."""

from __future__ import annotations

import json
import time
from pathlib import Path

from launchkit import DRIVERS, ROOT, SMOKE, spec_sets, vime

TINY = ROOT / "specs" / "tiny_cpu.toml"


def _checkpoint(experiment: Path, rollout: int) -> Path:
    folder = experiment / "checkpoints" / f"rollout_{rollout:06d}"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps(
        {"format": 1, "rollout": rollout, "next_rollout": rollout + 1}))
    (experiment / "checkpoints" / "latest").write_text(folder.name + "\n")
    return folder


def test_a_finished_run_says_so_before_starting_anything(tmp_path):
    experiment = tmp_path / "qwen3-30b-a3b-smoke"
    last = _checkpoint(experiment, 1)  # the smoke spec's rollout.num_rollout = 2
    started = time.time()
    done = vime("submit", str(SMOKE), "--local", *spec_sets(tmp_path, nodes=1, gpus_per_node=2),
                env={"VIME_DRIVER": f"{DRIVERS}:check"}, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.time() - started < 30  # no Ray: it took 38 s to start before saying this
    assert (f"vime: qwen3-30b-a3b-smoke is finished: its checkpoint {last} is at rollout 2 of "
            "rollout.num_rollout = 2; nothing to run.") in done.stdout
    assert sorted(p.name for p in experiment.iterdir()) == ["checkpoints"]  # no job folder


def test_fresh_starts_a_new_run_beside_the_old_one(tmp_path):
    experiment = tmp_path / "qwen3-30b-a3b-smoke"
    old = _checkpoint(experiment, 1)
    done = vime("submit", str(SMOKE), "--local", "--fresh",
                *spec_sets(tmp_path, nodes=1, gpus_per_node=2),
                env={"VIME_DRIVER": f"{DRIVERS}:rollouts", "VIME_TEST_STEPS": "2",
                     "VIME_TEST_STEP_S": "0"})
    assert done.returncode == 0, done.stdout + done.stderr
    fresh = tmp_path / "qwen3-30b-a3b-smoke-2"
    assert "vime: --fresh: a new run qwen3-30b-a3b-smoke-2 in " + str(fresh) in done.stdout
    assert f"starting fresh (no checkpoint in {fresh / 'checkpoints'})" in done.stdout
    assert (old / "state.json").is_file()  # the old run is untouched
    assert list(fresh.glob("local-*/metrics.jsonl"))


def test_an_unreadable_prompt_file_is_an_error_before_the_job_starts(tmp_path):
    done = vime("submit", str(TINY), "--local", "--set",
                f'experiment.output_dir="{tmp_path}"', "--set",
                'data.prompt_data="data/missing.jsonl"', cwd=tmp_path, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    # looked for in the folders the node's own reading looks in (runtime/core/slices.py)
    assert (f"error[V732]: data.prompt_data = 'data/missing.jsonl' is not a file on this "
            f"machine ({TINY.parent / 'data' / 'missing.jsonl'})") in done.stderr
    assert " --> --set[2]:1:18" in done.stderr
    assert not list(tmp_path.iterdir())  # no job folder


def test_a_reward_module_the_node_cannot_import_fails_the_job_before_ray_starts(tmp_path):
    # compile only looks for the module (V907, a warning: it may exist on the cluster only);
    # the head imports it before `ray start`, where the driver would after Ray's start-up
    started = time.time()
    done = vime("submit", str(TINY), "--local", "--set", f'experiment.output_dir="{tmp_path}"',
                "--set", 'rollout.reward="vime_no_such_module:score"',
                "--set", 'logging.wandb_project="vime-runs"', timeout=120)
    assert done.returncode == 4, done.stdout + done.stderr
    assert time.time() - started < 60
    assert "warning[V907]" in done.stderr
    assert "warning[V925]" in done.stderr  # wandb is in no extra the tests install
    [folder] = (tmp_path / "tiny-cpu").glob("local-*")
    message = ("rollout.reward = 'vime_no_such_module:score': cannot import vime_no_such_module: "
               "No module named 'vime_no_such_module'")
    assert f"job {folder.name} failed: {message}" in done.stdout, done.stdout
    assert json.loads((folder / "outcome.json").read_text())["error"] == message
    log = (folder / "logs" / "node-0.log").read_text()
    assert f"vime: job failed: {message}" in log
    # what the head has installed, and the logger the spec asks for that it lacks, said first
    assert "vime: installed here: torch 2." in log
    assert ("vime: WARNING: logging.wandb_project = 'vime-runs' but wandb is NOT INSTALLED on "
            "this node: this run logs no wandb (metrics.jsonl only); pip install "
            "'vime[wandb]'") in log
    assert not (folder / "logs" / "ray-node-0.log").exists()  # Ray never started
    assert not (folder / "ray_address").exists()
