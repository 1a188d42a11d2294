"""Rollout functions (rollout.function) in this process on the torch pair (no Ray): the
two-turn calculator of specs/tiny_cpu_tools.toml trains with its tool tokens masked and R3
stitched over the turns; a resumed run repeats the uninterrupted one; a function that raises,
returns what is not a reward, or hangs stops the rollout naming the function and the sample,
with nothing trained, saved or advanced."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from runtimekit import ROOT, compile_spec, in_process_loop, metrics, run_to_weights, sets_for

from runtime.core.interfaces import TrainBatch
from runtime.core.slices import JobConfig
from runtime.node.preflight import function_problem
from runtime.rl.custom_rollout import RolloutFunctionError

TOOLS = ROOT / "specs" / "tiny_cpu_tools.toml"


def tools_config(tmp_path: Path, job: str = "job", **keys) -> JobConfig:
    plan, resolved = compile_spec(TOOLS, sets_for(tmp_path, **keys))
    job_dir = tmp_path / "runs" / "tiny-cpu-tools" / job
    job_dir.mkdir(parents=True, exist_ok=True)
    return JobConfig.from_job(plan, resolved, job_dir)


def _run(tmp_path, job, rollouts):
    config = tools_config(tmp_path, job, rollout__num_rollout=str(rollouts),
                          checkpoint__save_interval="2", train__routing_replay="true")
    return config, run_to_weights(config)


def test_two_turn_tool_rollouts_train_masked_and_resume_exactly(tmp_path):
    config, straight = _run(tmp_path / "a", "straight", 4)
    records = metrics(config.job_dir)
    assert all(r["rollout/turns_mean"] == 2.0 for r in records)
    # " calc : 7 " is 3 of every sample's at most 15 after-prompt tokens
    assert all(0.15 < r["rollout/masked_token_share"] < 0.5 for r in records)
    # R3 stitched over the turns: the engine's routes replayed, the actor's old log-probs on
    # the policy's tokens are the engine's
    assert all(r["rollout/logprob_abs_diff"] < 1e-5 for r in records)
    assert all(r["train/grad_norm"] > 0 for r in records)
    _run(tmp_path / "b", "first", 2)
    resumed_config, resumed = _run(tmp_path / "b", "resumed", 4)
    got = metrics(resumed_config.job_dir)
    assert [r["rollout"] for r in got] == [2, 3]
    for want, have in zip(records[2:], got, strict=True):
        for key in ("reward/mean", "train/pg_loss", "rollout/masked_token_share",
                    "response_len/mean"):
            assert have[key] == pytest.approx(want[key], abs=1e-6), key
    assert max(float((straight[n] - resumed[n]).abs().max()) for n in straight) <= 1e-6


def test_a_tool_token_never_reaches_the_loss(tmp_path):
    """Two batches that differ only in what the loss would read at a tool token (its old and
    rollout log-probs) train the same weights when the token is masked; unmasked they do not."""
    config = tools_config(tmp_path)

    def step(garbage: bool, masked: bool):
        loop = in_process_loop(config)
        backend = loop.train.workers[0].backend
        prompt, response = [3, 4, 5], [7, 27, 19, 8]  # 27, 19: a tool's "calc :"
        batch = TrainBatch(tokens=[prompt + response], prompt_lens=[3], advantages=[1.0],
                           loss_mask=[[1, 0, 0, 1]] if masked else None)
        old = backend.log_probs(batch, "actor")[0]
        if garbage:
            old = [old[0], old[1] - 5.0, old[2] + 3.0, old[3]]
        batch.old_log_probs, batch.rollout_log_probs = [old], [old]
        batch.step_response_tokens, batch.step_samples = sum(batch.trained_tokens()), 1
        stats = backend.train_step(batch)
        return stats, {n: p.detach().clone() for n, p in backend.params.items()}

    clean, clean_weights = step(False, True)
    dirty, dirty_weights = step(True, True)
    assert clean["response_tokens"] == dirty["response_tokens"] == 2
    assert dirty["pg_loss"] == pytest.approx(clean["pg_loss"], abs=1e-7)
    assert all(torch.equal(clean_weights[n], dirty_weights[n]) for n in clean_weights)
    unmasked, _ = step(True, False)
    assert unmasked["response_tokens"] == 4
    assert unmasked["pg_loss"] != pytest.approx(clean["pg_loss"], abs=1e-4)


async def raises(ctx):
    await ctx.generate()
    if ctx.index == 5:
        raise KeyError("no tool named 'calc'")
    return 0.0


async def not_a_reward(ctx):
    await ctx.generate()
    return "0.5" if ctx.index == 3 else 0.0


async def hangs(ctx):
    await ctx.generate()
    if ctx.index == 2:
        await asyncio.sleep(3600)
    return 0.0


async def blocks(ctx):
    await ctx.generate()
    if ctx.index == 4:
        time.sleep(3600)  # a synchronous tool: the event loop stops with it
    return 0.0


async def never_generates(ctx):
    return 1.0


@pytest.mark.parametrize(("function", "words"), [
    (raises, ["raised KeyError", "no tool named 'calc'", "sample 5"]),
    (not_a_reward, ["returned '0.5', a str", "sample 3"]),
    (hangs, ["rollout.function_timeout_s = 0.5 s", "sample 2"]),
    (blocks, ["raised FunctionBlocked", "blocked the event loop", "sample 4"]),
    (never_generates, ["without a ctx.generate call", "sample 0"]),
], ids=["raises", "not-a-reward", "hangs", "blocks", "no-generate"])
def test_a_failing_function_is_named_and_nothing_advances(tmp_path, function, words):
    config = tools_config(tmp_path, rollout__function_timeout_s="0.5")
    loop = in_process_loop(config)
    loop.custom.function, loop.custom.name = function, f"tests:{function.__name__}"
    with pytest.raises(RolloutFunctionError) as caught:
        loop.run()
    message = str(caught.value)
    assert f"tests:{function.__name__}" in message and "rollout 0" in message
    for word in words:
        assert word in message
    assert (loop.next_rollout, loop.version) == (0, 1)
    assert not (config.job_dir / "metrics.jsonl").exists() or not metrics(config.job_dir)
    assert not list(config.save_dir.glob("rollout_*"))


def test_metadata_keys_reach_the_function_and_a_missing_one_names_the_line(tmp_path):
    data = tmp_path / "rows.jsonl"
    first = json.dumps({"prompt": "What is 1 + 2?", "label": "3", "operands": [1, 2]})
    data.write_text(first + "\n" + json.dumps({"prompt": "What is 2 + 2?", "label": "4",
                                               "operands": [2, 2]}) + "\n")
    config = tools_config(tmp_path, data__prompt_data=json.dumps(str(data)))
    # the plan reads the file (V734); the driver reads it again, as it is when the job runs
    data.write_text(first + "\n" + json.dumps({"prompt": "What is 2 + 2?", "label": "4"}) + "\n")
    with pytest.raises(ValueError, match=r"rows.jsonl:2: no key 'operands'"):
        in_process_loop(config)


def test_preflight_names_a_function_missing_or_not_async():
    assert function_problem("runtime.toy_tools:rollout") is None
    assert function_problem(None) is None
    assert "is not an `async def` function" in function_problem("runtime.toy:reward")
    assert "runtime.toy_tools has no rollouts" in function_problem("runtime.toy_tools:rollouts")
    assert "cannot import no_such_module" in function_problem("no_such_module:rollout")


async def leaves_a_tool_thread(ctx):
    if ctx.index == 1:  # a tool given up on: its thread runs on after the sample is done
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(time.sleep, 1.5), 0.05)
    await ctx.generate()
    return 0.0


def test_a_tool_thread_outliving_its_sample_is_not_a_blocked_function(tmp_path):
    config = tools_config(tmp_path, rollout__function_timeout_s="0.5", rollout__num_rollout="1")
    loop = in_process_loop(config)
    loop.custom.function = leaves_a_tool_thread
    loop.run()  # asyncio.run waits for the thread after the samples: no tick, no function
    assert [record["rollout"] for record in metrics(config.job_dir)] == [0]


RELEASE = threading.Event()


def held_tool():
    RELEASE.wait(60)  # released by the test once the rollout is back


async def abandons_a_held_tool(ctx):
    if ctx.index == 1:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(held_tool), 0.05)
    await ctx.generate()
    return 0.0


def test_the_rollout_does_not_wait_for_a_tool_thread_its_sample_gave_up_on(tmp_path):
    """asyncio.run joins the default executor's threads (up to 300 s) before returning; the
    rollout leaves a given-up tool's thread to finish on its own."""
    RELEASE.clear()
    config = tools_config(tmp_path, rollout__function_timeout_s="0.5", rollout__num_rollout="1")
    loop = in_process_loop(config)
    loop.custom.function = abandons_a_held_tool
    try:
        loop.run()
        held = [t for t in threading.enumerate() if t.name.startswith("vime-rollout-tool")]
        assert any(t.is_alive() for t in held), "the rollout waited for the tool's thread"
    finally:
        RELEASE.set()
    assert [record["rollout"] for record in metrics(config.job_dir)] == [0]


def test_routes_keep_each_row_from_the_first_call_that_fed_its_token():
    """Prompt of 3 tokens, turn 1 of 2 tokens, a tool span of 2, turn 2 of 2, a tool span of 1
    after the last turn: call 1 reports rows 0-3 (prompt + turn 1 - 1), call 2 rows 0-7; the
    sample's 3 + 7 tokens have 9 rows."""
    from runtime.core.interfaces import SamplingParams
    from runtime.rl.custom_rollout import RolloutContext

    ctx = RolloutContext(prompt="", prompt_ids=(1, 2, 3), label=None, metadata={},
                         params=SamplingParams(1.0, 1.0, 4, ()), seed=0, index=0, max_turns=2,
                         max_total_tokens=16, tokenizer=None)
    ctx.token_ids = [10, 11, 20, 21, 12, 13, 22]  # turn, tool, turn, tool
    first = np.full((4, 2, 2), 1)  # call 1: [layers 2, top-k 2] per fed row
    second = np.full((8, 2, 2), 2)
    ctx._routes = [first, second]
    routes = ctx.routed_experts()
    assert routes.shape == (9, 2, 2)
    assert (routes[:4] == 1).all()  # prompt and turn 1: as call 1 routed them
    assert (routes[4:8] == 2).all()  # turn 1's last token, the tool span, turn 2: call 2
    assert routes[8].tolist() == [[0, 1], [0, 1]]  # the trailing tool token: fed by no call
