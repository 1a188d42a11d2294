"""The loop with another estimator, a sequence-level loss aggregation, an LR schedule and R3
(TIS is on in the tiny spec), in this process (no Ray): the metrics carry the schedule's rate
and a resumed run ends where the uninterrupted one does, schedule included."""

from __future__ import annotations

import pytest
from runtimekit import job_config, metrics, run_to_weights

from runtime.core import lr_schedule

KEYS = dict(algorithm__advantage_estimator='"rloo"',
            algorithm__loss_aggregation='"seq-mean-token-mean"',
            train__optimizer__lr_warmup_iters="2", train__optimizer__lr_decay_style='"cosine"',
            train__optimizer__lr_decay_iters="8", train__optimizer__min_lr="3e-4",
            checkpoint__save_interval="2", train__routing_replay="true")


def _run(tmp_path, job, rollouts):
    _, _, config = job_config(tmp_path, job, rollout__num_rollout=str(rollouts), **KEYS)
    return config, run_to_weights(config)


def test_a_scheduled_rloo_run_resumes_exactly(tmp_path):
    config, straight = _run(tmp_path / "a", "straight", 4)
    records = metrics(config.job_dir)
    # two optimizer steps per rollout: train/lr is the rate of the rollout's second step
    assert [r["train/lr"] for r in records] == pytest.approx(
        [lr_schedule.learning_rate(2 * i + 1, config.optimizer) for i in range(4)])
    assert records[0]["train/lr"] < records[1]["train/lr"] > records[3]["train/lr"] > 3e-4
    assert all(r["train/grad_norm"] > 0 for r in records)  # RLOO's advantages are not all 0
    # R3 on: the engine's routes replayed, the actor's old log-probs are the engine's
    assert all(r["train/rollout_logprob_abs_diff"] < 1e-5 for r in records)
    _run(tmp_path / "b", "first", 2)
    resumed_config, resumed = _run(tmp_path / "b", "resumed", 4)
    got = metrics(resumed_config.job_dir)
    assert [r["rollout"] for r in got] == [2, 3]
    for want, have in zip(records[2:], got, strict=True):
        for key in ("train/lr", "train/pg_loss", "reward/mean"):
            assert have[key] == pytest.approx(want[key], abs=1e-6), key
    assert max(float((straight[n] - resumed[n]).abs().max()) for n in straight) <= 1e-6
