"""The one-step asynchronous loop (rollout.async = "one_step"): rollout k+1 is generated while
the actor trains on rollout k.

    push weights version v; generate rollout 0 with v (nothing to overlap yet)
    for each rollout k:
        start generating rollout k+1 (a thread: evaluate when due, generate, score) with the
            weights the engines hold (version v)
        train on rollout k (advantages, log-probs, optimizer steps)       at the same time
        wait for rollout k+1; checkpoint when due (rollout k+1 inside it); push version v+1

Rollout k+1's samples come from the weights before the training on rollout k, so each
sample lags the actor that trains on it by one version (rollout 0's by none); the losses
correct it with algorithm.tis, the actor's log-probs against the rollout's own. A push never
lands mid-generation: it waits for the generation at the boundary. A checkpoint holds the
generated rollout k+1 (in_flight_rollout.pkl), so a resumed run trains on the very samples
the uninterrupted one would have and repeats it. docs/runtime.md, "Asynchronous training".

It runs where the actor and the engines can compute at once: GPUs of their own
(train.colocate = false) or colocated and both resident; colocated runs that take turns are
refused (vime/check/asynchrony.py, V530).
"""

from __future__ import annotations

import pickle
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from runtime.core.interfaces import TrainBatch
from runtime.core.slices import JobConfig
from runtime.rl.loop import GRPOLoop, Timer, logprob_gap
from runtime.rl.sampling import Refill

# the generated next rollout a checkpoint carries: state.json's key, naming its file beside it
IN_FLIGHT = "in_flight"
IN_FLIGHT_FILE = "in_flight_rollout.pkl"


@dataclass
class Generated:
    """One rollout's generation phase: its groups, the weight version the engines generated
    with (checked before and after), the evaluation numbers, a rollout function's turns, the
    sampler's epoch after its prompts, its timer's seconds and its start and end (seconds
    since the run started)."""

    rollout_id: int
    refill: Refill
    version: int
    evaluation: dict[str, float] = field(default_factory=dict)
    turns: list[int] = field(default_factory=list)
    epoch: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    start: float = 0.0
    end: float = 0.0

    @property
    def versions(self) -> list[int]:
        """The weight version of each generated sample, kept and filtered."""
        every = self.refill.kept + self.refill.filtered
        return [self.version for g in every for _ in g.generations]


class Background:
    """fn() in a daemon thread: result() waits for it and returns or raises what it did.
    `started` is set once the thread runs, before fn is called."""

    def __init__(self, fn: Callable[[], Generated]):
        self.started = threading.Event()
        self._value: Generated | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True,
                                        name="vime-generate-ahead")
        self._thread.start()

    def _run(self, fn) -> None:
        self.started.set()
        try:
            self._value = fn()
        except BaseException as err:  # handed to the caller of result()
            self._error = err

    def result(self) -> Generated:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def overlap_seconds(first: tuple[float, float], second: tuple[float, float]) -> float:
    """The seconds two (start, end) intervals share."""
    return max(0.0, min(first[1], second[1]) - max(first[0], second[0]))


def importance_numbers(batch: TrainBatch, clip: float, clip_low: float) -> dict[str, float]:
    """Per trained token, the importance weight exp(actor log-prob - rollout log-prob) of the
    samples: its mean and the share outside [clip_low, clip], which TIS truncates."""
    masks = batch.loss_mask or [[1] * len(row) for row in batch.old_log_probs]
    weights = [torch.exp(torch.tensor(a, dtype=torch.float64) - torch.tensor(r, dtype=torch.float64))
               [torch.tensor(m, dtype=torch.bool)]
               for a, r, m in zip(batch.old_log_probs, batch.rollout_log_probs, masks, strict=True)]
    every = torch.cat(weights) if weights else torch.zeros(0, dtype=torch.float64)
    if not every.numel():
        return {"staleness/is_weight_mean": 1.0, "staleness/is_truncated_share": 0.0}
    outside = (every > clip) | (every < clip_low)
    return {"staleness/is_weight_mean": float(every.mean()),
            "staleness/is_truncated_share": float(outside.double().mean())}


class OneStepLoop(GRPOLoop):
    """GRPOLoop with the generation of rollout k+1 beside the training on rollout k, in the
    order of this module's docstring. Build and resume it as GRPOLoop."""

    def __init__(self, config: JobConfig, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.in_flight: Generated | None = None  # from a checkpoint: the next rollout, generated
        self.started = time.perf_counter()
        self.boundary = self.started  # when the last push ended

    # --------------------------------------------------------------------------- resume

    def load_state(self, state: dict, folder: Path) -> None:
        super().load_state(state, folder)
        if state.get(IN_FLIGHT):
            generated = pickle.loads((folder / state[IN_FLIGHT]).read_bytes())
            generated.refill = replace(generated.refill, user_filter=self.group_filter)
            self.in_flight = generated

    def checkpoint_state(self, rollout_id: int) -> dict:
        """The loop's state, and the file of rollout_id + 1 as generated (when it is not the
        last rollout): a resume trains on it as the uninterrupted run does."""
        state = super().checkpoint_state(rollout_id)
        if self.in_flight is not None:
            state[IN_FLIGHT] = IN_FLIGHT_FILE
        return state

    def checkpoint_files(self) -> dict[str, bytes]:
        """The generated next rollout (its samples, routed experts included), pickled; the
        checkpoint's file list checksums it as the ranks' files."""
        if self.in_flight is None:
            return {}
        saved = replace(self.in_flight, refill=replace(self.in_flight.refill, user_filter=None))
        return {IN_FLIGHT_FILE: pickle.dumps(saved, protocol=pickle.HIGHEST_PROTOCOL)}

    # ------------------------------------------------------------------------------ run

    def run(self) -> None:
        """Run the rollouts from next_rollout to rollout.num_rollout, each generated while
        the one before it trains; as GRPOLoop.run otherwise (metrics, checkpoints, the final
        evaluation).

        Raises:
            ValueError: the actor and the engines take turns on shared GPUs (V530).
            And what GRPOLoop.run raises.
        """
        config = self.config
        if config.takes_turns:
            raise ValueError("rollout.async = \"one_step\" needs the actor and the engines to "
                             "compute at once: train.colocate = false, or colocated and both "
                             "resident (train.offload = \"never\"); vime check says V530")
        if self.next_rollout >= config.num_rollout:
            self.log(f"vime: nothing to do: the checkpoint is at rollout {self.next_rollout}, "
                     f"rollout.num_rollout = {config.num_rollout}")
            return
        self.probe_rewards()
        self.started = time.perf_counter()
        self.train.push_weights(self.rollout, self.version or 1, config.weight_bucket_bytes)
        self.version = self.version or 1
        self.boundary = time.perf_counter()
        self.log(f"vime: weights version {self.version} on {self.rollout.size} engine(s) in "
                 f"{self.boundary - self.started:.2f} s; rollouts {self.next_rollout} to "
                 f"{config.num_rollout - 1}, each generated while the one before it trains "
                 "(rollout.async = \"one_step\")")
        current, self.in_flight = self.in_flight, None
        if current is None or current.rollout_id != self.next_rollout:
            current = self.generate(self.next_rollout)
        try:
            for rollout_id in range(self.next_rollout, config.num_rollout):
                numbers, current = self.one_step(rollout_id, current)
                self.metrics.log(rollout_id, numbers)
                self.logged_rollout = rollout_id
                self.commit_checkpoint()
                self.stop_without_signal(rollout_id)
        except BaseException:
            self.end_pending_save()
            raise
        if self.evaluator.due(config.num_rollout, config.num_rollout):
            self.metrics.log(config.num_rollout, {"weight_version": self.version,
                                                  **self.evaluator.run(self.rollout,
                                                                       config.num_rollout)})
        self.metrics.close()

    def generate(self, rollout_id: int) -> Generated:
        """Rollout `rollout_id`'s generation phase on the engines' current weights: the
        evaluation when due, then generate and score until its batch is complete.

        Raises:
            RuntimeError: the engines' weight version changed during the generation.
            And what GRPOLoop.sample_groups raises.
        """
        timer, start = Timer(), time.perf_counter()
        version = self.version
        evaluation = (self.evaluator.run(self.rollout, rollout_id)
                      if self.evaluator.due(rollout_id, self.config.num_rollout) else {})
        refill = self.sample_groups(rollout_id, timer)
        reported = set(self.rollout.weight_versions())
        if reported != {version}:
            raise RuntimeError(f"rollout {rollout_id} was generated with weights version "
                               f"{version}, but the engines report {sorted(reported)} after it")
        return Generated(rollout_id, refill, version, evaluation, list(self.turns),
                         self.sampler.epoch, dict(timer.seconds), start - self.started,
                         time.perf_counter() - self.started)

    def one_step(self, rollout_id: int, current: Generated
                 ) -> tuple[dict[str, float], Generated | None]:
        """Train on `current` (rollout rollout_id) while the next rollout generates; then
        save when due and push the next weight version. The rollout's metrics, and the next
        rollout generated (None after the last).

        Raises:
            RuntimeError: a sample lags more than rollout.max_staleness versions.
            And what GRPOLoop.one_rollout raises, and the next generation's errors.
        """
        config, timer = self.config, Timer()
        lag = self.version - current.version
        if lag > config.max_staleness:
            raise RuntimeError(f"rollout {rollout_id} was generated with weights version "
                               f"{current.version}, {lag} behind the actor's {self.version}: "
                               f"more than rollout.max_staleness = {config.max_staleness}")
        numbers: dict[str, float] = {"weight_version": current.version, **current.evaluation}
        numbers.update(self._sampling_report(rollout_id, current.refill))
        ahead = (Background(lambda: self.generate(rollout_id + 1))
                 if rollout_id + 1 < config.num_rollout else None)
        if ahead is not None:
            ahead.started.wait()  # the generation starts before the training does
        train_start = time.perf_counter() - self.started
        trained = self.train_on(rollout_id, current.refill, timer)
        train_end = time.perf_counter() - self.started
        staleness = self._staleness(current, trained.batch)
        with timer.phase("wait_generate"):
            following = ahead.result() if ahead is not None else None
        # a background save begun at an earlier step is committed here, as the synchronous
        # loop commits it at its generation's end, not left until the next save
        numbers.update(self.finish_background_save(timer))
        self.in_flight = following
        self._save_when_due(rollout_id, timer)
        self.in_flight = None
        numbers.update(self._push(timer))
        boundary, self.boundary = self.boundary, time.perf_counter()
        self.turns = current.turns
        timer.seconds = {**current.seconds, **{k: v + current.seconds.get(k, 0.0)
                                               for k, v in timer.seconds.items()}}
        numbers.update(self._numbers(current.refill, trained.scored, trained.step_stats,
                                     trained.batch, timer))
        numbers["data/epoch"] = current.epoch
        numbers.update(staleness)
        numbers.update({
            "phase/generate_start": current.start, "phase/generate_end": current.end,
            "phase/train_start": train_start, "phase/train_end": train_end,
            "time/step": self.boundary - boundary,
            # training of this rollout hidden behind the generation of the next
            "async/train_hidden_share": (overlap_seconds(
                (train_start, train_end), (following.start, following.end))
                / max(train_end - train_start, 1e-9) if following is not None else 0.0)})
        return numbers, following

    def _staleness(self, current: Generated, batch: TrainBatch) -> dict[str, float]:
        """Before the push: the versions each sample lags the actor that trains on it, the
        engine/actor log-prob gap across them, and the importance weights TIS truncates."""
        behind = [self.version - v for v in current.versions]
        return {"staleness/versions_behind": statistics.fmean(behind),
                "staleness/versions_behind_max": max(behind),
                "async/actor_version": self.version,
                **{k.replace("rollout/", "staleness/"): v for k, v in logprob_gap(
                    batch.old_log_probs, batch.rollout_log_probs, batch.loss_mask).items()},
                **importance_numbers(batch, self.config.loss.tis_clip,
                                     self.config.loss.tis_clip_low)}

    def _logprob_gap(self, rollout_id: int, batch: TrainBatch) -> dict[str, float]:
        """The engine's log-probs against the actor's; one version apart after the first
        rollout, so the gap measures the policy's move too and is not taken as a fault."""
        return logprob_gap(batch.old_log_probs, batch.rollout_log_probs, batch.loss_mask)


def loop_class(config: JobConfig) -> type[GRPOLoop]:
    """The loop of rollout.async: GRPOLoop ("off") or OneStepLoop ("one_step").

    Raises:
        ValueError: an async mode this runtime does not run.
    """
    loops = {"off": GRPOLoop, "one_step": OneStepLoop}
    if config.async_mode not in loops:
        raise ValueError(f"rollout.async = {config.async_mode!r}: this runtime runs "
                         f"{' or '.join(map(repr, loops))}")
    return loops[config.async_mode]
