"""specs/tiny_cpu.toml through `vime submit --local`, as a user runs it: Ray comes up, the
reward rises, checkpoints are written, and a job killed after its last checkpoint is resumed
by the next submit and ends where the first one did; a spec of another model is then refused
by `vime plan` (V708)."""

from __future__ import annotations

import shutil
import statistics

import pytest
import torch
from runtimekit import TINY, metrics, vime
from specsupport import assert_report_matches, read_report

ROLLOUTS = 20
# With experiment.seed = 1234 the mean reward of rollouts 0-2 is about 0.04 and of rollouts
# 17-19 about 0.2 (the model has learned to open \boxed{ and put a digit in it); four other
# seeds tried gave the same rise within 0.02. A random policy stays near 0.03.
RISE = 0.1
RESUME_TOLERANCE = 1e-6  # the same machine, seeds and threads: equal up to summation order


def _submit(output, *sets):
    done = vime("submit", "--local", str(TINY), "--set", f'experiment.output_dir="{output}"',
                "--set", f"rollout.num_rollout={ROLLOUTS}", "--set", "checkpoint.save_interval=10",
                *[arg for s in sets for arg in ("--set", s)])
    jobs = sorted((output / "tiny-cpu").glob("local-*"), key=lambda p: p.stat().st_mtime)
    assert done.returncode == 0, done.stdout + done.stderr + (
        (jobs[-1] / "logs" / "node-0.log").read_text() if jobs else "")
    return jobs[-1], done.stdout


@pytest.mark.slow
def test_tiny_cpu_learns_checkpoints_and_resumes(tmp_path):
    first, terminal = _submit(tmp_path)
    log = (first / "logs" / "node-0.log").read_text()
    # what the person who runs it sees: the job, a fresh start, a line per rollout
    # with its progress, and a summary
    lines = terminal.splitlines()
    assert lines[0].startswith(f"vime: job {first.name}: tiny-cpu, 1 node × 1 "), terminal
    assert "  starting fresh (no checkpoint in" in lines[3], terminal
    shown = [line for line in lines if line.startswith("rollout ")]
    assert len(shown) == ROLLOUTS and shown[-1].startswith(f"rollout 19 | 20/{ROLLOUTS} [####")
    assert all(" tok/s | gen " in line and " train " in line and "ETA " in line
               for line in shown), shown
    assert f"job {first.name} succeeded: rollouts 0 to 19 of {ROLLOUTS} in " in terminal
    records = metrics(first)
    assert [r["rollout"] for r in records] == list(range(ROLLOUTS)), log
    rewards = [r["reward/mean"] for r in records]
    start, end = statistics.fmean(rewards[:3]), statistics.fmean(rewards[-3:])
    assert end >= start + RISE, f"reward {start:.3f} -> {end:.3f}: {rewards}"
    assert all(r["memory/engine_bytes_while_training"] == 0 for r in records)  # colocated turns
    assert f"rollout {ROLLOUTS - 1:5d} | reward" in log  # the console line per rollout
    # `vime report`: the run's curves, read back from the page, are its metrics.jsonl
    shown = vime("report", str(first))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    panels = read_report(first / "report.html")
    assert assert_report_matches(panels, records) >= 8
    assert len(panels["Reward"]["reward/mean"]) == ROLLOUTS
    assert {"rollout/logprob_abs_diff", "train/rollout_logprob_abs_diff"} <= set(
        panels["Log-prob gap, rollout vs training"])

    checkpoints = tmp_path / "tiny-cpu" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("rollout_*")) == ["rollout_000009",
                                                                   "rollout_000019"]
    assert (checkpoints / "latest").read_text().strip() == "rollout_000019"
    final = torch.load(checkpoints / "rollout_000019" / "train" / "model_optim.pt")["model"]
    assert (first / "tokenizer" / "tokenizer.json").exists()

    # The job dies after rollout 15, say: its last checkpoint is the one after rollout 9.
    shutil.rmtree(checkpoints / "rollout_000019")
    (checkpoints / "latest").write_text("rollout_000009\n")
    second, terminal = _submit(tmp_path)
    assert second != first
    assert (f"resuming from rollout 10 of {ROLLOUTS} (checkpoint "
            f"{checkpoints / 'rollout_000009'})") in terminal
    assert "resumed from" in (second / "logs" / "node-0.log").read_text()
    again = metrics(second)
    assert [r["rollout"] for r in again] == list(range(10, ROLLOUTS))
    for want, have in zip(records[10:], again, strict=True):
        for key in ("reward/mean", "response_len/mean", "train/pg_loss", "train/entropy",
                    "weight_version"):
            assert have[key] == pytest.approx(want[key], abs=RESUME_TOLERANCE), (want["rollout"], key)
    resumed = torch.load(checkpoints / "rollout_000019" / "train" / "model_optim.pt")["model"]
    assert max(float((final[n] - resumed[n]).abs().max()) for n in final) <= RESUME_TOLERANCE

    # The next submit with another model would resume this run: `vime plan` refuses it
    # (V708, from the record the run wrote) instead of a load that fails after Ray's start.
    output = ("--set", f'experiment.output_dir="{tmp_path}"')
    assert vime("plan", str(TINY), *output).returncode == 0
    changed = vime("plan", str(TINY), *output, "--set", "model.arch.num_hidden_layers=3")
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert (f"error[V708]: {checkpoints / 'rollout_000019'}, the checkpoint a submit resumes "
            "from, was written by another model: num_hidden_layers 2 in the checkpoint, 3 in "
            "this spec") in changed.stderr
    assert "vime submit --fresh" in changed.stderr
