"""Faults injected into short in-process runs of specs/tiny_cpu.toml (docs/runtime.md, "What
survives a fault"): a bad reward stops the rollout before anything is trained or saved and
names the reward and the sample; a corrupt newest checkpoint is named on resume; a job killed
between a rollout's checkpoint and its metrics line loses neither."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runtimekit import ROOT, TINY, in_process_loop, job_config, metrics, vime

from runtime.rl import guards
from runtime.rl.checkpoint import CheckpointError, Checkpoints
from runtime.rl.rewards import RewardError

SAMPLES_PER_ROLLOUT = 64  # specs/tiny_cpu.toml: 8 prompts x 8 samples

# rewards of the toy task, bad from the second rollout's fourth sample on
REWARDS = f'''
import math, time
from runtime import toy

calls = 0

def _bad(value):
    def reward(prompt, response, label):
        global calls
        calls += 1
        if calls > {SAMPLES_PER_ROLLOUT} + 3:
            return value() if callable(value) else value
        return toy.reward(prompt, response, label)
    return reward

nan_score = _bad(lambda: {{"score": math.nan}})
text_score = _bad("0.5")
raises = _bad(lambda: 1 / 0)
sleeps = _bad(lambda: time.sleep(600))
'''


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    """A module of rewards importable as fault_rewards, fresh for each test."""
    (tmp_path / "fault_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fault_rewards", None)
    yield "fault_rewards"
    sys.modules.pop("fault_rewards", None)


def _loop(tmp_path, job="job", log=lambda line: None, **keys):
    # no eval: its reward calls would count towards the faulty rewards' call counter
    keys = {"rollout__num_rollout": "3", "checkpoint__save_interval": "1",
            "eval__datasets": "[]", **keys}
    _, _, config = job_config(tmp_path, job, **keys)
    loop = in_process_loop(config, log=log)
    return loop, config


def _all_finite(checkpoint: Path) -> bool:
    state = torch.load(checkpoint / "train" / "model_optim.pt", weights_only=True)
    return all(bool(torch.isfinite(t).all()) for t in state["model"].values())


@pytest.mark.parametrize("reward, says", [
    ("nan_score", "returned nan"),
    ("text_score", "returned '0.5', a str, not a number"),
    ("raises", "raised ZeroDivisionError: division by zero"),
])
def test_a_bad_reward_stops_the_rollout_before_anything_is_saved(tmp_path, reward_module,
                                                                  reward, says):
    loop, config = _loop(tmp_path, rollout__reward=f'"{reward_module}:{reward}"')
    with pytest.raises(RewardError) as failure:
        loop.run()
    message = str(failure.value)
    assert says in message
    assert f"reward {reward_module}:" in message
    # the sample: rollout 1, its fourth sample, and the prompt's line in the data file
    assert "rollout 1, sample 3 (prompt at " in message
    assert f"{config.data.prompt_data}:" in message
    checkpoints = Checkpoints(config.save_dir)
    assert [p.name for p in checkpoints.complete()] == ["rollout_000000"]
    assert _all_finite(checkpoints.latest())
    assert [r["rollout"] for r in metrics(config.job_dir)] == [0]


def test_a_reward_past_its_timeout_is_named(tmp_path, reward_module):
    lines = []
    loop, _ = _loop(tmp_path, log=lines.append, rollout__reward=f'"{reward_module}:sleeps"',
                    rollout__reward_timeout_s="0.5")
    with pytest.raises(RewardError, match=r"did not return within rollout.reward_timeout_s = "
                                          r"0.5 s on rollout 1, sample 3"):
        loop.run()


def test_non_finite_training_numbers_stop_the_step():
    guards.check_train(0, [{"pg_loss": 0.1, "step/grad_norm": 2.0}])
    with pytest.raises(guards.NonFiniteError, match="optimizer step 1: step/grad_norm is nan"):
        guards.check_train(4, [{"pg_loss": 0.1, "step/grad_norm": 1.0},
                               {"pg_loss": 0.2, "step/grad_norm": math.nan}])
    with pytest.raises(guards.NonFiniteError, match="the actor log-probs of sample 1"):
        guards.check_batch(2, [0.5, -0.5], {"actor": [[-1.0, -2.0], [-1.0, -math.inf]]},
                           lambda i: f"sample {i}")
    # +inf beside -inf in one row: the row's sum is no number at all
    with pytest.raises(guards.NonFiniteError, match="the reference log-probs of sample 0"):
        guards.check_batch(2, [0.5], {"reference": [[math.inf, -math.inf]]},
                           lambda i: f"sample {i}")


# ----------------------------------------------------------------------- corrupt checkpoints

def _two_checkpoints(tmp_path):
    loop, config = _loop(tmp_path, "first", rollout__num_rollout="2")
    loop.run()
    return config


def _flip_bytes(path: Path, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for index in range(middle, middle + count):
        data[index] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, says", [
    ("flip", "model_optim.pt does not match its recorded sha256"),
    ("no_state", "state.json is missing"),
    ("empty_state", "state.json cannot be read: JSONDecodeError"),
])
def test_a_corrupt_newest_checkpoint_is_named_and_the_previous_used_only_when_asked(
        tmp_path, damage, says):
    config = _two_checkpoints(tmp_path)
    newest = config.save_dir / "rollout_000001"
    if damage == "flip":
        _flip_bytes(newest / "train" / "model_optim.pt")
    elif damage == "no_state":
        (newest / "state.json").unlink()
    else:
        (newest / "state.json").write_text("")
    loop, _ = _loop(tmp_path, "second", rollout__num_rollout="3")
    with pytest.raises(CheckpointError) as failure:
        loop.restore()
    assert str(newest) in str(failure.value) and says in str(failure.value)
    assert 'checkpoint.on_corrupt = "previous" to resume from rollout_000000' in str(failure.value)

    lines = []
    loop, _ = _loop(tmp_path, "third", log=lines.append, rollout__num_rollout="3",
                    checkpoint__on_corrupt='"previous"')
    assert loop.restore()
    assert loop.next_rollout == 1
    assert any(str(newest) in line and says in line for line in lines), lines


# ----------------------------------------------------------------- the metrics line survives

KILLED_AT_METRICS = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from runtimekit import in_process_loop, job_config
from runtime.rl.metrics import MetricsLogger

_, _, config = job_config(Path({tmp!r}), "killed", rollout__num_rollout="3",
                          checkpoint__save_interval="1")
loop = in_process_loop(config)
log = MetricsLogger.log

def log_then_die(self, rollout_id, numbers):
    if rollout_id == 1:  # the job stops after this rollout's save, before its line
        os.kill(os.getpid(), signal.SIGKILL)
    log(self, rollout_id, numbers)

MetricsLogger.log = log_then_die
loop.run()
"""


def test_a_job_killed_before_a_rollouts_metrics_line_repeats_that_rollout(tmp_path):
    child = subprocess.run([sys.executable, "-c", KILLED_AT_METRICS.format(
        tests=str(ROOT / "tests" / "runtime"), tmp=str(tmp_path))], timeout=300,
        capture_output=True, text=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    loop, config = _loop(tmp_path, "resumed")
    assert loop.restore()
    loop.run()
    killed = metrics(config.job_dir.parent / "killed")
    resumed = metrics(config.job_dir)
    assert sorted({r["rollout"] for r in killed + resumed}) == [0, 1, 2]
    assert [r["rollout"] for r in resumed] == [1, 2]


def test_the_metrics_line_is_on_disk_before_the_checkpoint_that_covers_it(tmp_path):
    seen = []
    loop, config = _loop(tmp_path, rollout__num_rollout="2")
    commit = loop.checkpoints.commit

    def commit_after_looking(pending):
        lines = metrics(config.job_dir)
        seen.append((pending.rollout_id, lines[-1]["rollout"] if lines else None))
        return commit(pending)

    loop.checkpoints.commit = commit_after_looking
    loop.run()
    assert seen == [(0, 0), (1, 1)]
    assert os.path.exists(config.save_dir / "rollout_000001")
    assert json.loads((config.save_dir / "rollout_000001" / "state.json").read_text())["files"]


def test_vime_submit_names_an_incomplete_newest_checkpoint_before_starting(tmp_path):
    config = _two_checkpoints(tmp_path)
    newest = config.save_dir / "rollout_000001"
    (newest / "state.json").write_text("")
    sets = ["--set", f"experiment.output_dir={json.dumps(str(tmp_path / 'runs'))}"]
    done = vime("submit", "--local", str(TINY), *sets, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert (f"checkpoint {newest} is corrupt or incomplete: {newest / 'state.json'} cannot be "
            "read: JSONDecodeError") in done.stderr
    assert 'checkpoint.on_corrupt = "previous"' in done.stderr
    assert not list(config.job_dir.parent.glob("local-*"))  # nothing started


def test_a_malformed_prompt_line_is_named_by_file_and_line_before_starting(tmp_path):
    rows = [json.dumps({"prompt": f"What is {i} + 1?", "label": str(i + 1)}) for i in range(25)]
    rows[20] = rows[20][:-12]  # line 21 cut short
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(rows) + "\n")
    done = vime("submit", "--local", str(TINY), "--set",
                f"experiment.output_dir={json.dumps(str(tmp_path / 'runs'))}", "--set",
                f"data.prompt_data={json.dumps(str(data))}", timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"vime: error: data.prompt_data: {data}:21: not JSON: " in done.stderr


def test_a_slow_reward_is_reported_once_per_rollout():
    import time

    from runtime.rl.rewards import RewardCaller, Sample

    def slow(prompt, response, label):
        time.sleep(0.15)
        return 1.0

    lines = []
    call = RewardCaller(slow, timeout_s=1.0, log=lines.append)
    for index in range(3):
        assert call(Sample(4, index, 7, "p.jsonl"), prompt="", response="", label="") == (1.0, {})
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"vime: reward {__name__}:test_a_slow_reward_is_reported_once_"
                               "per_rollout.<locals>.slow took ")
    assert "on rollout 4, sample 0 (prompt at p.jsonl:7) (rollout.reward_timeout_s = 1 s)" in lines[0]


def test_a_reward_that_times_itself_with_signal_alarm_runs_in_the_main_thread():
    import signal

    from runtime.rl.rewards import RewardCaller, Sample

    def with_alarm(prompt, response, label):  # as math-verify times its parsing
        previous = signal.signal(signal.SIGALRM, lambda *_: None)
        signal.alarm(5)
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        return 0.5

    call = RewardCaller(with_alarm, timeout_s=30.0)
    assert call(Sample(0, 0, 1, "p.jsonl"), prompt="", response="", label="") == (0.5, {})
