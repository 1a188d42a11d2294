"""Rewards: built-in math verifiers and `module:function` custom rewards (rollout.reward).

A reward is called once per sample with keyword arguments

    reward(prompt: str, response: str, label) -> float | dict

`prompt` is the prompt text as sent (after the chat template), `response` the decoded
response (special tokens removed), `label` the JSONL label as read. A dict must hold
"score" (the number GRPO optimises); its other numeric entries are averaged per rollout and
logged as reward/<key> (for example "acc").

Built-in names:

    deepscaler   the last \\boxed{...} (or \\fbox{...}) of the response, compared with the
                 label (itself boxed or not) after math normalisation: 1.0 or 0.0. When the
                 response has a </think>, only the text after the last one counts; a
                 response that opened <think> and never closed it scores 0 (the reasoning
                 was cut off), as in DeepScaleR's reward.
    dapo         the last "Answer: ..." line (DAPO-Math-17k's format), compared after
                 normalisation: {"score": 1.0 or -1.0, "acc": 1.0 or 0.0}, as DAPO's own
                 verifier scores it.
    math         either format: the last \\boxed{} if any, else the last "Answer:" line;
                 1.0 or 0.0.

Numbers are compared by value when both sides parse as numbers (integers, decimals,
fractions such as \\frac{1}{2}, 1/2, thousands separators, percent signs); everything else
after normalisation as strings.
"""

from __future__ import annotations

import importlib
import math
import re
import sys
from collections.abc import Callable
from fractions import Fraction

RewardFn = Callable[..., "float | dict"]


# ------------------------------------------------------------------------------ extraction

def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} or \\fbox{...} (braces balanced), or of
    `\\boxed 7` (a boxed single token); None when there is none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:]
    rest = rest[len("\\boxed"):] if rest.startswith("\\boxed") else rest[len("\\fbox"):]
    if rest.startswith(" ") and not rest.lstrip().startswith("{"):
        token = rest.strip().split()
        return token[0].rstrip("$.") if token else None
    rest = rest.lstrip()
    if not rest.startswith("{"):
        return None
    depth = 0
    for index, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:index]
    return None  # never closed


_ANSWER_LINE = re.compile(r"(?i)answer\s*:\s*([^\n]+)")


def last_answer_line(text: str) -> str | None:
    """What follows the last "Answer:" on its line (DAPO's format), or None."""
    found = _ANSWER_LINE.findall(text)
    return found[-1].strip() if found else None


def after_thinking(response: str) -> str | None:
    """The part of the response after the reasoning: after the last </think>; the whole
    response when there is no thinking; None when <think> was opened and never closed."""
    if "</think>" in response:
        return response.rsplit("</think>", 1)[1]
    if "<think>" in response:
        return None
    return response


# ---------------------------------------------------------------------------- normalisation

_REMOVE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "$", "\\$",
           "^\\circ", "^{\\circ}", "\\%", "%", "°")
_UNIT_WORDS = ("degrees", "degree", "units", "unit", "cm", "meters", "inches", "dollars")


def _unwrap(text: str, command: str) -> str:
    """\\command{x} -> x, for every occurrence (braces balanced)."""
    while True:
        start = text.find(command + "{")
        if start < 0:
            return text
        depth, index = 0, start + len(command)
        for index in range(start + len(command), len(text)):
            if text[index] == "{":
                depth += 1
            elif text[index] == "}":
                depth -= 1
                if depth == 0:
                    break
        else:
            return text
        inner = text[start + len(command) + 1:index]
        text = text[:start] + inner + text[index + 1:]


def _braced_fractions(text: str) -> str:
    """\\frac12 -> \\frac{1}{2}, \\frac1{2} -> \\frac{1}{2}, \\sqrt3 -> \\sqrt{3}."""
    text = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", text)
    text = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", text)
    return re.sub(r"\\sqrt(\d+)", r"\\sqrt{\1}", text)


def normalize(answer: str) -> str:
    """A canonical string for a final answer: no spaces, dollars, \\left/\\right, \\text
    wrappers, units, trailing dots; \\dfrac and \\tfrac as \\frac; "x = 3" as "3"."""
    text = str(answer).strip()
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed
    text = text.replace("\n", "").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for command in ("\\text", "\\textbf", "\\mathrm", "\\mbox", "\\mathbf"):
        text = _unwrap(text, command)
    for token in _REMOVE:
        text = text.replace(token, "")
    text = text.strip().rstrip(".").strip()
    for word in _UNIT_WORDS:
        text = re.sub(rf"(?<=\d)\s*{word}$", "", text)
    if re.fullmatch(r"[a-zA-Z]\s*=\s*.+", text):  # "x = 3" -> "3"
        text = text.split("=", 1)[1]
    text = text.replace(" ", "")
    text = _braced_fractions(text)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    return text


_FRAC = re.compile(r"^(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}$")


def as_number(text: str) -> Fraction | float | None:
    """The value of a normalised answer when it is a plain number, else None."""
    match = _FRAC.match(text)
    try:
        if match:
            value = Fraction(int(match.group(2)), int(match.group(3)))
            return -value if match.group(1) else value
        if re.fullmatch(r"-?\d+/\d+", text):
            num, den = text.split("/")
            return Fraction(int(num), int(den))
        if re.fullmatch(r"-?(\d+\.?\d*|\.\d+)([eE]-?\d+)?", text):
            return Fraction(text) if "e" not in text.lower() else float(text)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def answers_match(predicted: str | None, label) -> bool:
    """Normalised equality, or equal values when both are numbers."""
    if predicted is None or label is None:
        return False
    pred, truth = normalize(predicted), normalize(str(label))
    if not pred:
        return False
    if pred == truth:
        return True
    a, b = as_number(pred), as_number(truth)
    if a is None or b is None:
        return False
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)


# ------------------------------------------------------------------------------- verifiers

def deepscaler(prompt: str, response: str, label) -> float:
    answer_part = after_thinking(response)
    if answer_part is None:
        return 0.0
    return 1.0 if answers_match(last_boxed(answer_part), label) else 0.0


def dapo(prompt: str, response: str, label) -> dict:
    # DAPO's verifier reads only the end of long responses
    correct = answers_match(last_answer_line(response[-300:]), label)
    return {"score": 1.0 if correct else -1.0, "acc": 1.0 if correct else 0.0}


def math_answer(prompt: str, response: str, label) -> float:
    answer_part = after_thinking(response)
    if answer_part is None:
        return 0.0
    predicted = last_boxed(answer_part)
    if predicted is None:
        predicted = last_answer_line(answer_part)
    return 1.0 if answers_match(predicted, label) else 0.0


BUILTIN: dict[str, RewardFn] = {"deepscaler": deepscaler, "dapo": dapo, "math": math_answer}


def load(name: str, spec_dir: str | None = None) -> RewardFn:
    """A built-in verifier by name, or "package.module:function", imported with the spec's
    folder (spec_dir) first on sys.path, then PYTHONPATH and the installed packages: a
    module beside the spec imports wherever the job runs (V907 looks in the same places)."""
    if name in BUILTIN:
        return BUILTIN[name]
    module_name, sep, function = name.partition(":")
    if not sep or not module_name or not function:
        raise ValueError(f"rollout.reward = {name!r} is neither a built-in reward "
                         f"({', '.join(sorted(BUILTIN))}) nor 'module.path:function'")
    if spec_dir and spec_dir not in sys.path:
        sys.path.insert(0, spec_dir)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"rollout.reward = {name!r}: cannot import {module_name}: {err}") from err
    try:
        return getattr(module, function)
    except AttributeError:
        raise ValueError(f"rollout.reward = {name!r}: {module_name} has no {function}") from None


def score(result) -> tuple[float, dict[str, float]]:
    """(score, extra numeric metrics) from what a reward returned."""
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"a reward returned a dict without 'score': {sorted(result)}")
        extra = {k: float(v) for k, v in result.items()
                 if k != "score" and isinstance(v, int | float | bool)}
        return float(result["score"]), extra
    return float(result), {}
