"""The GRPO loop: generate, score, compute advantages and log-probs, train, sync weights,
log, checkpoint; rollout after rollout.

It talks to the actor and the engines through two groups (runtime/workers/groups.py: Ray actors on
the plan's GPUs, or in-process for tests) and never to a backend directly. One rollout,
colocated (the engines and the actor share the GPUs and take turns):

    evaluate [[eval.datasets]] when due (engines awake; runtime/rl/evaluation.py)
    generate (engines awake, actor offloaded); with dynamic sampling, again until
        batch_size groups of differing rewards are kept (runtime/rl/sampling.py)
    engines sleep (level 2: weights dropped)      actor onload
    rewards (the overlong penalty), advantages (algorithm.advantage_estimator; overlong
        responses masked)
    old log-probs (actor), reference log-probs (when kl_loss_coef > 0)
    steps_per_rollout optimizer steps of global_batch_size samples
    checkpoint (every checkpoint.save_interval rollouts, and after the last)
    HF model folder (every checkpoint.save_hf_interval rollouts, and after the last)
    actor offload                                 engines wake weights
    weights version v+1 pushed to every engine    engines wake KV cache

After the last rollout the final weights are evaluated once more (eval.at_end). Disaggregated
runs skip the sleep/offload lines, and so do colocated ones whose actor and engines stay
resident (plan.json's colocation.mode, from train.offload). Every number of a rollout is
derived from (experiment.seed, rollout index, sample index) and the checkpointed state, so a
resumed run repeats exactly what the uninterrupted one would have done. With rollout.async =
"one_step", runtime/rl/asynchrony.py generates the next rollout during the train phase.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from runtime.core import algorithm
from runtime.core.interfaces import GenerationRequest, SamplingParams, TrainBatch
from runtime.core.slices import JobConfig
from runtime.rl import custom_rollout, guards, rewards
from runtime.rl.checkpoint import Checkpoints, hf_due, record_of
from runtime.rl.data import PromptSampler, request_seed
from runtime.rl.evaluation import Evaluator
from runtime.rl.metrics import MetricsLogger
from runtime.rl.sampling import (
    Group,
    NoSignalError,
    Refill,
    load_filter,
    mask_overlong,
    overlong_penalty,
    stops_without_signal,
)

# mean |actor - engine| log-prob per response token on the same weights above which the loop
# says the engine is not generating with them (bf16 engines and actors differ by ~0.01-0.05)
MAX_LOGPROB_GAP = 0.5


def logprob_gap(actor: list[list[float]], engine: list[list[float]],
                loss_mask: list[list[int]] | None = None) -> dict[str, float]:
    """The gap between the actor's log-probs of the sampled tokens (on the weights the engine
    generated with) and the engine's own: mean and max of |difference| per response token
    the policy wrote (loss_mask's ones: a tool's tokens have no engine log-prob)."""
    masks = loss_mask or [[1] * len(row) for row in actor]
    diffs = [abs(a - e) for row_a, row_e, row_m in zip(actor, engine, masks, strict=True)
             for a, e, m in zip(row_a, row_e, row_m, strict=True) if m]
    if not diffs:
        return {"rollout/logprob_abs_diff": 0.0, "rollout/logprob_abs_diff_max": 0.0}
    return {"rollout/logprob_abs_diff": statistics.fmean(diffs),
            "rollout/logprob_abs_diff_max": max(diffs)}


@dataclass(frozen=True)
class Scored:
    """A rollout's kept samples after the reward: per sample in batch order, its request,
    generation, prompt, score and advantage (loss_mask: per response token, rollout functions
    only); extras: the reward's other numbers over every generated group."""

    groups: list[Group]
    requests: list[GenerationRequest]
    generations: list
    prompts: list
    scores: list[float]
    extras: dict[str, list[float]]
    loss_mask: list[list[int]] | None
    advantages: list[float]


@dataclass(frozen=True)
class Trained:
    """A rollout after its training phase: its samples, the batch trained on (with the
    actor's log-probs), each optimizer step's numbers and the engine/actor log-prob gap."""

    scored: Scored
    batch: TrainBatch
    step_stats: list[dict]
    gap: dict[str, float]


@dataclass
class Timer:
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


class GRPOLoop:
    """Drive a job's rollouts: generate with the rollout group, score, compute advantages
    and log-probs, train the training group, push weights, log and checkpoint, in the order
    of this module's docstring.

    It holds the loop's state (next rollout, weight version, the sampler's position), which
    restore() reads from a checkpoint; the groups hold the models. Build it with the groups
    (runtime/workers/groups.py) and the job's tokenizer, reward and checkpoint folders
    (runtime/node/driver.py's run and job_loop), then call restore() and run().
    """

    def __init__(self, config: JobConfig, train, rollout, sampler: PromptSampler, tokenizer,
                 reward_fn: Callable, metrics: MetricsLogger, checkpoints: Checkpoints,
                 log: Callable[[str], None] = print, rollout_fn: Callable | None = None,
                 load_reward: Callable[[str], Callable] = rewards.load,
                 rewards_probed: bool = False):
        self.config, self.train, self.rollout = config, train, rollout
        # the builder asked the reward servers already (runtime/node/driver.py's run, before
        # Ray): run() asks them no second time
        self.rewards_probed = rewards_probed
        self.sampler, self.tokenizer, self.reward_fn = sampler, tokenizer, reward_fn
        self.metrics, self.checkpoints, self.log = metrics, checkpoints, log
        self.params = SamplingParams(
            temperature=config.temperature, top_p=config.top_p,
            max_new_tokens=config.max_response_len,
            stop_token_ids=tuple(sorted(_stop_ids(tokenizer))),
            return_routed_experts=bool(config.train["routing_replay"]))
        self.evaluator = Evaluator(config.evaluation, config.seed, tokenizer,
                                   self.params.stop_token_ids, log=log,
                                   reward_timeout_s=config.reward_timeout_s,
                                   load_reward=load_reward)
        policy = config.sampling
        self.group_filter = (load_filter(policy.dynamic_sampling_filter)
                             if policy.dynamic_sampling and policy.dynamic_sampling_filter
                             else None)
        self.version = 0
        self.next_rollout = 0
        self.score = rewards.caller(reward_fn, config.reward_timeout_s, log)
        # rollout.function: multi-turn samples from the user's function (custom_rollout.py)
        self.custom = None if rollout_fn is None else custom_rollout.CustomRollout(
            rollout_fn, self.rollout.generate, tokenizer, self.params, config.max_turns,
            config.sample_tokens, config.function_timeout_s,
            vocab_size=config.model.arch.get("vocab_size"))
        self.turns: list[int] = []  # a rollout function's turns per sample, this rollout
        # rollouts in a row, up to the last, whose dynamic sampling kept no group
        self.empty_streak = 0
        self.last_advice = ""  # what dynamic sampling's last rollout suggests to try
        self.pending_save = None  # prepared in one_rollout, committed after its metrics line
        # checkpoint.async_save: begun in one_rollout, written by the ranks in the background,
        # finished and committed in the next rollout, once its generation is done
        self.writing_save = None
        self.logged_rollout = -1  # the last rollout whose metrics line is written

    # --------------------------------------------------------------------------- resume

    def restore(self) -> bool:
        """Load the newest checkpoint of checkpoint's load folder whose files match their
        checksums, if any: the training group's weights and optimizer, the sampler's
        position, the next rollout and the weight version. Return whether one was found.

        Raises:
            CheckpointError: the newest is corrupt and checkpoint.on_corrupt is "stop".
        """
        found = self.checkpoints.resume_point(self.config.on_corrupt)
        if found is None:
            return False
        state = self.checkpoints.read_state(found)
        self.train.load(found / "train")
        self.load_state(state, found)
        self.log(f"vime: resumed from {found} (next rollout {self.next_rollout}, weight "
                 f"version {self.version})")
        return True

    def load_state(self, state: dict, folder: Path) -> None:
        """The loop's part of a checkpoint: its state.json (checkpoint_state wrote it) and
        files (checkpoint_files) in `folder`."""
        self.sampler.load_state_dict(state["data"])
        self.next_rollout, self.version = state["next_rollout"], state["weight_version"]
        # checkpoints from before the streak was kept have none: counted from 0
        self.empty_streak = int(state.get("empty_streak", 0))

    def checkpoint_files(self) -> dict[str, bytes]:
        """The loop's own files in a checkpoint, name -> content, beside state.json (none
        here)."""
        return {}

    def checkpoint_state(self, rollout_id: int) -> dict:
        """What state.json holds of the loop after rollout `rollout_id`, before its push."""
        return {"next_rollout": rollout_id + 1, "weight_version": self.version + 1,
                "data": self.sampler.state_dict(), "empty_streak": self.empty_streak}

    # ------------------------------------------------------------------------------ run

    def run(self) -> None:
        """Run the rollouts from next_rollout to rollout.num_rollout: push the current
        weights to the engines, then one_rollout, its metrics line and its checkpoint for
        each, and the final evaluation when due; close the metrics.

        Raises:
            NonFiniteError: an advantage, log-prob or training number is NaN or infinite
                (runtime/rl/guards.py).
            RewardError: the reward function fails or returns no number, or a reward server
                does not answer the probe before the first rollout (runtime/rl/rewards.py).
            RolloutFunctionError: rollout.function fails (runtime/rl/custom_rollout.py).
            EngineFailed: an engine died more often than max_restarts allows
                (runtime/workers/supervisor.py).
            CheckpointError: a checkpoint cannot be written (runtime/rl/checkpoint.py).
            NoSignalError: dynamic sampling kept no group in
                rollout.dynamic_sampling_max_empty_rollouts rollouts in a row (runtime/rl/sampling.py), raised after the last one's metrics line and
                checkpoint.
        """
        config = self.config
        if self.next_rollout >= config.num_rollout:
            self.log(f"vime: nothing to do: the checkpoint is at rollout {self.next_rollout}, "
                     f"rollout.num_rollout = {config.num_rollout}")
            return
        self.probe_rewards()
        start = time.perf_counter()
        if config.takes_turns:
            self.train.offload()
        self.train.push_weights(self.rollout, self.version or 1,
                              config.weight_bucket_bytes)
        self.version = self.version or 1
        self.log(f"vime: weights version {self.version} on {self.rollout.size} engine(s) in "
                 f"{time.perf_counter() - start:.2f} s; rollouts {self.next_rollout} to "
                 f"{config.num_rollout - 1}")
        try:
            for rollout_id in range(self.next_rollout, config.num_rollout):
                self.metrics.log(rollout_id, self.one_rollout(rollout_id))
                self.logged_rollout = rollout_id
                self.commit_checkpoint()
                self.stop_without_signal(rollout_id)
        except BaseException:
            self.end_pending_save()
            raise
        if self.evaluator.due(config.num_rollout, config.num_rollout):
            # the final weights, logged as the rollout that would generate with them
            self.metrics.log(config.num_rollout, {"weight_version": self.version,
                                                  **self.evaluator.run(self.rollout,
                                                                       config.num_rollout)})
        self.metrics.close()

    def probe_rewards(self) -> None:
        """Ask each reward server (rollout.reward's, [[eval.datasets]]' rewards) for an
        answer once, before anything is generated; nothing when the builder asked them
        (rewards_probed).

        Raises:
            RewardError: a server refuses, cannot be reached or does not answer in time.
        """
        if self.rewards_probed:
            return
        self.rewards_probed = True
        probed = set()
        for scorer in (self.score, *(s.reward_fn for s in self.evaluator.sets)):
            if scorer.name not in probed:
                probed.add(scorer.name)
                scorer.probe()

    def stop_without_signal(self, rollout_id: int) -> None:
        """Raises NoSignalError when dynamic sampling has kept no group in the last
        rollout.dynamic_sampling_max_empty_rollouts rollouts (never when it is 0); the streak
        is checkpointed, so a resumed run counts on as the uninterrupted one."""
        config = self.config
        if not stops_without_signal(self.empty_streak, config.sampling):
            return
        raise NoSignalError(
            f"rollouts {rollout_id - self.empty_streak + 1} to {rollout_id}: dynamic sampling "
            f"kept no group in {self.empty_streak} rollouts in a row "
            f"(rollout.dynamic_sampling_max_attempts = {config.sampling.max_attempts} "
            f"attempt(s) of {config.sampling.over_sampling_batch_size} prompt(s) each), so "
            f"none of them trained on a group of differing rewards; the run stops "
            f"(rollout.dynamic_sampling_max_empty_rollouts = "
            f"{config.sampling.max_empty_rollouts}; 0 never stops). {self.last_advice}")

    def commit_checkpoint(self) -> None:
        """The rollout's checkpoint made visible, after its metrics line is written: a stop
        between the two repeats the rollout on resume instead of losing its line."""
        if self.pending_save is not None:
            self.checkpoints.commit(self.pending_save)
            self.pending_save = None

    def end_pending_save(self) -> None:
        """A stop (SIGTERM, Ctrl-C, an error) with a rollout's save prepared: it is finished
        when the rollout's metrics line is written, else removed (checkpoints.end); what
        went wrong doing so is logged, not raised over the stop."""
        writing, self.writing_save = self.writing_save, None
        try:
            if writing is not None and writing.rollout_id == self.logged_rollout:
                self.pending_save, _ = self.checkpoints.finish(writing, self.train)
            elif writing is not None:  # its line is missing: a resume repeats the rollout
                self.checkpoints.abandon(writing, self.train)
        except Exception as err:
            self.log(f"vime: ending the background save: {type(err).__name__}: {err}")
        pending, self.pending_save = self.pending_save, None
        try:
            self.checkpoints.end(pending, finish=pending is not None
                                 and pending.rollout_id == self.logged_rollout)
        except Exception as err:
            self.log(f"vime: ending the save in progress: {type(err).__name__}: {err}")

    def finish_background_save(self, timer: Timer) -> dict[str, float]:
        """The previous rollout's background save waited for, checked and committed (its
        metrics line is written); its writing's seconds, spent beside the loop, as
        time/save_background (the wait itself is the timer's save_wait). Nothing when none.

        Raises:
            CheckpointError: the write failed; the previous checkpoint stays `latest`.
        """
        if self.writing_save is None:
            return {}
        writing, self.writing_save = self.writing_save, None
        with timer.phase("save_wait"):
            self.pending_save, seconds = self.checkpoints.finish(writing, self.train)
            self.commit_checkpoint()
        return {"time/save_background": seconds}

    def describe_sample(self, rollout_id: int, prompt, index: int) -> rewards.Sample:
        """Sample `index` of the rollout, generated from `prompt`, in the words of messages."""
        return rewards.Sample(rollout_id, index, prompt.index + 1,
                              str(self.config.data.prompt_data))

    # --------------------------------------------------------------------------- sample

    def score_group(self, prompt, requests, generations,
                    scored: list[tuple[float, dict]]) -> Group:
        """One prompt's samples with their (reward, extras): the overlong penalty added when
        rollout.overlong = "penalty"."""
        policy, group = self.config.sampling, Group(prompt, requests, generations, [], [])
        for generation, (value, extra) in zip(generations, scored, strict=True):
            group.rewards.append(value)
            if policy.overlong == "penalty":
                value += overlong_penalty(len(generation.token_ids), self.config.sample_tokens,
                                          policy.overlong_buffer_len,
                                          policy.overlong_penalty_factor)
            group.scores.append(value)
            for key, number in extra.items():
                group.extras.setdefault(key, []).append(number)
        return group

    def score_samples(self, rollout_id: int, first_sample: int, prompts, generations,
                      returned: list) -> list[tuple[float, dict]]:
        """(reward, extras) per sample of an attempt (the rollout's `first_sample` onwards):
        what a rollout function returned, checked, else the spec's reward (one batch for a
        reward server)."""
        n = self.config.samples_per_prompt
        scored = {i: rewards.score(r) for i, r in enumerate(returned) if r is not None}
        to_score = [i for i in range(len(generations)) if i not in scored]
        calls = []
        for index in to_score:
            prompt = prompts[index // n]
            call = {"prompt": prompt.text, "label": prompt.label, "response":
                    self.tokenizer.decode(generations[index].token_ids, skip_special_tokens=True)}
            if self.config.data.metadata_keys:
                call["metadata"] = prompt.metadata
            calls.append(call)
        samples = [self.describe_sample(rollout_id, prompts[i // n], first_sample + i)
                   for i in to_score]
        scored.update(zip(to_score, self.score.score_many(samples, calls), strict=True))
        return [scored[i] for i in range(len(generations))]

    def sample_groups(self, rollout_id: int, timer: Timer) -> Refill:
        """Generate and score groups until the rollout's batch is complete (one attempt
        without dynamic sampling). Seeds count the samples of every attempt, so the kept and
        the filtered groups replay exactly after a resume. With a rollout function, its
        samples (custom_rollout.py) and self.turns, their turns."""
        n = self.config.samples_per_prompt
        refill = Refill(self.config.sampling, self.config.prompts_per_rollout, self.group_filter)
        self.turns = []
        while (size := refill.next_size()) > 0:
            prompts = self.sampler.next_batch(size)
            first = refill.prompts_drawn
            requests = [GenerationRequest(p.token_ids,
                                          request_seed(self.config.seed, rollout_id,
                                                       (first + i) * n + j))
                        for i, p in enumerate(prompts) for j in range(n)]
            returned: list = [None] * len(requests)  # rewards a rollout function returned
            with timer.phase("generate"):
                if self.custom is None:
                    generations = self.rollout.generate(requests, self.params)
                else:
                    described = [self.describe_sample(rollout_id, prompts[i // n],
                                                      first * n + i).describe()
                                 for i in range(len(requests))]
                    custom = self.custom.run(prompts, [r.seed for r in requests],
                                             described.__getitem__)
                    generations, returned = custom.generations, custom.returned
                    self.turns += custom.turns
            with timer.phase("reward"):
                scored = self.score_samples(rollout_id, first * n, prompts, generations,
                                            returned)
                refill.add([self.score_group(p, requests[i * n:(i + 1) * n],
                                             generations[i * n:(i + 1) * n],
                                             scored[i * n:(i + 1) * n])
                            for i, p in enumerate(prompts)])
        return refill

    # -------------------------------------------------------------------------- rollout

    def one_rollout(self, rollout_id: int) -> dict[str, float]:
        """Run rollout `rollout_id` (evaluate when due, generate, train, save when due, push
        weights version + 1) and return its metrics; its checkpoint is prepared here and
        made visible by commit_checkpoint() after the metrics line.

        Raises:
            NonFiniteError: an advantage, log-prob or training number is NaN or infinite
                (runtime/rl/guards.py).
            RewardError: the reward function fails or returns no number (runtime/rl/rewards.py).
            RolloutFunctionError: rollout.function fails (runtime/rl/custom_rollout.py).
            EngineFailed: an engine died more often than max_restarts allows
                (runtime/workers/supervisor.py).
        """
        config, timer = self.config, Timer()
        numbers: dict[str, float] = {"weight_version": self.version}
        if self.evaluator.due(rollout_id, config.num_rollout):
            numbers.update(self.evaluator.run(self.rollout, rollout_id))
        refill = self.sample_groups(rollout_id, timer)
        numbers.update(self.finish_background_save(timer))
        numbers.update(self._sampling_report(rollout_id, refill))
        if config.takes_turns:
            with timer.phase("offload"):
                self.rollout.sleep(2)
                self.train.onload()
            numbers["memory/engine_bytes_while_training"] = self.rollout.resident_bytes()
        trained = self.train_on(rollout_id, refill, timer)
        numbers.update(trained.gap)
        self._save_when_due(rollout_id, timer)
        numbers.update(self._push(timer))
        numbers.update(self._numbers(refill, trained.scored, trained.step_stats, trained.batch,
                                     timer))
        return numbers

    def train_on(self, rollout_id: int, refill: Refill, timer: Timer) -> Trained:
        """The training phase of a generated rollout: advantages, the actor's (and the
        reference's) log-probs, steps_per_rollout optimizer steps, each number checked.

        Raises:
            NonFiniteError: an advantage, log-prob or training number is NaN or infinite.
            RolloutFunctionError: an optimizer step has no trained token.
        """
        with timer.phase("reward"):
            scored = self._score(refill)
        batch = self._batch(scored)
        self._check_trained_tokens(rollout_id, batch)
        with timer.phase("log_probs"):
            self._old_log_probs(rollout_id, batch, scored)
        gap = self._logprob_gap(rollout_id, batch)
        with timer.phase("train"):
            step_stats = self._train_steps(batch)
        guards.check_train(rollout_id, step_stats)
        return Trained(scored, batch, step_stats, gap)

    def _sampling_report(self, rollout_id: int, refill: Refill) -> dict[str, float]:
        """Logs a rollout whose dynamic sampling kept fewer than batch_size groups (loudly
        when none) and counts the rollouts in a row that kept none."""
        if not self.config.sampling.dynamic_sampling:
            return {}
        line = refill.report(rollout_id)
        if line:
            self.log(line)
        self.empty_streak = 0 if refill.kept else self.empty_streak + 1
        self.last_advice = refill.advice()
        return {"rollout/empty_streak": self.empty_streak}

    def _score(self, refill: Refill) -> Scored:
        """The kept groups' samples in order, their advantages, loss masks (rollout functions)
        and the reward function's extra numbers over every generated group."""
        config = self.config
        groups = refill.batch()
        generations = [x for g in groups for x in g.generations]
        scores = [s for g in groups for s in g.scores]
        extras: dict[str, list[float]] = {}
        for group in refill.kept + refill.filtered:
            for key, values in group.extras.items():
                extras.setdefault(key, []).extend(values)
        loss_mask = ([g.loss_mask or [1] * len(g.token_ids) for g in generations]
                     if self.custom is not None else None)
        advantages = algorithm.advantages(
            torch.tensor(scores), config.samples_per_prompt, config.loss.advantage_estimator,
            config.std_normalization,
            [sum(m) for m in loss_mask] if loss_mask
            else [len(g.token_ids) for g in generations]).tolist()
        if config.sampling.overlong == "mask":
            advantages = mask_overlong(advantages, generations)
        return Scored(groups=groups, requests=[r for g in groups for r in g.requests],
                      generations=generations,
                      prompts=[g.prompt for g in groups for _ in g.generations],
                      scores=scores, extras=extras, loss_mask=loss_mask, advantages=advantages)

    def _batch(self, scored: Scored) -> TrainBatch:
        return TrainBatch(
            tokens=[list(r.prompt_ids) + g.token_ids
                    for r, g in zip(scored.requests, scored.generations, strict=True)],
            prompt_lens=[len(r.prompt_ids) for r in scored.requests],
            advantages=scored.advantages,
            rollout_log_probs=[g.log_probs for g in scored.generations],
            routed_experts=([g.routed_experts for g in scored.generations]
                            if self.params.return_routed_experts else None),
            loss_mask=scored.loss_mask)

    def _check_trained_tokens(self, rollout_id: int, batch: TrainBatch) -> None:
        """A rollout function's samples whose loss mask is all 0 train nothing (their rewards
        still count in their groups): logged with their count. An optimizer step of such
        samples alone has no token to average the loss over (NaN, or REINFORCE++'s
        whitening over no token).

        Raises:
            RolloutFunctionError: every sample of an optimizer step has loss mask all 0.
        """
        if batch.loss_mask is None:
            return
        trained = batch.trained_tokens()
        untrained = sum(1 for tokens in trained if not tokens)
        if untrained:
            self.log(f"vime: rollout {rollout_id}: {untrained} of {len(trained)} samples of "
                     f"rollout function {self.custom.name} have a loss mask of 0s only: no "
                     "token of theirs is trained (rollout/untrained_samples)")
        size = self.config.global_batch_size
        for step in range(self.config.steps_per_rollout):
            if not any(trained[step * size:(step + 1) * size]):
                raise custom_rollout.RolloutFunctionError(
                    f"rollout {rollout_id}, optimizer step {step}: none of its {size} samples "
                    f"(rollout function {self.custom.name}) has a trained token: every "
                    "ctx.loss_mask is 0s only, so there is nothing to train on; a sample's "
                    "tokens from ctx.generate are 1 unless the function sets them 0. Nothing of "
                    "this rollout was trained or saved")

    def _old_log_probs(self, rollout_id: int, batch: TrainBatch, scored: Scored) -> None:
        """The actor's (and the reference's) log-probs into `batch`, checked finite."""
        batch.old_log_probs = self.train.log_probs(batch, "actor")
        if self.config.needs_ref:
            batch.ref_log_probs = self.train.log_probs(batch, "ref")
        guards.check_batch(
            rollout_id, batch.advantages,
            {"actor": batch.old_log_probs, "reference": batch.ref_log_probs},
            lambda i: self.describe_sample(rollout_id, scored.prompts[i], i).describe())

    def _logprob_gap(self, rollout_id: int, batch: TrainBatch) -> dict[str, float]:
        """The engine's log-probs against the actor's on the same weights; a gap past
        MAX_LOGPROB_GAP is logged, the run goes on."""
        gap = logprob_gap(batch.old_log_probs, batch.rollout_log_probs, batch.loss_mask)
        if gap["rollout/logprob_abs_diff"] > MAX_LOGPROB_GAP:
            self.log(f"vime: rollout {rollout_id}: the engine's log-probs differ from the "
                     f"actor's by {gap['rollout/logprob_abs_diff']:.3f} per token on the "
                     f"same weights (version {self.version}); more than {MAX_LOGPROB_GAP} "
                     "means the engine does not generate with the weights it was sent")
        return gap

    def _train_steps(self, batch: TrainBatch) -> list[dict]:
        """steps_per_rollout optimizer steps of global_batch_size samples, in order."""
        size = self.config.global_batch_size
        stats = []
        for step in range(self.config.steps_per_rollout):
            step_batch = batch.select(range(step * size, (step + 1) * size))
            step_batch.step_response_tokens = sum(step_batch.trained_tokens())
            step_batch.step_samples = len(step_batch)
            stats.append(self.train.train_step(step_batch))
        return stats

    def _save_when_due(self, rollout_id: int, timer: Timer) -> None:
        config = self.config
        if (rollout_id + 1) % config.save_interval == 0 or rollout_id + 1 == config.num_rollout:
            state = self.checkpoint_state(rollout_id)
            # one write at a time: a loop that has not finished the previous one does it here
            self.finish_background_save(timer)
            with timer.phase("save"):
                # the last rollout's save has nothing to overlap: written before the run ends
                if config.async_save and rollout_id + 1 < config.num_rollout:
                    self.writing_save = self.checkpoints.begin(
                        rollout_id, self.train, state, record=record_of(config),
                        files=self.checkpoint_files())
                else:
                    self.pending_save = self.checkpoints.prepare(
                        rollout_id, self.train, state, record=record_of(config),
                        files=self.checkpoint_files())
        if hf_due(config, rollout_id):
            with timer.phase("save_hf"):
                self.checkpoints.save_hf(rollout_id, self.train, config.model.hf_checkpoint,
                                         self.tokenizer)

    def _push(self, timer: Timer) -> dict[str, float]:
        """Weights version + 1 to the engines (the actor offloaded first when they take
        turns); the sync's bytes and export seconds, and the offload's numbers."""
        config, numbers = self.config, {}
        if config.takes_turns:
            with timer.phase("offload"):
                self.train.offload()
                numbers["memory/actor_bytes_while_generating"] = self.train.resident_bytes()
                numbers.update(self.train.moves)
                self.rollout.wake(["weights"])
        with timer.phase("weight_sync"):
            self.version += 1
            sent = self.train.push_weights(self.rollout, self.version, config.weight_bucket_bytes)
        numbers["weight_sync/bytes"] = sent
        # the part of the sync spent exporting
        numbers["weight_sync/export_s"] = self.train.export_seconds
        if config.takes_turns:
            with timer.phase("offload"):
                self.rollout.wake(["kv_cache"])
        return numbers

    def _numbers(self, refill: Refill, scored: Scored, step_stats: list[dict],
                 batch: TrainBatch, timer: Timer) -> dict[str, float]:
        """The rollout's metrics: rewards, lengths, sampling, training, throughput, times."""
        config = self.config
        every = refill.kept + refill.filtered  # all generated groups, for the reward curve
        generations = scored.generations
        response_lens = [len(g.token_ids) for g in generations]
        generated = [r for g in every for r in g.rewards]
        numbers = {
            # every generated sample, kept or filtered: the policy's reward, comparable with
            # and without dynamic sampling
            "reward/mean": statistics.fmean(generated),
            "reward/std": statistics.pstdev(generated),
            "reward/trained_mean": statistics.fmean(scored.scores),
            **{f"reward/{k}": statistics.fmean(v) for k, v in scored.extras.items()},
            "response_len/mean": statistics.fmean(response_lens),
            "response_len/max": max(response_lens),
            "response_len/truncated": statistics.fmean(
                g.finish_reason == "length" for g in generations),
            "samples": len(generations), "data/epoch": self.sampler.epoch,
        }
        if self.custom is not None:
            # the share of after-prompt tokens that came from tools (context, not trained)
            numbers["rollout/masked_token_share"] = 1.0 - sum(map(sum, scored.loss_mask)) / max(
                sum(response_lens), 1)
            numbers["rollout/turns_mean"] = statistics.fmean(self.turns)
            numbers["rollout/untrained_samples"] = sum(1 for m in scored.loss_mask if not any(m))
        numbers.update(self.rollout.rollout_numbers())
        numbers.update(refill.numbers())
        if config.sampling.overlong == "penalty":
            numbers["reward/overlong_penalty"] = statistics.fmean(
                s - r for g in scored.groups for s, r in zip(g.scores, g.rewards, strict=True))
        numbers.update(_train_numbers(step_stats, config.needs_ref))
        generated_tokens = sum(len(x.token_ids) for g in every for x in g.generations)
        trained_tokens = sum(len(t) for t in
                             batch.tokens[:config.steps_per_rollout * config.global_batch_size])
        numbers["throughput/generate_tokens_per_s"] = generated_tokens / max(
            timer.seconds["generate"], 1e-9)
        numbers["throughput/train_tokens_per_s"] = trained_tokens / max(timer.seconds["train"],
                                                                        1e-9)
        numbers.update({f"time/{k}": v for k, v in timer.seconds.items()})
        numbers["time/rollout"] = sum(timer.seconds.values())
        return numbers


def _train_numbers(step_stats: list[dict], has_ref: bool) -> dict[str, float]:
    tokens = sum(s["response_tokens"] for s in step_stats) or 1.0
    total = {key: sum(s.get(key, 0.0) for s in step_stats) for key in step_stats[0]}
    numbers = {
        "train/pg_loss": total["pg_loss"] / tokens,
        "train/clip_fraction": total["clipped_tokens"] / tokens,
        "train/ppo_kl": total["ppo_kl"] / tokens,
        "train/entropy": total["entropy"] / tokens,
        "train/grad_norm": statistics.fmean(s["step/grad_norm"] for s in step_stats),
        "train/lr": step_stats[-1]["step/lr"],
        "train/rollout_logprob_abs_diff": total.get("rollout_abs_diff", 0.0) / tokens,
    }
    if total.get("routes_replayed"):
        # replayed experts (vLLM's routes) that the actor's routers pick too, on the weights
        # the engine generated with (runtime/backends/megatron_train.py)
        numbers["train/replayed_route_match"] = total["routes_matched"] / total["routes_replayed"]
    if has_ref:
        numbers["train/kl"] = total.get("kl", 0.0) / tokens
    if total.get("tis_weight") or total.get("tis_truncated_tokens"):
        numbers["train/tis_weight"] = total["tis_weight"] / tokens
        numbers["train/tis_truncated_fraction"] = total["tis_truncated_tokens"] / tokens
    if total.get("tis_samples"):  # tis_level sequence or geometric: one weight per sample
        numbers["train/tis_truncated_sample_fraction"] = (total["tis_truncated_samples"]
                                                          / total["tis_samples"])
    return numbers


def _stop_ids(tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for extra in ("<|im_end|>", "<|endoftext|>"):
        token = tokenizer.convert_tokens_to_ids(extra)
        if isinstance(token, int) and token != tokenizer.unk_token_id and token >= 0:
            ids.add(token)
    return ids
