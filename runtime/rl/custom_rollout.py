"""Rollout functions (rollout.function = "module:function"): multi-turn, tool-calling and agent
rollouts written by the user, many samples in flight at once against the engines.

The loop (runtime/rl/loop.py) calls `CustomRollout.run` once per rollout; docs/runtime.md has
the contract in prose. An example, and how the samples' generate calls are batched so that a
resumed run repeats the uninterrupted one: docs/design.md, "Rollout functions".
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from runtime.core.interfaces import Generation, GenerationRequest, SamplingParams
from runtime.rl import rewards


def _run_leaving_tool_threads(coroutine):
    """asyncio.run, except that the threads of asyncio.to_thread calls a sample gave up on
    finish on their own: asyncio.run joins its default executor for up to 300 s
    (asyncio.constants.THREAD_JOIN_TIMEOUT) before returning."""
    with asyncio.Runner() as runner:
        tools = ThreadPoolExecutor(thread_name_prefix="vime-rollout-tool")
        loop = runner.get_loop()
        loop.set_default_executor(tools)
        try:
            return runner.run(coroutine)
        finally:
            tools.shutdown(wait=False, cancel_futures=True)
            # what Runner.close shuts down and joins: an executor that never started a thread
            loop.set_default_executor(ThreadPoolExecutor(max_workers=1))


class RolloutFunctionError(RuntimeError):
    """A rollout function raised, returned what is not a reward, or passed its time limit; the
    message names the function and the sample. Nothing of the rollout was trained or saved."""


class FunctionBlocked(Exception):  # noqa: N818  (raised into the blocking code itself)
    """Raised in a rollout function that blocked the event loop (synchronous code: a
    time.sleep, a blocking socket read) for longer than rollout.function_timeout_s."""


class TurnLimit(Exception):  # noqa: N818  (a limit reached, which a function may catch)
    """ctx.generate was called after rollout.max_turns calls, or with no token of
    rollout.max_total_tokens left; the sample ends as it is unless the function catches it."""


@dataclass(frozen=True)
class Turn:
    """What one ctx.generate call returned: the tokens the policy wrote, their log-probs (as
    the engine sampled them), why it stopped ("stop", "length") and the decoded text."""

    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    finish_reason: str
    text: str


def turn_seed(sample_seed: int, turn: int) -> int:
    """The engine's seed of a sample's turn, from the sample's seed (loop.request_seed)."""
    return (sample_seed * 1_000_033 + turn) % (1 << 62)


def load(name: str, spec_dir: str | None = None) -> Callable:
    """The function of rollout.function = "package.module:function", imported like a custom
    reward (runtime/rl/rewards.py load: the spec's folder first, then PYTHONPATH and the
    installed packages; V930 looks in the same places).

    Raises:
        ValueError: the name is not "module:function", or the module or function is missing.
    """
    module_name, sep, function = name.partition(":")
    if not sep or not module_name or not function:
        raise ValueError(f"rollout.function = {name!r} is not 'module.path:function'")
    if spec_dir and spec_dir not in sys.path:
        sys.path.insert(0, spec_dir)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"rollout.function = {name!r}: cannot import {module_name}: "
                         f"{err}") from err
    found = getattr(module, function, None)
    if found is None:
        raise ValueError(f"rollout.function = {name!r}: {module_name} has no {function}")
    if not asyncio.iscoroutinefunction(found):
        raise ValueError(f"rollout.function = {name!r} is not an `async def` function: it "
                         "awaits ctx.generate, so it must be one")
    return found


@dataclass
class RolloutContext:
    """What a rollout function gets for one sample.

    prompt, prompt_ids: the prompt as the engine sees it (after the chat template); label and
    metadata: the JSONL row's data.label_key and data.metadata_keys; params: the sampling
    parameters; seed: the sample's seed (each turn's engine seed derives from it); index: the
    sample in its rollout. token_ids / loss_mask: everything after the prompt so far, 1 where
    the policy wrote it."""

    prompt: str
    prompt_ids: tuple[int, ...]
    label: object
    metadata: dict
    params: SamplingParams
    seed: int
    index: int
    max_turns: int
    max_total_tokens: int
    tokenizer: object = field(repr=False)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    turns: int = 0
    finish_reason: str = "stop"
    _scheduler: _Scheduler | None = field(default=None, repr=False)
    _routes: list[np.ndarray] = field(default_factory=list, repr=False)

    @property
    def tokens_left(self) -> int:
        return self.max_total_tokens - len(self.token_ids)

    @property
    def text(self) -> str:
        """Everything after the prompt, decoded (generated and tool tokens, special tokens
        removed)."""
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=True)

    async def generate(self) -> Turn:
        """The policy's next turn: the engines continue prompt + everything appended so far,
        for at most min(rollout.max_response_len, the tokens left) tokens.

        Raises:
            TurnLimit: rollout.max_turns calls made, or no token left.
        """
        if self.turns >= self.max_turns:
            raise TurnLimit(f"rollout.max_turns = {self.max_turns} turns made")
        if self.tokens_left <= 0:
            raise TurnLimit(f"rollout.max_total_tokens = {self.max_total_tokens} reached")
        request = GenerationRequest(self.prompt_ids + tuple(self.token_ids),
                                    turn_seed(self.seed, self.turns))
        generation = await self._scheduler.submit(
            self, request, min(self.params.max_new_tokens, self.tokens_left))
        self.token_ids += generation.token_ids
        self.loss_mask += [1] * len(generation.token_ids)
        self.log_probs += generation.log_probs
        if generation.routed_experts is not None:
            self._routes.append(generation.routed_experts)
        self.turns += 1
        self.finish_reason = generation.finish_reason
        return Turn(tuple(generation.token_ids), tuple(generation.log_probs),
                    generation.finish_reason,
                    self.tokenizer.decode(generation.token_ids, skip_special_tokens=True))

    def append(self, text: str | None = None, token_ids: Sequence[int] | None = None,
               messages: Sequence[dict] | None = None) -> int:
        """Add tool or environment output to the context (loss mask 0: the model reads it and
        is not trained on it): text (tokenized as it is), token ids, or chat messages (through
        the tokenizer's chat template, with the generation prompt after them). Output beyond
        rollout.max_total_tokens is cut; returns the number of tokens added.

        Raises:
            ValueError: not exactly one of text, token_ids, messages; ids outside the
                vocabulary.
        """
        if sum(x is not None for x in (text, token_ids, messages)) != 1:
            raise ValueError("ctx.append takes one of text=, token_ids=, messages=")
        if messages is not None:
            text = self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                      add_generation_prompt=True)
        if text is not None:
            token_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = list(token_ids)
        vocabulary = len(self.tokenizer)
        bad = [t for t in ids if not isinstance(t, int | np.integer) or not 0 <= t < vocabulary]
        if bad:
            raise ValueError(f"ctx.append: token ids {bad[:5]} are not ids of the tokenizer's "
                             f"{vocabulary} tokens")
        ids = [int(t) for t in ids[:max(self.tokens_left, 0)]]
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)
        return len(ids)

    def routed_experts(self) -> np.ndarray | None:
        """The routes of every fed token [prompt + after-prompt tokens - 1, layers, top-k],
        each row from the first call that fed its token to the model: the prompt's and the
        first turn's from the first call, a tool span's (and the token before it) from the
        call after it, each turn's generated tokens from the call that generated them. Rows no
        call fed (tool output after the last turn) get experts 0..k-1: they are context after
        every trained token, which causal attention keeps them from reaching."""
        if not self._routes:
            return None
        rows = len(self.prompt_ids) + len(self.token_ids) - 1
        parts, filled = [], 0
        for routes in self._routes:
            parts.append(routes[filled:])
            filled = max(filled, len(routes))
        stitched = np.concatenate(parts)[:rows]
        if len(stitched) < rows:
            layers, top_k = stitched.shape[1:]
            free = np.broadcast_to(np.arange(top_k, dtype=stitched.dtype),
                                   (rows - len(stitched), layers, top_k))
            stitched = np.concatenate([stitched, free])
        return stitched


class _LoopWatch:
    """Interrupts a rollout function that blocks the event loop past the time limit: a tick
    task marks the loop alive every TICK_S; a thread that sees no tick (outside the engine
    calls) for timeout_s sends SIGUSR1 to the main thread, whose handler raises
    FunctionBlocked in the code running there. Only in the main thread (signals); elsewhere
    a blocked loop is not interrupted."""

    TICK_S = 0.05
    SIGNAL = signal.SIGUSR1

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.alive = time.monotonic()
        self.in_engine = False
        self.fired = False
        self.stop = threading.Event()

    async def tick(self) -> None:
        while True:
            self.alive = time.monotonic()
            await asyncio.sleep(self.TICK_S)

    def _watch(self, main_ident: int) -> None:
        while not self.stop.wait(self.TICK_S):
            if self.in_engine:
                self.alive = time.monotonic()
            elif time.monotonic() - self.alive > self.timeout_s:
                self.fired = True
                signal.pthread_kill(main_ident, self.SIGNAL)
                return

    def _on_signal(self, signum, frame) -> None:
        if self.fired and not self.stop.is_set():
            raise FunctionBlocked(f"it blocked the event loop for more than "
                                  f"rollout.function_timeout_s = {self.timeout_s:g} s "
                                  "(synchronous code: make tools async, or run them in "
                                  "asyncio.to_thread)")

    @contextlib.contextmanager
    def watching(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(self.SIGNAL, self._on_signal)
        thread = threading.Thread(target=self._watch, args=(threading.get_ident(),),
                                  daemon=True, name="vime rollout-function watch")
        thread.start()
        try:
            yield
        finally:
            self.stop.set()
            thread.join()
            signal.signal(self.SIGNAL, previous)


@dataclass
class _Waiting:
    ctx: RolloutContext
    request: GenerationRequest
    max_new_tokens: int
    future: asyncio.Future


class _Scheduler:
    """Runs the samples' tasks and sends their generate calls in batches."""

    def __init__(self, generate: Callable, params: SamplingParams, timeout_s: float,
                 describe: Callable[[int], str], name: str):
        self.generate, self.params, self.timeout_s = generate, params, timeout_s
        self.watch = _LoopWatch(timeout_s)
        self.describe, self.name = describe, name
        self.waiting: list[_Waiting] = []
        self.changed: asyncio.Event | None = None
        self.outside_since: dict[int, float] = {}  # sample -> when it last left generate

    def submit(self, ctx: RolloutContext, request: GenerationRequest,
               max_new_tokens: int) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(_Waiting(ctx, request, max_new_tokens, future))
        self.changed.set()
        return future

    def _send(self) -> None:
        """One engine call per distinct token budget, the requests in sample order."""
        waiting, self.waiting = sorted(self.waiting, key=lambda w: w.ctx.index), []
        for budget in sorted({w.max_new_tokens for w in waiting}):
            group = [w for w in waiting if w.max_new_tokens == budget]
            self.watch.in_engine = True
            try:
                generations = self.generate([w.request for w in group],
                                            replace(self.params, max_new_tokens=budget))
            finally:
                self.watch.alive, self.watch.in_engine = time.monotonic(), False
            now = time.monotonic()
            for item, generation in zip(group, generations, strict=True):
                item.future.set_result(generation)
                self.outside_since[item.ctx.index] = now

    async def run(self, tasks: dict[int, asyncio.Task]) -> None:
        self.changed = asyncio.Event()
        for task in tasks.values():
            task.add_done_callback(lambda _task: self.changed.set())
        now = time.monotonic()
        self.outside_since = dict.fromkeys(tasks, now)
        while True:
            self._raise_failed(tasks)
            live = [i for i, task in tasks.items() if not task.done()]
            if not live:
                return
            waiting = {w.ctx.index for w in self.waiting}
            if len(waiting) == len(live):
                self._send()
                await asyncio.sleep(0)  # the woken tasks run up to their next await
                continue
            busy = [i for i in live if i not in waiting]
            first = min(busy, key=lambda i: self.outside_since[i])
            left = self.outside_since[first] + self.timeout_s - time.monotonic()
            if left <= 0:
                raise RolloutFunctionError(
                    f"rollout function {self.name} spent more than rollout.function_timeout_s "
                    f"= {self.timeout_s:g} s outside ctx.generate on {self.describe(first)}; "
                    "nothing of this rollout was trained or saved")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    def _raise_failed(self, tasks: dict[int, asyncio.Task]) -> None:
        for index, task in tasks.items():
            if task.done() and not task.cancelled() and task.exception() is not None:
                err = task.exception()
                if isinstance(err, TurnLimit):
                    continue
                raise RolloutFunctionError(
                    f"rollout function {self.name} raised {type(err).__name__}: {err} on "
                    f"{self.describe(index)}; nothing of this rollout was trained or "
                    "saved") from err


# problems of one sample a message lists; the rest are counted
SHOWN_PROBLEMS = 3


def _real(value) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool)


def _column(ctx: RolloutContext, name: str) -> tuple[list | None, str | None]:
    """ctx.<name> as a list, or a problem when the function replaced it by what is not a
    sequence."""
    value = getattr(ctx, name)
    if isinstance(value, list | tuple | np.ndarray):
        return list(value), None
    return None, f"ctx.{name} is a {type(value).__name__}, not a list"


def _first_bad(column: list, name: str, bad: Callable, why: Callable) -> str | None:
    """A problem naming column's first entry for which bad(entry), with the count of such."""
    found = [i for i, value in enumerate(column) if bad(value)]
    if not found:
        return None
    more = f" ({len(found)} such entries)" if len(found) > 1 else ""
    return f"ctx.{name}[{found[0]}] {why(column[found[0]])}{more}"


def sample_problems(ctx: RolloutContext, vocabulary: int) -> list[str]:
    """What is wrong with the sample a rollout function left in ctx, in the words of messages:
    token ids that are not ints of the model's vocabulary (0 to vocabulary - 1), a loss mask
    or log-probs not of the tokens' length, mask entries other than 0 and 1, log-probs that
    are not finite numbers, no token at all. Empty: the sample can be trained on."""
    problems = []
    ids, problem = _column(ctx, "token_ids")
    if problem:
        return [problem]
    if not ids:
        return ["no token after the prompt (ctx.token_ids is empty): a sample needs tokens "
                "the policy wrote; to train on none of them, set its ctx.loss_mask to 0s"]
    problems.append(_first_bad(
        ids, "token_ids", lambda t: not isinstance(t, int | np.integer) or isinstance(t, bool),
        lambda t: f"is {t!r}, a {type(t).__name__}, not an int token id"))
    problems.append(_first_bad(
        ids, "token_ids",
        lambda t: isinstance(t, int | np.integer) and not 0 <= t < vocabulary,
        lambda t: f"= {t} is outside the model's vocabulary (ids 0 to {vocabulary - 1})"))
    for name in ("loss_mask", "log_probs"):
        column, problem = _column(ctx, name)
        if problem or len(column) != len(ids):
            problems.append(problem or f"ctx.{name} has {len(column)} entries for the "
                            f"{len(ids)} tokens of ctx.token_ids")
        elif name == "loss_mask":
            problems.append(_first_bad(
                column, name, lambda m: not (_real(m) or isinstance(m, bool))
                or m not in (0, 1),
                lambda m: f"is {m!r}: an entry is 1 (the policy's token, trained) or 0 "
                          "(context)"))
        else:
            problems.append(_first_bad(
                column, name, lambda v: not _real(v) or not math.isfinite(v),
                lambda v: f"is {v!r}, not a finite log-probability"))
    return [p for p in problems if p]


@dataclass(frozen=True)
class CustomSamples:
    """A rollout's samples from a rollout function: one Generation each (token_ids are
    everything after the prompt, loss_mask marks the policy's tokens), and what each
    function call returned (None: the spec's reward scores it)."""

    generations: list[Generation]
    returned: list[object]
    turns: list[int]


class CustomRollout:
    """Runs a rollout function over a rollout's samples (the loop's generate step)."""

    def __init__(self, function: Callable, generate: Callable, tokenizer,
                 params: SamplingParams, max_turns: int, max_total_tokens: int,
                 timeout_s: float, vocab_size: int | None = None):
        self.function, self.generate, self.tokenizer = function, generate, tokenizer
        self.params, self.max_turns, self.max_total_tokens = params, max_turns, max_total_tokens
        self.timeout_s = timeout_s
        # token ids index the model's embedding rows, which may outnumber the tokenizer's
        self.vocabulary = max(len(tokenizer), vocab_size or 0)
        self.name = rewards.function_name(function)

    def run(self, prompts: Sequence, seeds: Sequence[int],
            describe: Callable[[int], str]) -> CustomSamples:
        """One sample per seed; sample i is of prompts[i // (len(seeds) // len(prompts))].

        Raises:
            RolloutFunctionError: a call raised, returned no reward nor None, generated
                nothing, left a malformed sample in ctx (sample_problems), or passed
                rollout.function_timeout_s (naming the sample).
        """
        per_prompt = len(seeds) // len(prompts)
        contexts = []
        for index, seed in enumerate(seeds):
            prompt = prompts[index // per_prompt]
            contexts.append(RolloutContext(
                prompt=prompt.text, prompt_ids=tuple(prompt.token_ids), label=prompt.label,
                metadata=dict(prompt.metadata or {}), params=self.params, seed=seed,
                index=index, max_turns=self.max_turns, max_total_tokens=self.max_total_tokens,
                tokenizer=self.tokenizer))
        scheduler = _Scheduler(self.generate, self.params, self.timeout_s, describe, self.name)
        with scheduler.watch.watching():
            returned = _run_leaving_tool_threads(self._run_all(contexts, scheduler))
        for ctx in contexts:
            if not ctx.turns:
                raise RolloutFunctionError(
                    f"rollout function {self.name} returned without a ctx.generate call on "
                    f"{describe(ctx.index)}: a sample needs tokens the policy wrote")
        self._check_samples(contexts, per_prompt, describe)
        generations = []
        for ctx, result in zip(contexts, returned, strict=True):
            if result is not None:
                try:
                    value, _extra = rewards.score(result)
                    if not math.isfinite(value):
                        raise rewards.RewardError(f"returned {value}, not a finite score")
                except rewards.RewardError as err:
                    raise RolloutFunctionError(
                        f"rollout function {self.name} {err} on {describe(ctx.index)}: return "
                        "None (the spec's reward scores it), a float or a dict with a float "
                        "'score'") from None
            generations.append(Generation(
                [int(t) for t in ctx.token_ids], [float(v) for v in ctx.log_probs],
                "length" if ctx.tokens_left <= 0 else ctx.finish_reason,
                ctx.routed_experts(), loss_mask=[int(m) for m in ctx.loss_mask]))
        return CustomSamples(generations, list(returned), [c.turns for c in contexts])

    def _check_samples(self, contexts: list[RolloutContext], per_prompt: int,
                       describe: Callable[[int], str]) -> None:
        """Raises RolloutFunctionError naming the first sample sample_problems finds wrong,
        what is wrong with it, and how many other samples are."""
        malformed = [(ctx, problems) for ctx in contexts
                     if (problems := sample_problems(ctx, self.vocabulary))]
        if not malformed:
            return
        ctx, problems = malformed[0]
        shown = "; ".join(problems[:SHOWN_PROBLEMS]) + (
            f"; and {len(problems) - SHOWN_PROBLEMS} more" if len(problems) > SHOWN_PROBLEMS
            else "")
        others = (f" {len(malformed) - 1} other sample(s) of the rollout are malformed too."
                  if len(malformed) > 1 else "")
        raise RolloutFunctionError(
            f"rollout function {self.name} left a malformed sample on {describe(ctx.index)}, "
            f"sample {ctx.index % per_prompt} of its prompt's {per_prompt}: {shown}.{others} "
            "Nothing of this rollout was trained or saved")

    async def _run_all(self, contexts: list[RolloutContext], scheduler: _Scheduler) -> list:
        async def one(ctx: RolloutContext):
            try:
                return await self.function(ctx)
            except TurnLimit:
                return None

        for ctx in contexts:
            ctx._scheduler = scheduler
        tasks = {ctx.index: asyncio.create_task(one(ctx)) for ctx in contexts}
        tick = asyncio.create_task(scheduler.watch.tick())
        try:
            await scheduler.run(tasks)
        finally:
            # the samples are done: what follows (cancelled tasks, asyncio.run waiting for
            # the threads of asyncio.to_thread tools still running) is not a blocked function
            scheduler.watch.stop.set()
            for task in (*tasks.values(), tick):
                task.cancel()
            await asyncio.gather(*tasks.values(), tick, return_exceptions=True)
        return [tasks[ctx.index].result() for ctx in contexts]
