"""A rollout function's samples are checked where the function returns them: token ids that
are no ints of the vocabulary, a loss mask of other numbers than 0 and 1 or of the wrong
length, log-probs that are not numbers, an emptied sample stop the rollout naming the
function, the sample and what is wrong, before anything is trained; samples whose loss mask
is all 0 train nothing and are counted, and a step of them alone is named as such (in this
process on the torch pair, specs/tiny_cpu_tools.toml)."""

from __future__ import annotations

import pytest
from runtimekit import in_process_loop, metrics
from test_custom_rollout import tools_config

from runtime.rl.custom_rollout import RolloutFunctionError

BAD = 3  # the sample each malformed function spoils


def reward(ctx) -> float:
    return 0.5 + 0.1 * (ctx.index % 2)  # groups of differing rewards: every advantage != 0


async def mask_of_sevens(ctx):
    await ctx.generate()
    ctx.loss_mask[:] = [7] * len(ctx.loss_mask)
    return reward(ctx)


async def string_token(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.token_ids[0] = "7"
    return reward(ctx)


async def float_token(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.token_ids[0] = 3.0
    return reward(ctx)


async def out_of_vocabulary(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.token_ids[-1] = 99999
    return reward(ctx)


async def short_mask(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.loss_mask.pop()
    return reward(ctx)


async def text_log_prob(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.log_probs[0] = "-0.5"
    return reward(ctx)


async def emptied(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.token_ids.clear()
        ctx.loss_mask.clear()
        ctx.log_probs.clear()
    return reward(ctx)


async def replaced(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.token_ids = "7 8 9"
    return reward(ctx)


def run_rollout(tmp_path, function, log=None):
    config = tools_config(tmp_path, rollout__num_rollout="1")
    loop = in_process_loop(config, **({"log": log} if log else {}))
    loop.custom.function, loop.custom.name = function, f"tests:{function.__name__}"
    loop.run()
    return config, loop


@pytest.mark.parametrize(("function", "words"), [
    (mask_of_sevens, ["ctx.loss_mask[0] is 7: an entry is 1 (the policy's token, trained) or "
                      "0 (context)", "63 other sample(s) of the rollout are malformed too"]),
    (string_token, ["ctx.token_ids[0] is '7', a str, not an int token id"]),
    (float_token, ["ctx.token_ids[0] is 3.0, a float, not an int token id"]),
    (out_of_vocabulary, ["= 99999 is outside the model's vocabulary (ids 0 to 35)"]),
    (short_mask, ["ctx.loss_mask has", "entries for the", "tokens of ctx.token_ids"]),
    (text_log_prob, ["ctx.log_probs[0] is '-0.5', not a finite log-probability"]),
    (emptied, ["no token after the prompt (ctx.token_ids is empty)"]),
    (replaced, ["ctx.token_ids is a str, not a list"]),
], ids=lambda value: getattr(value, "__name__", ""))
def test_a_malformed_sample_is_named_where_the_function_returns_it(tmp_path, function, words):
    with pytest.raises(RolloutFunctionError) as caught:
        run_rollout(tmp_path, function)
    message = str(caught.value)
    first = 0 if function is mask_of_sevens else BAD
    assert (f"rollout function tests:{function.__name__} left a malformed sample on rollout 0, "
            f"sample {first} (prompt at ") in message
    assert f"sample {first} of its prompt's 8: " in message
    for word in words:
        assert word in message
    assert "Nothing of this rollout was trained or saved" in message
    config = tools_config(tmp_path, rollout__num_rollout="1")
    assert not (config.job_dir / "metrics.jsonl").exists() or not metrics(config.job_dir)
    assert not list(config.save_dir.glob("rollout_*"))


async def masks_everything(ctx):
    await ctx.generate()
    ctx.loss_mask[:] = [0] * len(ctx.loss_mask)
    return reward(ctx)


async def masks_one_per_group(ctx):
    await ctx.generate()
    if ctx.index % 8 == BAD:
        ctx.loss_mask[:] = [0] * len(ctx.loss_mask)
    return reward(ctx)


def test_a_step_with_no_trained_token_says_so_and_not_to_lower_the_lr(tmp_path):
    with pytest.raises(RolloutFunctionError) as caught:
        run_rollout(tmp_path, masks_everything)
    message = str(caught.value)
    assert ("rollout 0, optimizer step 0: none of its 32 samples (rollout function "
            "tests:masks_everything) has a trained token") in message
    assert "lr" not in message


def test_samples_masked_whole_train_nothing_and_are_counted(tmp_path):
    lines: list[str] = []
    config, _ = run_rollout(tmp_path, masks_one_per_group, log=lines.append)
    (record,) = metrics(config.job_dir)
    assert record["rollout/untrained_samples"] == 8
    assert 0.0 < record["rollout/masked_token_share"] < 1.0
    assert record["train/grad_norm"] > 0
    assert any("rollout 0: 8 of 64 samples of rollout function tests:masks_one_per_group "
               "have a loss mask of 0s only" in line for line in lines)
