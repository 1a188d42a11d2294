"""Evaluation during training: the [[eval.datasets]] generated on the rollout engines between
rollouts, scored, and summarised as eval/<name>/... metrics (mean reward, accuracy, pass@k,
response length).

The loop (runtime/rl/loop.py) calls Evaluator.run before rollout r's generation when
Evaluator.due(r), and once more after the last rollout: the weights evaluated "at rollout r"
are those rollout r generates with, the ones upstream's --eval-interval evaluates after
rollout r - 1. Colocated runs evaluate while the engines are awake, between rollouts. Every
request's seed comes from (experiment.seed, r, dataset, sample), so a resumed run evaluates
exactly as the uninterrupted one.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from runtime.core.interfaces import GenerationRequest, SamplingParams
from runtime.core.slices import EvalConfig, EvalDataset
from runtime.rl import rewards
from runtime.rl.data import Prompt, read_prompts, request_seed
from vime.render import pass_at_ks

# eval sample indices start here, above any rollout's (rollout.batch_size × n_samples ≤ 2**36),
# so eval seeds never repeat a training request's seed
EVAL_SAMPLE_BASE = 1 << 40
DATASET_STRIDE = 1 << 32


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased pass@k of n samples of which `correct` are correct (Chen et al. 2021,
    arXiv:2107.03374): 1 - C(n - c, k) / C(n, k), the chance that k samples drawn without
    replacement from the n hold at least one correct one."""
    if not 0 <= correct <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n {n}, c {correct}, k {k})")
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def is_correct(score: float, extra: dict[str, float]) -> bool:
    """A sample is correct when the reward's "acc" is 1; for rewards without "acc", when its
    score is above 0."""
    return extra["acc"] >= 1.0 if "acc" in extra else score > 0


def due(config: EvalConfig, rollout_id: int, num_rollout: int) -> bool:
    """Whether an evaluation precedes rollout `rollout_id`: rollout 0 with at_start, the final
    weights (rollout_id == num_rollout) with at_end, others every `interval` rollouts."""
    if rollout_id == 0:
        return config.at_start
    if rollout_id == num_rollout:
        return config.at_end
    return bool(config.interval) and rollout_id % config.interval == 0


@dataclass(frozen=True)
class EvalSet:
    """One dataset ready to evaluate: its prompts (tokenized once) and its reward."""

    config: EvalDataset
    index: int  # position among [[eval.datasets]], part of the seeds
    prompts: tuple[Prompt, ...]
    reward_fn: Callable


def summarise(name: str, n: int, scores: list[float], correct: list[bool],
              response_lens: list[int], truncated: list[bool]) -> dict[str, float]:
    """eval/<name>/... of one dataset: samples are in prompt order, n per prompt."""
    out = {f"eval/{name}/reward": statistics.fmean(scores),
           f"eval/{name}/acc": statistics.fmean(correct),
           f"eval/{name}/response_len": statistics.fmean(response_lens),
           f"eval/{name}/truncated": statistics.fmean(truncated),
           f"eval/{name}/prompts": len(scores) // n}
    per_prompt = [sum(correct[i:i + n]) for i in range(0, len(correct), n)]
    for k in pass_at_ks(n):
        out[f"eval/{name}/pass@{k}"] = statistics.fmean(pass_at_k(n, c, k) for c in per_prompt)
    return out


class Evaluator:
    def __init__(self, config: EvalConfig, seed: int, tokenizer, stop_ids: tuple[int, ...],
                 log: Callable[[str], None] = print, reward_timeout_s: float | None = None,
                 load_reward: Callable[[str], Callable] = rewards.load):
        self.config, self.seed, self.tokenizer, self.stop_ids = config, seed, tokenizer, stop_ids
        self.sets = []
        for index, dataset in enumerate(config.datasets):
            prompts, dropped = read_prompts(dataset.data, tokenizer)
            log(f"vime: eval {dataset.name}: {len(prompts)} prompts from "
                f"{dataset.data.prompt_data}"
                + (f" ({dropped} longer than rollout.max_prompt_len dropped)" if dropped else ""))
            self.sets.append(EvalSet(dataset, index, tuple(prompts),
                                     rewards.caller(load_reward(dataset.reward),
                                                    reward_timeout_s, log)))

    def due(self, rollout_id: int, num_rollout: int) -> bool:
        """Whether to evaluate the weights rollout `rollout_id` generates with (rollout
        num_rollout: the final weights)."""
        return bool(self.sets) and due(self.config, rollout_id, num_rollout)

    def run(self, rollout, rollout_id: int) -> dict[str, float]:
        """Generate every dataset on the rollout group's engines and score it."""
        start = time.perf_counter()
        numbers: dict[str, float] = {}
        for eval_set in self.sets:
            numbers.update(self._one(rollout, rollout_id, eval_set))
        numbers["time/eval"] = time.perf_counter() - start
        return numbers

    def _one(self, rollout, rollout_id: int, eval_set: EvalSet) -> dict[str, float]:
        dataset, n = eval_set.config, eval_set.config.samples_per_prompt
        base = EVAL_SAMPLE_BASE + eval_set.index * DATASET_STRIDE
        requests = [GenerationRequest(p.token_ids,
                                      request_seed(self.seed, rollout_id, base + i * n + j))
                    for i, p in enumerate(eval_set.prompts) for j in range(n)]
        params = SamplingParams(temperature=dataset.temperature, top_p=dataset.top_p,
                                max_new_tokens=dataset.max_response_len,
                                stop_token_ids=self.stop_ids)
        generations = rollout.generate(requests, params)
        samples, calls = [], []
        for index, generation in enumerate(generations):
            prompt = eval_set.prompts[index // n]
            samples.append(rewards.Sample(rollout_id, index, prompt.index + 1,
                                          f"{dataset.data.prompt_data} (eval {dataset.name})"))
            calls.append({"prompt": prompt.text, "label": prompt.label, "response":
                          self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)})
        scored = eval_set.reward_fn.score_many(samples, calls)  # a reward server: in batches
        scores = [score for score, _extra in scored]
        correct = [is_correct(score, extra) for score, extra in scored]
        return summarise(dataset.name, n, scores, correct,
                         [len(g.token_ids) for g in generations],
                         [g.finish_reason == "length" for g in generations])
