"""The reward verifiers on real strings, in the formats models actually write."""

from __future__ import annotations

import pytest

from runtime import toy
from runtime.rl import rewards


@pytest.mark.parametrize("response, label, expected", [
    ("The answer is $\\boxed{42}$.", "42", 1.0),
    ("<think>3 + 4 is 7, halve it... so 0.5</think> Therefore \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac34", 1.0),
    ("so $x = \\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt{3}}{2}", 1.0),
    ("first \\boxed{3}, on reflection \\boxed{4}", "4", 1.0),  # the last box counts
    ("first \\boxed{3}, on reflection \\boxed{4}", "3", 0.0),
    ("\\boxed{1,000}", "1000", 1.0),
    ("\\boxed{x = 3}", "3", 1.0),
    ("\\boxed{10\\%}", "10", 1.0),
    ("\\boxed{ 7 }", "\\boxed{7}", 1.0),  # a boxed label is unboxed too
    ("\\fbox{9}", "9", 1.0),
    ("hence \\boxed 5", "5", 1.0),
    ("\\boxed{\\text{(B)}}", "(B)", 1.0),
    ("\\boxed{2.50}", "5/2", 1.0),
    ("\\boxed{0.33}", "\\frac{1}{3}", 0.0),  # close is not equal
    ("no box here, the answer is 42", "42", 0.0),
    ("<think>long reasoning that never ends \\boxed{5}", "5", 0.0),  # cut-off thinking
    ("\\boxed{5", "5", 0.0),  # never closed
])
def test_deepscaler(response, label, expected):
    assert rewards.deepscaler(prompt="", response=response, label=label) == expected


@pytest.mark.parametrize("response, label, score", [
    ("Let me compute 17 × 12.\nAnswer: 204", "204", 1.0),
    ("Answer: 12\nWait, I made an error.\nAnswer: 13", "13", 1.0),
    ("Answer: 12\nWait, I made an error.\nAnswer: 13", "12", -1.0),
    ("answer : $\\frac{1}{2}$", "1/2", 1.0),
    ("Answer: $\\boxed{34}$", "34", 1.0),
    ("The result is 204.", "204", -1.0),
    ("Answer: 5" + " and then some" * 30, "5", -1.0),  # only the last 300 characters
])
def test_dapo(response, label, score):
    result = rewards.dapo(prompt="", response=response, label=label)
    assert result == {"score": score, "acc": 1.0 if score > 0 else 0.0}


def test_math_reads_either_format():
    assert rewards.math_answer(prompt="", response="Answer: 7", label="7") == 1.0
    assert rewards.math_answer(prompt="", response="\\boxed{7} Answer: 8", label="7") == 1.0
    assert rewards.math_answer(prompt="", response="Answer: 8", label="7") == 0.0


def test_load_builtin_and_custom_rewards():
    assert rewards.load("deepscaler") is rewards.deepscaler
    assert rewards.load("runtime.toy:reward") is toy.reward
    for bad, message in (("nonexistent_module_xyz:f", "cannot import"),
                         ("json:no_such_function", "has no no_such_function"),
                         ("deepscaller", "neither a built-in")):
        with pytest.raises(ValueError, match=message):
            rewards.load(bad)


def test_a_reward_module_that_does_not_compile_is_named_with_its_line(tmp_path):
    (tmp_path / "broken_reward_mod.py").write_text("def reward(**kw):\n    return (\n")
    with pytest.raises(ValueError, match=r"broken_reward_mod does not compile: .*"
                                         r"broken_reward_mod\.py:\d"):
        rewards.load("broken_reward_mod:reward", str(tmp_path))


def test_score_takes_floats_and_dicts():
    assert rewards.score(0.5) == (0.5, {})
    assert rewards.score({"score": -1.0, "acc": False, "pred": "7"}) == (-1.0, {"acc": 0.0})
    with pytest.raises(rewards.RewardError, match="without 'score'"):
        rewards.score({"acc": 1.0})
    with pytest.raises(rewards.RewardError, match="returned '0.5', a str, not a number"):
        rewards.score("0.5")
    with pytest.raises(rewards.RewardError, match="a NoneType, not a number"):
        rewards.score({"score": None})


@pytest.mark.parametrize("response, score, acc", [
    ("\\boxed{ 7 }", 1.0, 1.0),          # 0.1 + 0.1 + 0.2 + 0.1 + 0.4
    ("\\boxed{ 7 } 3", 0.8, 1.0),        # right, but more after the box
    ("\\boxed{ 3 }", 0.6, 0.0),          # the format alone
    ("what \\boxed{ 3 }", 0.4, 0.0),
    ("\\boxed{ 7", 0.2, 0.0),            # opened, a digit, never closed
    ("\\boxed{ \\boxed{", 0.1, 0.0),
    ("7", 0.0, 0.0),
])
def test_toy_reward_grades_the_format_then_the_sum(response, score, acc):
    assert toy.reward(prompt="What is 3 + 4?", response=response, label="7") == {
        "score": score, "acc": acc}
