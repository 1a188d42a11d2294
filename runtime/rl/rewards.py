"""Rewards: built-in math verifiers and `module:function` custom rewards (rollout.reward).

A reward is called once per sample, `reward(prompt: str, response: str, label) -> float |
dict` (or `async def`; an http(s) URL scores in batches on a reward server,
runtime/rl/reward_server.py). Built-in names: deepscaler, dapo, math. `RewardCaller` checks
every result (a finite score, no exception, within rollout.reward_timeout_s); the loop calls
it once per sample.

The arguments, the built-in verifiers and how answers are compared: docs/design.md, "Rewards";
the user's view: docs/runtime.md, "Rewards".
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from runtime.rl.reward_server import RewardServer, RewardServerError

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
    if name.startswith(("http://", "https://")):
        return RewardServer(name)
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
    except SyntaxError as err:  # the module's own line, not a traceback through importlib
        raise ValueError(f"rollout.reward = {name!r}: {module_name} does not compile: "
                         f"{err.msg} ({err.filename}:{err.lineno})") from err
    try:
        return getattr(module, function)
    except AttributeError:
        raise ValueError(f"rollout.reward = {name!r}: {module_name} has no {function}") from None


def _number(value) -> float | None:
    """value as a float when it is a real number (bool, int, float, a numpy or torch scalar),
    else None; a string is not a number here, whatever it spells."""
    if isinstance(value, str | bytes) or value is None:
        return None
    if isinstance(value, bool | int | float | Fraction):
        return float(value)
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item) and getattr(value, "shape", None) in ((), None):
        try:
            return _number(item())
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


def score(result) -> tuple[float, dict[str, float]]:
    """(score, extra numeric metrics) from what a reward returned.

    Raises:
        RewardError: the score (a float, or a dict's "score") is not a number.
    """
    if isinstance(result, dict):
        if "score" not in result:
            raise RewardError(f"returned a dict without 'score': {sorted(result)}")
        extra = {k: number for k, v in result.items()
                 if k != "score" and (number := _number(v)) is not None}
        value = _number(result["score"])
        if value is None:
            raise RewardError(f"returned {{'score': {result['score']!r}}}, "
                              f"a {type(result['score']).__name__}, not a number")
        return value, extra
    value = _number(result)
    if value is None:
        raise RewardError(f"returned {result!r}, a {type(result).__name__}, not a number "
                          "(return a float, or a dict with a float 'score')")
    return value, {}


class RewardError(RuntimeError):
    """A reward call failed or returned what GRPO cannot use; the message names the reward
    function and the sample."""


@dataclass(frozen=True)
class Sample:
    """Which sample a reward scored, in the words of the messages."""

    rollout: int
    index: int  # in the rollout
    prompt_line: int  # 1-based line of data.prompt_data
    prompt_file: str

    def describe(self) -> str:
        return (f"rollout {self.rollout}, sample {self.index} (prompt at "
                f"{self.prompt_file}:{self.prompt_line})")


def function_name(reward_fn: RewardFn) -> str:
    module = getattr(reward_fn, "__module__", None)
    name = getattr(reward_fn, "__qualname__", None) or type(reward_fn).__name__
    return f"{module}:{name}" if module else name


def _accepts(function, name: str) -> bool:
    """Whether function takes a keyword argument `name` (by name or through **kwargs)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: pass it
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


async def _awaited(awaitable):
    return await awaitable


class _RewardTimeout(BaseException):
    """Raised in the main thread by the watch when a reward call passes its limit."""


class RewardCaller:
    """Calls a reward with a time limit per call. The reward runs in the calling thread (many
    verifiers time their own parsing with signal.alarm, which works only in the main
    thread: math-verify does); a watch thread interrupts the main thread when a call passes
    its limit (SIGUSR1 sent to that thread, whose handler is set only for the duration of a
    call). Off the main thread there is no interruption, only the report of a
    slow call."""

    SIGNAL = signal.SIGUSR1

    def __init__(self, reward_fn: RewardFn, timeout_s: float | None = None,
                 log: Callable[[str], None] = print):
        self.reward_fn, self.timeout_s, self.log = reward_fn, timeout_s, log
        self.name = function_name(reward_fn)
        # metadata= (data.metadata_keys) goes only to a reward that names it or takes **kwargs
        self._takes_metadata = _accepts(reward_fn, "metadata")
        self._warned_rollout: int | None = None
        self._lock = threading.Condition()
        self._deadline: float | None = None  # of the call in progress
        self._expired = False
        self._watch: threading.Thread | None = None

    def _watch_calls(self) -> None:
        with self._lock:
            while True:
                if self._deadline is None:
                    self._lock.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._lock.wait(left)
                    continue
                self._deadline, self._expired = None, True
                # to the main thread itself: a blocking call there (a sleep, a read) returns
                # with EINTR and the handler runs
                signal.pthread_kill(threading.main_thread().ident, self.SIGNAL)

    def _on_signal(self, signum, frame) -> None:
        if self._expired:
            raise _RewardTimeout

    def _run(self, kwargs: dict):
        if "metadata" in kwargs and not self._takes_metadata:
            kwargs = {k: v for k, v in kwargs.items() if k != "metadata"}
        result = self.reward_fn(**kwargs)
        if inspect.isawaitable(result):  # an `async def` reward
            result = asyncio.run(_awaited(result))
        return result

    def _call(self, kwargs: dict):
        main = threading.current_thread() is threading.main_thread()
        if not (main and self.timeout_s):
            return self._run(kwargs)
        if self._watch is None:
            self._watch = threading.Thread(target=self._watch_calls, daemon=True,
                                           name="vime reward watch")
            self._watch.start()
        previous = signal.signal(self.SIGNAL, self._on_signal)
        try:
            with self._lock:
                self._expired = False
                self._deadline = time.monotonic() + self.timeout_s
                self._lock.notify()
            try:
                return self._run(kwargs)
            finally:
                with self._lock:
                    self._deadline = None
        finally:
            signal.signal(self.SIGNAL, previous)

    def probe(self) -> None:
        """Nothing to check before the first rollout: load() imported the function."""

    def __call__(self, sample: Sample, **kwargs) -> tuple[float, dict[str, float]]:
        """(score, extras) of one sample.

        Raises:
            RewardError: the reward raised, timed out, or returned no finite number.
        """
        started = time.monotonic()
        try:
            ok, result = True, self._call(kwargs)
        except _RewardTimeout:
            raise RewardError(
                f"reward {self.name} did not return within rollout.reward_timeout_s = "
                f"{self.timeout_s:g} s on {sample.describe()}; make it faster or raise "
                "rollout.reward_timeout_s") from None
        except Exception as err:
            ok, result = False, err
        seconds = time.monotonic() - started
        if (self.timeout_s and seconds > self.timeout_s / 10
                and self._warned_rollout != sample.rollout):
            self._warned_rollout = sample.rollout
            self.log(f"vime: reward {self.name} took {seconds:.1f} s on {sample.describe()} "
                     f"(rollout.reward_timeout_s = {self.timeout_s:g} s)")
        if not ok:
            raise RewardError(f"reward {self.name} raised {type(result).__name__}: {result} on "
                              f"{sample.describe()}") from result
        try:
            value, extra = score(result)
        except RewardError as err:
            raise RewardError(f"reward {self.name} {err} on {sample.describe()}") from None
        if not math.isfinite(value):
            raise RewardError(f"reward {self.name} returned {value} on {sample.describe()}: "
                              "a score must be finite; nothing of this rollout was trained "
                              "or saved")
        return value, extra

    def score_many(self, samples: list[Sample], calls: list[dict]
                   ) -> list[tuple[float, dict[str, float]]]:
        """(score, extras) per sample, one call each, in order.

        Raises:
            RewardError: as __call__.
        """
        return [self(sample, **call) for sample, call in zip(samples, calls, strict=True)]


class ServerCaller:
    """Scores a rollout's samples on a reward server (runtime/rl/reward_server.py), each
    score checked as a reward function's is."""

    def __init__(self, server: RewardServer, timeout_s: float, log: Callable[[str], None]):
        self.server = RewardServer(server.url, timeout_s, server.retries, server.batch_size,
                                   server.backoff_s, log)
        self.name = server.url

    def probe(self) -> None:
        """POST the server an empty batch before the first rollout (RewardServer.probe).

        Raises:
            RewardError: the server refuses, cannot be reached, does not answer in time, or
                has no POST handler at the URL's path.
        """
        try:
            self.server.probe()
        except RewardServerError as err:
            raise RewardError(str(err)) from None

    def __call__(self, sample: Sample, **call) -> tuple[float, dict[str, float]]:
        """(score, extras) of one sample (a batch of one).

        Raises:
            RewardError: as score_many.
        """
        return self.score_many([sample], [call])[0]

    def score_many(self, samples: list[Sample], calls: list[dict]
                   ) -> list[tuple[float, dict[str, float]]]:
        """(score, extras) per sample, in batches.

        Raises:
            RewardError: the server stayed down, or returned no finite score for a sample.
        """
        try:
            returned = self.server.fetch(calls, lambda i: samples[i].describe())
        except RewardServerError as err:
            raise RewardError(str(err)) from None
        results = []
        for sample, result in zip(samples, returned, strict=True):
            try:
                value, extra = score(result)
            except RewardError as err:
                raise RewardError(f"reward server {self.name} {err} on "
                                  f"{sample.describe()}") from None
            if not math.isfinite(value):
                raise RewardError(f"reward server {self.name} returned {value} on "
                                  f"{sample.describe()}: a score must be finite; nothing of "
                                  "this rollout was trained or saved")
            results.append((value, extra))
        return results


def caller(reward_fn, timeout_s: float | None, log: Callable[[str], None] = print):
    """What scores a rollout's samples (score_many): a ServerCaller for the reward server
    load() returned for a URL, else a RewardCaller around the function."""
    if isinstance(reward_fn, RewardServer):
        return ServerCaller(reward_fn, timeout_s or 300.0, log)
    return RewardCaller(reward_fn, timeout_s, log)
