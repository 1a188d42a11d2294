"""Which generated groups a rollout trains on: DAPO's dynamic sampling and overlong handling.

The loop (runtime/rl/loop.py, GRPOLoop.sample_groups) generates groups of n samples per
prompt, scores them, and asks this module (`overlong_penalty`, `mask_overlong`, `keeps`,
`Refill`); everything here is a pure function of the groups it is given. What each answers:
docs/design.md, "Dynamic sampling and overlong responses".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from runtime.core.slices import SamplingPolicy


def overlong_penalty(length: int, max_len: int, buffer_len: int, factor: float) -> float:
    """DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13) of a response of `length`
    tokens: 0 up to max_len - buffer_len tokens, then falling linearly to -factor at max_len
    (and staying there beyond it)."""
    start = max_len - buffer_len
    if length <= start:
        return 0.0
    return -min(length - start, buffer_len) / buffer_len * factor


def mask_overlong(advantages: list[float], generations) -> list[float]:
    """Advantage 0 for responses cut at max_response_len (finish reason "length"): no
    policy-gradient term for them (DAPO's overlong filtering, rollout.overlong = "mask"); the
    KL and entropy terms still see their tokens."""
    return [0.0 if g.finish_reason == "length" else a
            for a, g in zip(advantages, generations, strict=True)]


@dataclass
class Group:
    """The n samples of one prompt: what was asked, generated and scored."""

    prompt: object  # runtime.rl.data.Prompt
    requests: list  # GenerationRequest per sample
    generations: list  # Generation per sample
    rewards: list[float]  # what the reward function gave
    scores: list[float]  # the rewards the advantages see (after the overlong penalty)
    extras: dict[str, list[float]] = field(default_factory=dict)  # reward/<key> numbers

    @property
    def varied(self) -> bool:
        """Whether the scores differ: a group of equal scores has every GRPO advantage 0."""
        return max(self.scores) != min(self.scores)


GroupFilter = Callable[..., bool]


class FilterError(RuntimeError):
    """rollout.dynamic_sampling_filter raised; the message names the filter and the group's
    prompt. Nothing of the rollout was trained or saved."""


class NoSignalError(RuntimeError):
    """Dynamic sampling kept no group in rollout.dynamic_sampling_max_empty_rollouts rollouts
    in a row (each of them had no group of differing rewards, so every group-baseline
    advantage was 0 and the policy gradient nothing); the message says what the rewards were
    and what to try."""


def stops_without_signal(empty_streak: int, policy: SamplingPolicy) -> bool:
    """Whether `empty_streak` rollouts in a row that kept no group stop the run:
    policy.max_empty_rollouts of them, never when it is 0."""
    return policy.max_empty_rollouts > 0 and empty_streak >= policy.max_empty_rollouts


def load_filter(name: str) -> GroupFilter:
    """rollout.dynamic_sampling_filter: "module.path:function".

    Raises:
        ValueError: the module or the function cannot be found."""
    module_name, _, function = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"rollout.dynamic_sampling_filter = {name!r}: cannot import "
                         f"{module_name}: {err}") from err
    try:
        return getattr(module, function)
    except AttributeError:
        raise ValueError(f"rollout.dynamic_sampling_filter = {name!r}: {module_name} has no "
                         f"{function}") from None


def keeps(group: Group, user_filter: GroupFilter | None) -> bool:
    """Whether dynamic sampling keeps a group: its scores differ, and the user's filter (when
    set) returns true for it."""
    if not group.varied:
        return False
    if user_filter is None:
        return True
    try:
        return bool(user_filter(rewards=list(group.scores),
                                responses=[g.token_ids for g in group.generations],
                                prompt=group.prompt.text, label=group.prompt.label))
    except Exception as err:
        name = (f"{getattr(user_filter, '__module__', '?')}:"
                f"{getattr(user_filter, '__qualname__', type(user_filter).__name__)}")
        raise FilterError(
            f"rollout.dynamic_sampling_filter {name} raised {type(err).__name__}: {err} on the "
            f"group of the prompt at line {group.prompt.index + 1} of data.prompt_data; "
            "nothing of this rollout was trained or saved") from err


@dataclass
class Refill:
    """The groups of one rollout, attempt after attempt, until the batch is full.

    Without dynamic sampling every group is kept and one attempt of batch_size prompts
    fills it. With it, each attempt draws over_sampling_batch_size prompts; groups that
    keeps() rejects are set aside, and when max_attempts attempts have not kept enough, the
    set-aside groups complete the batch in the order they were generated (their advantages
    are 0 or the filter rejected them: they add no signal, only keep the batch's size).
    """

    policy: SamplingPolicy
    wanted: int  # groups per rollout (rollout.batch_size)
    user_filter: GroupFilter | None = None
    kept: list[Group] = field(default_factory=list)
    filtered: list[Group] = field(default_factory=list)
    attempts: int = 0
    prompts_drawn: int = 0

    def next_size(self) -> int:
        """Prompts to draw for the next attempt; 0 when the batch is complete."""
        if not self.policy.dynamic_sampling:
            return self.wanted - len(self.kept)
        if len(self.kept) >= self.wanted:
            return 0
        seen = len(self.kept) + len(self.filtered)
        if self.attempts >= self.policy.max_attempts and seen >= self.wanted:
            return 0
        return max(self.policy.over_sampling_batch_size, 1)

    def add(self, groups: Sequence[Group]) -> None:
        """The groups of one attempt, in generation order."""
        self.attempts += 1
        self.prompts_drawn += len(groups)
        for group in groups:
            if not self.policy.dynamic_sampling or keeps(group, self.user_filter):
                self.kept.append(group)
            else:
                self.filtered.append(group)

    def batch(self) -> list[Group]:
        """The first `wanted` kept groups, completed by filtered ones when short."""
        chosen = self.kept[:self.wanted]
        return chosen + self.filtered[:self.wanted - len(chosen)]

    def short(self) -> bool:
        """Whether dynamic sampling ran out of attempts before kept groups filled the batch."""
        return self.policy.dynamic_sampling and len(self.kept) < self.wanted

    def advice(self) -> str:
        """Why the filtered groups were filtered, from their rewards, and what to try."""
        groups = self.kept + self.filtered
        seen = sorted({r for g in groups for r in g.rewards})
        rejected = sum(1 for g in self.filtered if g.varied)  # by the user's filter
        words = []
        if rejected:
            words.append(f"rollout.dynamic_sampling_filter rejected {rejected} group(s) whose "
                         "rewards differ: check that it keeps what it should")
        if len(seen) == 1:
            words.append(f"every sample of the rollout scored {seen[0]:g}: check that "
                         "rollout.reward tells responses apart (a constant or failing reward "
                         "gives no signal)")
        elif len(self.filtered) > rejected:
            shown = ", ".join(f"{r:g}" for r in seen[:6]) + (", ..." if len(seen) > 6 else "")
            words.append(f"each filtered group's samples scored alike (rewards seen: {shown}): "
                         "the prompts are all solved or all failed by the policy; raise "
                         "rollout.temperature or n_samples_per_prompt for more varied "
                         "samples, or use prompts the policy solves only sometimes")
        text = "; ".join(words)
        return text[:1].upper() + text[1:]

    def report(self, rollout_id: int) -> str | None:
        """The log's line for a rollout whose dynamic sampling kept fewer than batch_size
        groups (None when it kept enough): kept, filtered, attempts, and what to try."""
        if not self.short():
            return None
        kept, filtered = len(self.kept), len(self.filtered)
        stand_in = self.wanted - kept
        if kept:
            return (f"vime: rollout {rollout_id}: dynamic sampling kept {kept} of "
                    f"{self.wanted} groups after {self.attempts} attempt(s) ({filtered} "
                    f"filtered); {stand_in} filtered group(s) complete the batch with "
                    "advantage 0")
        return (f"vime: rollout {rollout_id}: DYNAMIC SAMPLING KEPT NO GROUP: {filtered} "
                f"group(s) filtered in {self.attempts} attempt(s) "
                f"(rollout.dynamic_sampling_max_attempts = {self.policy.max_attempts}); the "
                f"batch is {stand_in} filtered group(s), each of samples scored alike, which "
                f"a group baseline gives advantage 0: this rollout trains on nothing. "
                f"{self.advice()}")

    def numbers(self) -> dict[str, float]:
        if not self.policy.dynamic_sampling:
            return {}
        return {"rollout/groups_kept": len(self.kept),
                "rollout/groups_filtered": len(self.filtered),
                "rollout/groups_short": max(self.wanted - len(self.kept), 0),
                "rollout/sampling_attempts": self.attempts,
                "rollout/prompts_drawn": self.prompts_drawn}
