"""Dynamic sampling that keeps no group says so: the log line of such a rollout names the
groups kept and filtered, the attempts, the rewards seen and what to try; the console line
and metrics.jsonl show kept and filtered groups and the rollouts in a row that kept none; and
after rollout.dynamic_sampling_max_empty_rollouts of them the run stops, never with 0, counting
on across a resume (the loop on the torch pair, in this process, with a constant reward from
this module)."""

from __future__ import annotations

import types

import pytest
from runtimekit import in_process_loop, job_config, metrics

from runtime.core.slices import SamplingPolicy
from runtime.rl.data import Prompt
from runtime.rl.metrics import sampling_parts
from runtime.rl.sampling import Group, NoSignalError, Refill


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


MAX_EMPTY = 3


def _constant_reward_config(tmp_path, num_rollout: int, max_empty: int = MAX_EMPTY, **keys):
    return job_config(
        tmp_path, rollout__num_rollout=str(num_rollout),
        rollout__reward='"test_sampling_signal:constant_reward"',
        rollout__dynamic_sampling="true", rollout__dynamic_sampling_max_attempts="2",
        rollout__dynamic_sampling_max_empty_rollouts=str(max_empty),
        rollout__batch_size="2", rollout__n_samples_per_prompt="4", train__micro_batch_size="4",
        eval__at_start="false", **{"checkpoint__save_interval": "1000", **keys})[2]


def test_a_run_that_keeps_no_group_stops_after_max_empty_rollouts(tmp_path):
    lines: list[str] = []
    config = _constant_reward_config(tmp_path, MAX_EMPTY + 2)
    assert config.sampling.max_empty_rollouts == MAX_EMPTY
    loop = in_process_loop(config, log=lines.append)
    with pytest.raises(NoSignalError) as caught:
        loop.run()
    message = str(caught.value)
    assert (f"rollouts 0 to {MAX_EMPTY - 1}: dynamic sampling kept no group in "
            f"{MAX_EMPTY} rollouts in a row") in message
    assert (f"the run stops (rollout.dynamic_sampling_max_empty_rollouts = {MAX_EMPTY}; 0 never "
            "stops). Every sample of the rollout scored 0") in message
    records = metrics(config.job_dir)
    assert [r["rollout/empty_streak"] for r in records] == list(range(1, MAX_EMPTY + 1))
    assert all(r["rollout/groups_kept"] == 0 and r["rollout/sampling_attempts"] == 2
               for r in records)
    loud = [line for line in lines if "DYNAMIC SAMPLING KEPT NO GROUP" in line]
    assert len(loud) == MAX_EMPTY
    console = [line for line in lines if line.startswith("rollout ")]
    assert all("groups kept 0 filtered 4 NO GROUP KEPT" in line for line in console)


def test_a_limit_of_0_never_stops(tmp_path):
    config = _constant_reward_config(tmp_path, 3, max_empty=0)
    in_process_loop(config).run()
    assert [r["rollout/empty_streak"] for r in metrics(config.job_dir)] == [1, 2, 3]


def test_the_streak_counts_on_across_a_resume(tmp_path):
    # two empty rollouts, checkpointed; the resumed run's first empty one is the third in a row
    first = _constant_reward_config(tmp_path, 2, checkpoint__save_interval="1")
    in_process_loop(first).run()
    resumed = _constant_reward_config(tmp_path, MAX_EMPTY + 3, checkpoint__save_interval="1")
    loop = in_process_loop(resumed)
    assert loop.restore() and loop.empty_streak == 2
    with pytest.raises(NoSignalError, match=f"rollouts 0 to 2: dynamic sampling kept no group "
                                            f"in {MAX_EMPTY} rollouts in a row"):
        loop.run()
    assert [r["rollout/empty_streak"] for r in metrics(resumed.job_dir)] == [1, 2, 3]
