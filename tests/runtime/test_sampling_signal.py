"""Dynamic sampling that keeps no group says so: the log line of such a rollout names the
groups kept and filtered, the attempts, the rewards seen and what to try; the console line
and metrics.jsonl show kept and filtered groups and the rollouts in a row that kept none; and
after MAX_EMPTY_ROLLOUTS of them the run stops (the loop on the torch pair, in this process,
with a constant reward from this module)."""

from __future__ import annotations

import types

import pytest
from runtimekit import in_process_loop, job_config, metrics

from runtime.core.slices import SamplingPolicy
from runtime.rl.data import Prompt
from runtime.rl.metrics import sampling_parts
from runtime.rl.sampling import MAX_EMPTY_ROLLOUTS, Group, NoSignalError, Refill


def constant_reward(prompt, response, label):
    return 0.0


def _group(rewards) -> Group:
    prompt = Prompt(0, "What is 3 + 4?", (1, 2), "7")
    generations = [types.SimpleNamespace(token_ids=[i]) for i in range(len(rewards))]
    return Group(prompt, [None] * len(rewards), generations, list(rewards), list(rewards))


POLICY = SamplingPolicy(dynamic_sampling=True, over_sampling_batch_size=4, max_attempts=2)


def test_a_rollout_that_kept_no_group_says_why_and_what_to_try():
    constant = Refill(POLICY, wanted=4)
    constant.add([_group([0.0] * 4)] * 4)
    constant.add([_group([0.0] * 4)] * 4)
    line = constant.report(7)
    assert line.startswith("vime: rollout 7: DYNAMIC SAMPLING KEPT NO GROUP: 8 group(s) "
                           "filtered in 2 attempt(s) (rollout.dynamic_sampling_max_attempts = 2)")
    assert ("this rollout trains on nothing. Every sample of the rollout scored 0: check that "
            "rollout.reward tells responses apart") in line

    saturated = Refill(POLICY, wanted=4)  # each prompt all right or all wrong
    saturated.add([_group([1.0] * 4), _group([0.0] * 4)] * 2)
    saturated.add([_group([1.0] * 4)] * 4)
    assert "rewards seen: 0, 1" in saturated.report(0)
    assert "raise rollout.temperature" in saturated.report(0)

    short = Refill(POLICY, wanted=4)
    short.add([_group([0.0, 1.0, 0.0, 0.0])] + [_group([1.0] * 4)] * 3)
    short.add([_group([1.0] * 4)] * 4)
    assert short.report(3) == ("vime: rollout 3: dynamic sampling kept 1 of 4 groups after 2 "
                               "attempt(s) (7 filtered); 3 filtered group(s) complete the "
                               "batch with advantage 0")
    full = Refill(POLICY, wanted=1)
    full.add([_group([0.0, 1.0, 0.0, 0.0])])
    assert full.report(3) is None


def test_the_console_line_shows_kept_and_filtered_groups():
    assert sampling_parts({"reward/mean": 0.5}) == []
    assert sampling_parts({"rollout/groups_kept": 3, "rollout/groups_filtered": 5,
                           "rollout/empty_streak": 0}) == ["groups kept 3 filtered 5"]
    assert sampling_parts({"rollout/groups_kept": 0, "rollout/groups_filtered": 16,
                           "rollout/empty_streak": 4}) == [
        "groups kept 0 filtered 16 NO GROUP KEPT (4 in a row)"]


def test_a_run_that_keeps_no_group_stops_after_max_empty_rollouts(tmp_path):
    lines: list[str] = []
    _, _, config = job_config(
        tmp_path, rollout__num_rollout=str(MAX_EMPTY_ROLLOUTS + 5),
        rollout__reward='"test_sampling_signal:constant_reward"',
        rollout__dynamic_sampling="true", rollout__dynamic_sampling_max_attempts="2",
        rollout__batch_size="2", rollout__n_samples_per_prompt="4", train__micro_batch_size="4",
        eval__at_start="false", checkpoint__save_interval="1000")
    loop = in_process_loop(config, log=lines.append)
    with pytest.raises(NoSignalError) as caught:
        loop.run()
    message = str(caught.value)
    assert (f"rollouts 0 to {MAX_EMPTY_ROLLOUTS - 1}: dynamic sampling kept no group in "
            f"{MAX_EMPTY_ROLLOUTS} rollouts in a row") in message
    assert "the run stops. Every sample of the rollout scored 0" in message
    records = metrics(config.job_dir)
    assert [r["rollout/empty_streak"] for r in records] == list(range(1, MAX_EMPTY_ROLLOUTS + 1))
    assert all(r["rollout/groups_kept"] == 0 and r["rollout/sampling_attempts"] == 2
               for r in records)
    loud = [line for line in lines if "DYNAMIC SAMPLING KEPT NO GROUP" in line]
    assert len(loud) == MAX_EMPTY_ROLLOUTS
    console = [line for line in lines if line.startswith("rollout ")]
    assert all("groups kept 0 filtered 4 NO GROUP KEPT" in line for line in console)
