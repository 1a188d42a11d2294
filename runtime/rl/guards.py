"""Checks the loop makes before a rollout's numbers can reach the weights or a checkpoint.

A non-finite advantage or log-prob turns every weight NaN at the next optimizer step, and a
checkpoint saved after it cannot be resumed from (sampling then fails with "probability
tensor contains either inf, nan or element < 0"). The loop calls `check_batch` before the
training steps and `check_train` after them, and so stops the job before anything is saved
or pushed to the engines; the message names the sample or the step.
"""

from __future__ import annotations

import math


class NonFiniteError(RuntimeError):
    """A rollout produced a NaN or infinite number; nothing of it was saved."""


def _finite_row(row) -> bool:
    # log-probs are <= 0 and bounded: their sum is infinite or NaN only when one of them is;
    # fsum raises ValueError on inf + -inf and OverflowError past the float range
    if not row:
        return True
    try:
        return math.isfinite(math.fsum(row))
    except OverflowError:
        return all(math.isfinite(value) for value in row)
    except ValueError:
        return False


def check_batch(rollout_id: int, advantages, log_probs: dict[str, list], describe) -> None:
    """Raises NonFiniteError naming the first sample whose advantage or log-probs (by name:
    "old", "ref", ...) are not finite; describe(index) says which sample that is."""
    for index, value in enumerate(advantages):
        if not math.isfinite(value):
            raise NonFiniteError(f"rollout {rollout_id}: the advantage of {describe(index)} is "
                                 f"{value}; the job stops before training on it")
    for name, rows in log_probs.items():
        for index, row in enumerate(rows or ()):
            if not _finite_row(row):
                raise NonFiniteError(f"rollout {rollout_id}: the {name} log-probs of "
                                     f"{describe(index)} are not finite; the job stops "
                                     "before training on them")


STEP_KEYS = ("pg_loss", "step/grad_norm", "ppo_kl", "entropy", "kl")


def check_train(rollout_id: int, step_stats: list[dict]) -> None:
    """Raises NonFiniteError when a training step's loss or gradient norm is not finite: the
    weights it stepped are not saved and not sent to the engines."""
    for step, stats in enumerate(step_stats):
        for key in STEP_KEYS:
            value = stats.get(key)
            if value is not None and not math.isfinite(float(value)):
                raise NonFiniteError(
                    f"rollout {rollout_id}, optimizer step {step}: {key} is {float(value)}; "
                    "the weights it produced are not saved or sent to the engines. Resume "
                    "from the last checkpoint, with a lower train.optimizer.lr or "
                    "train.optimizer.clip_grad")
