"""Dynamic sampling, the soft overlong penalty and pass@k, against their written-out formulas
(runtime/rl/sampling.py, runtime/rl/evaluation.py)."""

from __future__ import annotations

import itertools
import math
import sys
import types

import pytest

from runtime.core.slices import EvalConfig, SamplingPolicy
from runtime.rl.data import Prompt
from runtime.rl.evaluation import due, is_correct, pass_at_k, summarise
from runtime.rl.sampling import (
    FilterError,
    Group,
    Refill,
    keeps,
    load_filter,
    mask_overlong,
    overlong_penalty,
)
from vime.render import pass_at_ks


def _group(scores, label="7") -> Group:
    prompt = Prompt(0, "What is 3 + 4?", (1, 2), label)
    generations = [types.SimpleNamespace(token_ids=[i]) for i in range(len(scores))]
    return Group(prompt, [None] * len(scores), generations, list(scores), list(scores))


# --------------------------------------------------------------------------------- pass@k

def _pass_at_k_by_counting(n: int, c: int, k: int) -> float:
    """The share of the k-subsets of n samples (c of them correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(("n", "c", "k"), [(1, 0, 1), (1, 1, 1), (4, 1, 2), (5, 2, 3),
                                           (6, 0, 4), (6, 3, 6), (8, 1, 1), (8, 5, 4)])
def test_pass_at_k_is_the_chance_that_k_of_n_samples_hold_a_correct_one(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_by_counting(n, c, k), abs=1e-12)


def test_pass_at_1_is_the_accuracy_and_the_ks_are_powers_of_two_and_n():
    assert pass_at_k(16, 5, 1) == pytest.approx(5 / 16)
    assert pass_at_k(16, 5, 12) == 1.0  # fewer than 12 wrong samples
    assert pass_at_ks(16) == [1, 2, 4, 8, 16]
    assert pass_at_ks(6) == [1, 2, 4, 6]
    assert pass_at_ks(1) == [1]
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(4, 5, 1)


def test_summary_averages_pass_at_k_over_prompts():
    # two prompts of 4 samples: 1 and 0 correct; rewards 1.0 / 0.0
    correct = [True, False, False, False, False, False, False, False]
    scores = [1.0 if c else 0.0 for c in correct]
    out = summarise("aime", 4, scores, correct, [3] * 8, [False] * 7 + [True])
    assert out["eval/aime/acc"] == pytest.approx(1 / 8)
    assert out["eval/aime/pass@1"] == pytest.approx((1 / 4 + 0) / 2)
    assert out["eval/aime/pass@2"] == pytest.approx((1 - math.comb(3, 2) / math.comb(4, 2)) / 2)
    assert out["eval/aime/pass@4"] == pytest.approx(0.5)
    assert out["eval/aime/truncated"] == pytest.approx(1 / 8)
    assert out["eval/aime/prompts"] == 2
    # a reward's "acc" decides over its score (dapo scores a wrong answer -1, right +1)
    assert is_correct(-1.0, {"acc": 0.0}) is False and is_correct(0.6, {"acc": 0.0}) is False
    assert is_correct(0.5, {}) is True and is_correct(0.0, {}) is False


def test_evaluations_before_rollout_0_every_interval_and_after_the_last():
    def evaluated(**keys):
        return [r for r in range(41) if due(EvalConfig(**keys), r, 40)]

    assert evaluated(interval=20) == [0, 20, 40]  # upstream: after rollouts 19 and 39
    assert evaluated(interval=10, at_end=False) == [0, 10, 20, 30]
    assert evaluated(interval=15, at_start=False) == [15, 30, 40]
    assert evaluated(at_start=False, at_end=False) == []


# ------------------------------------------------------------------------ overlong penalty

@pytest.mark.parametrize(("length", "expected"), [
    (0, 0.0), (16, 0.0),            # up to max_len - buffer: no penalty
    (17, -0.5 / 4), (18, -1.0 / 4), (20, -0.5),  # linear over the 4-token buffer
    (21, -0.5),                      # beyond max_len: the full factor
])
def test_soft_overlong_penalty_is_dapos_linear_ramp(length, expected):
    # DAPO eq. 13: ((L_max - L_cache) - |y|) / L_cache inside the buffer, times the factor
    assert overlong_penalty(length, max_len=20, buffer_len=4, factor=0.5) == pytest.approx(expected)


def test_mask_zeroes_the_advantage_of_cut_responses_only():
    cut, ended = (types.SimpleNamespace(finish_reason=r) for r in ("length", "stop"))
    assert mask_overlong([0.5, -1.0, 2.0], [cut, ended, cut]) == [0.0, -1.0, 0.0]


# ---------------------------------------------------------------------------------- filter

def test_a_group_of_equal_rewards_is_filtered_and_the_user_filter_can_drop_more(monkeypatch):
    assert not keeps(_group([1.0, 1.0, 1.0]), None)
    assert not keeps(_group([0.0, 0.0]), None)
    assert keeps(_group([0.0, 0.1]), None)

    seen = []

    def only_seven(rewards, responses, prompt, label):
        seen.append((rewards, len(responses), prompt))
        return label == "7"

    module = types.ModuleType("vime_test_filters")
    module.only_seven = only_seven
    monkeypatch.setitem(sys.modules, "vime_test_filters", module)
    user = load_filter("vime_test_filters:only_seven")
    assert keeps(_group([0.0, 1.0]), user)
    assert not keeps(_group([0.0, 1.0], label="8"), user)
    assert not keeps(_group([1.0, 1.0]), user)  # equal rewards go before the user's filter
    assert seen == [([0.0, 1.0], 2, "What is 3 + 4?")] * 2
    with pytest.raises(ValueError, match="has no missing"):
        load_filter("vime_test_filters:missing")

    def by_label(rewards, responses, prompt, label):
        return {"7": True}[label]

    with pytest.raises(FilterError, match=r"filter .*by_label raised KeyError: '8' on the group "
                                          "of the prompt at line 1 of data.prompt_data"):
        keeps(_group([0.0, 1.0], label="8"), by_label)
    with pytest.raises(ValueError, match="cannot import"):
        load_filter("no_such_module_here:f")


# ---------------------------------------------------------------------------------- refill

def _policy(**changes) -> SamplingPolicy:
    return SamplingPolicy(**{"dynamic_sampling": True, "over_sampling_batch_size": 4,
                             "max_attempts": 3, **changes})


def test_refill_draws_until_the_batch_is_kept():
    refill = Refill(_policy(), wanted=4)
    assert refill.next_size() == 4
    refill.add([_group([0, 1]), _group([1, 1]), _group([0, 0]), _group([0, 1])])
    assert refill.next_size() == 4  # 2 of 4 kept
    refill.add([_group([1, 0]), _group([1, 1]), _group([0, 2]), _group([3, 0])])
    assert refill.next_size() == 0  # 5 kept
    batch = refill.batch()
    assert [g.scores for g in batch] == [[0, 1], [0, 1], [1, 0], [0, 2]]  # generation order
    assert refill.numbers() == {"rollout/groups_kept": 5, "rollout/groups_filtered": 3,
                                "rollout/groups_short": 0, "rollout/sampling_attempts": 2,
                                "rollout/prompts_drawn": 8}


def test_refill_stops_at_the_attempt_bound_and_completes_with_filtered_groups():
    refill = Refill(_policy(max_attempts=2), wanted=3)
    for _ in range(2):
        refill.add([_group([1, 1]), _group([0, 1]), _group([0, 0]), _group([2, 2])])
    assert refill.next_size() == 0  # the bound: 2 attempts, only 2 groups kept
    batch = refill.batch()
    assert [g.scores for g in batch] == [[0, 1], [0, 1], [1, 1]]
    assert refill.numbers()["rollout/groups_short"] == 1


def test_refill_goes_past_the_bound_only_until_there_are_enough_groups():
    # 1 prompt per attempt and a bound of 1: still 3 attempts, to have 3 groups at all
    refill = Refill(_policy(over_sampling_batch_size=1, max_attempts=1), wanted=3)
    while (size := refill.next_size()) > 0:
        refill.add([_group([1, 1])] * size)
    assert refill.attempts == 3 and len(refill.batch()) == 3


def test_without_dynamic_sampling_every_group_is_kept_in_one_attempt():
    refill = Refill(SamplingPolicy(), wanted=2)
    assert refill.next_size() == 2
    refill.add([_group([1, 1]), _group([0, 0])])
    assert refill.next_size() == 0 and len(refill.batch()) == 2 and refill.numbers() == {}


# ------------------------------------------------------------------------------- preflight

def test_preflight_names_an_eval_dataset_or_a_filter_that_a_job_would_stop_on(tmp_path):
    from runtime.node.preflight import eval_and_filter_problem

    prompts = tmp_path / "aime.jsonl"
    prompts.write_text('{"prompt": "1 + 1?", "label": "2"}\n')
    rollout = {"dynamic_sampling": True, "dynamic_sampling_filter": "no_such_filters:keep"}

    def spec(path, reward="deepscaler", **changes):
        return {"eval": {"datasets": [{"prompt_data": str(path), "reward": reward}]},
                "rollout": {**rollout, **changes}}

    assert "eval.datasets[0].prompt_data: " in eval_and_filter_problem(
        spec(tmp_path / "missing.jsonl"), tmp_path)
    assert eval_and_filter_problem(spec(prompts, "no_such_rewards:score"), tmp_path) \
        .startswith("eval.datasets[0]: rollout.reward = 'no_such_rewards:score': cannot import")
    assert "dynamic_sampling_filter = 'no_such_filters:keep': cannot import" in \
        eval_and_filter_problem(spec(prompts), tmp_path)
    assert eval_and_filter_problem(spec(prompts, dynamic_sampling=False), tmp_path) is None
