"""The GRPO loop: generate, score, compute advantages and log-probs, train, sync weights,
log, checkpoint; rollout after rollout.

It talks to the actor and the engines through two groups (runtime/workers/actors.py: Ray actors on
the plan's GPUs, or in-process for tests) and never to a backend directly. One rollout,
colocated (the engines and the actor share the GPUs and take turns):

    generate (engines awake, actor offloaded)
    engines sleep (level 2: weights dropped)      actor onload
    rewards, advantages (algorithm.advantage_estimator)
    old log-probs (actor), reference log-probs (when kl_loss_coef > 0)
    steps_per_rollout optimizer steps of global_batch_size samples
    checkpoint (every checkpoint.save_interval rollouts, and after the last)
    HF model folder (every checkpoint.save_hf_interval rollouts, and after the last)
    actor offload                                 engines wake weights
    weights version v+1 pushed to every engine    engines wake KV cache

Disaggregated runs skip the sleep/offload lines. Every number of a rollout is derived from
(experiment.seed, rollout index, sample index) and the checkpointed state, so a resumed run
repeats exactly what the uninterrupted one would have done.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from runtime.core import algorithm
from runtime.core.interfaces import GenerationRequest, SamplingParams, TrainBatch
from runtime.core.slices import JobConfig
from runtime.rl import guards, rewards
from runtime.rl.checkpoint import Checkpoints, hf_due, record_of
from runtime.rl.data import PromptSampler
from runtime.rl.metrics import MetricsLogger

# mean |actor - engine| log-prob per response token on the same weights above which the loop
# says the engine is not generating with them (bf16 engines and actors differ by ~0.01-0.05)
MAX_LOGPROB_GAP = 0.5


def logprob_gap(actor: list[list[float]], engine: list[list[float]]) -> dict[str, float]:
    """The gap between the actor's log-probs of the sampled tokens (on the weights the engine
    generated with) and the engine's own: mean and max of |difference| per response token."""
    diffs = [abs(a - e) for row_a, row_e in zip(actor, engine, strict=True)
             for a, e in zip(row_a, row_e, strict=True)]
    if not diffs:
        return {"rollout/logprob_abs_diff": 0.0, "rollout/logprob_abs_diff_max": 0.0}
    return {"rollout/logprob_abs_diff": statistics.fmean(diffs),
            "rollout/logprob_abs_diff_max": max(diffs)}


def request_seed(seed: int, rollout_id: int, sample: int) -> int:
    return ((seed * 1_000_003 + rollout_id) * 100_003 + sample) % (1 << 62)


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
    def __init__(self, config: JobConfig, train, rollout, sampler: PromptSampler, tokenizer,
                 reward_fn: Callable, metrics: MetricsLogger, checkpoints: Checkpoints,
                 log: Callable[[str], None] = print):
        self.config, self.train, self.rollout = config, train, rollout
        self.sampler, self.tokenizer, self.reward_fn = sampler, tokenizer, reward_fn
        self.metrics, self.checkpoints, self.log = metrics, checkpoints, log
        self.params = SamplingParams(
            temperature=config.temperature, top_p=config.top_p,
            max_new_tokens=config.max_response_len,
            stop_token_ids=tuple(sorted(_stop_ids(tokenizer))),
            return_routed_experts=bool(config.train["routing_replay"]))
        self.version = 0
        self.next_rollout = 0
        self.score = rewards.RewardCaller(reward_fn, config.reward_timeout_s, log)
        self.pending_save = None  # prepared in one_rollout, committed after its metrics line

    # --------------------------------------------------------------------------- resume

    def restore(self) -> bool:
        """Load the newest checkpoint of checkpoint's load folder whose files match their
        checksums, if any.

        Raises:
            CheckpointError: the newest is corrupt and checkpoint.on_corrupt is "stop".
        """
        found = self.checkpoints.resume_point(self.config.on_corrupt)
        if found is None:
            return False
        state = self.checkpoints.read_state(found)
        self.train.load(found / "train")
        self.sampler.load_state_dict(state["data"])
        self.next_rollout, self.version = state["next_rollout"], state["weight_version"]
        self.log(f"vime: resumed from {found} (next rollout {self.next_rollout}, weight "
                 f"version {self.version})")
        return True

    # ------------------------------------------------------------------------------ run

    def run(self) -> None:
        config = self.config
        if self.next_rollout >= config.num_rollout:
            self.log(f"vime: nothing to do: the checkpoint is at rollout {self.next_rollout}, "
                     f"rollout.num_rollout = {config.num_rollout}")
            return
        start = time.perf_counter()
        if config.colocate:
            self.train.offload()
        self.train.push_weights(self.rollout, self.version or 1,
                              config.weight_bucket_bytes)
        self.version = self.version or 1
        self.log(f"vime: weights version {self.version} on {self.rollout.size} engine(s) in "
                 f"{time.perf_counter() - start:.2f} s; rollouts {self.next_rollout} to "
                 f"{config.num_rollout - 1}")
        for rollout_id in range(self.next_rollout, config.num_rollout):
            self.metrics.log(rollout_id, self.one_rollout(rollout_id))
            self.commit_checkpoint()
        self.metrics.close()

    def commit_checkpoint(self) -> None:
        """The rollout's checkpoint made visible, after its metrics line is written: a stop
        between the two repeats the rollout on resume instead of losing its line."""
        if self.pending_save is not None:
            pending, self.pending_save = self.pending_save, None
            self.checkpoints.commit(pending)

    def describe_sample(self, rollout_id: int, prompts, index: int) -> rewards.Sample:
        prompt = prompts[index // self.config.samples_per_prompt]
        return rewards.Sample(rollout_id, index, prompt.index + 1,
                              str(self.config.data.prompt_data))

    def one_rollout(self, rollout_id: int) -> dict[str, float]:
        config, timer = self.config, Timer()
        prompts = self.sampler.next_batch(config.prompts_per_rollout)
        n = config.samples_per_prompt
        requests = [GenerationRequest(p.token_ids, request_seed(config.seed, rollout_id, i * n + j))
                    for i, p in enumerate(prompts) for j in range(n)]
        with timer.phase("generate"):
            generations = self.rollout.generate(requests, self.params)
        numbers: dict[str, float] = {"weight_version": self.version}
        if config.colocate:
            with timer.phase("offload"):
                self.rollout.sleep(2)
                self.train.onload()
            numbers["memory/engine_bytes_while_training"] = self.rollout.resident_bytes()

        with timer.phase("reward"):
            scores, extras = [], {}
            for index, generation in enumerate(generations):
                prompt = prompts[index // n]
                text = self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
                value, extra = self.score(self.describe_sample(rollout_id, prompts, index),
                                          prompt=prompt.text, response=text, label=prompt.label)
                scores.append(value)
                for key, number in extra.items():
                    extras.setdefault(key, []).append(number)
            advantages = algorithm.advantages(
                torch.tensor(scores), n, config.loss.advantage_estimator,
                config.std_normalization, [len(g.token_ids) for g in generations]).tolist()

        batch = TrainBatch(
            tokens=[list(r.prompt_ids) + g.token_ids for r, g in zip(requests, generations,
                                                                     strict=True)],
            prompt_lens=[len(r.prompt_ids) for r in requests], advantages=advantages,
            rollout_log_probs=[g.log_probs for g in generations],
            routed_experts=([g.routed_experts for g in generations]
                            if self.params.return_routed_experts else None))
        with timer.phase("log_probs"):
            batch.old_log_probs = self.train.log_probs(batch, "actor")
            if config.needs_ref:
                batch.ref_log_probs = self.train.log_probs(batch, "ref")
        guards.check_batch(rollout_id, batch.advantages,
                           {"actor": batch.old_log_probs, "reference": batch.ref_log_probs},
                           lambda i: self.describe_sample(rollout_id, prompts, i).describe())
        numbers.update(logprob_gap(batch.old_log_probs, batch.rollout_log_probs))
        if numbers["rollout/logprob_abs_diff"] > MAX_LOGPROB_GAP:
            self.log(f"vime: rollout {rollout_id}: the engine's log-probs differ from the "
                     f"actor's by {numbers['rollout/logprob_abs_diff']:.3f} per token on the "
                     f"same weights (version {self.version}); more than {MAX_LOGPROB_GAP} "
                     "means the engine does not generate with the weights it was sent")

        with timer.phase("train"):
            step_stats = []
            size = config.global_batch_size
            for step in range(config.steps_per_rollout):
                step_batch = batch.select(range(step * size, (step + 1) * size))
                step_batch.step_response_tokens = sum(step_batch.response_lens())
                step_batch.step_samples = len(step_batch)
                step_stats.append(self.train.train_step(step_batch))
        trained_tokens = sum(len(t) for t in batch.tokens[:config.steps_per_rollout * size])
        guards.check_train(rollout_id, step_stats)

        due = (rollout_id + 1) % config.save_interval == 0 or rollout_id + 1 == config.num_rollout
        if due:
            with timer.phase("save"):
                self.pending_save = self.checkpoints.prepare(rollout_id, self.train, {
                    "next_rollout": rollout_id + 1, "weight_version": self.version + 1,
                    "data": self.sampler.state_dict()}, record=record_of(config))
        if hf_due(config, rollout_id):
            with timer.phase("save_hf"):
                self.checkpoints.save_hf(rollout_id, self.train, config.model.hf_checkpoint,
                                         self.tokenizer)

        if config.colocate:
            with timer.phase("offload"):
                self.train.offload()
                numbers["memory/actor_bytes_while_generating"] = self.train.resident_bytes()
                self.rollout.wake(["weights"])
        with timer.phase("weight_sync"):
            self.version += 1
            sent = self.train.push_weights(self.rollout, self.version, config.weight_bucket_bytes)
        numbers["weight_sync/bytes"] = sent
        if hasattr(self.train, "export_seconds"):  # the part of the sync spent exporting
            numbers["weight_sync/export_s"] = self.train.export_seconds
        if config.colocate:
            with timer.phase("offload"):
                self.rollout.wake(["kv_cache"])

        response_lens = [len(g.token_ids) for g in generations]
        numbers.update({
            "reward/mean": statistics.fmean(scores),
            "reward/std": statistics.pstdev(scores),
            **{f"reward/{k}": statistics.fmean(v) for k, v in extras.items()},
            "response_len/mean": statistics.fmean(response_lens),
            "response_len/max": max(response_lens),
            "response_len/truncated": statistics.fmean(
                g.finish_reason == "length" for g in generations),
            "samples": len(generations), "data/epoch": self.sampler.epoch,
        })
        # runtime/workers/supervisor.py: engines replaced so far
        if hasattr(self.rollout, "restarts"):
            numbers["rollout/engine_restarts"] = sum(self.rollout.restarts)
        numbers.update(_train_numbers(step_stats, config.needs_ref))
        numbers["throughput/generate_tokens_per_s"] = sum(response_lens) / max(
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
    if total.get("tis_weight"):
        numbers["train/tis_weight"] = total["tis_weight"] / tokens
        numbers["train/tis_truncated_fraction"] = total["tis_truncated_tokens"] / tokens
    return numbers


def _stop_ids(tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for extra in ("<|im_end|>", "<|endoftext|>"):
        token = tokenizer.convert_tokens_to_ids(extra)
        if isinstance(token, int) and token != tokenizer.unk_token_id and token >= 0:
            ids.add(token)
    return ids
