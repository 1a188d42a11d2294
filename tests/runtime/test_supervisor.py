"""Rollout engines under the supervisor, on a real Ray with logical GPUs and the torch pair
in Ray actors: an engine killed in the middle of a generation is replaced on its bundle,
given the current weights, and its requests retried; past max_restarts the run stops with
an error naming the engine and its node."""

from __future__ import annotations

import threading
import time

import pytest
from runtimekit import busy, job_config

from runtime.core.interfaces import GenerationRequest, SamplingParams
from runtime.node import placement
from runtime.workers import actors, supervisor


@pytest.fixture
def groups(tmp_path, ray_cluster):
    """Two training ranks on GPUs 0-1, one engine on each of GPUs 2 and 3 (disaggregated)."""
    plan, _, config = job_config(tmp_path, cluster__gpus_per_node="4", train__colocate="false",
                                 train__num_gpus="2")
    group = placement.create(plan)
    train, rollout = actors.ray_groups(config, group, cpu_threads=1)
    yield config, group, train, rollout
    placement.remove(group)


PARAMS = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=24, stop_token_ids=())


def _requests(count: int) -> list[GenerationRequest]:
    return [GenerationRequest(prompt_ids=(1 + i % 7, 2, 3, 4 + i % 5), seed=1000 + i)
            for i in range(count)]


def _supervised(config, group, train, rollout, lines, **options):
    engines = supervisor.supervise(rollout, config, group, cpu_threads=1, log=lines.append,
                                   restore_weights=lambda fresh: train.push_weights(
                                       fresh, 1, 1 << 20), **options)
    train.push_weights(engines, 1, 1 << 20)
    return engines


@pytest.mark.slow
def test_an_engine_killed_mid_generation_is_replaced_and_its_requests_retried(groups):
    import ray

    config, group, train, rollout = groups
    lines: list[str] = []
    engines = _supervised(config, group, train, rollout, lines)
    requests = _requests(6000)  # each engine busy for about a second (0.25 s for 600 here)
    expected = engines.generate(requests, PARAMS)  # undisturbed: the reference samples

    victim = engines.workers[0]
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(out=engines.generate(requests, PARAMS)))
    started = time.monotonic()
    worker.start()
    assert busy(victim), "engine 0 was never seen generating: make the generation longer"
    assert worker.is_alive()
    ray.kill(victim, no_restart=True)
    worker.join(timeout=120)
    assert not worker.is_alive()

    assert engines.restarts == [1, 0]
    assert engines.workers[0] is not victim
    got = result["out"]
    assert len(got) == len(requests)
    # per-request seeds and the same weights: the retried samples are the undisturbed ones
    assert [g.token_ids for g in got] == [g.token_ids for g in expected]
    assert ray.get(engines.workers[0].weight_version.remote()) == 1  # weights re-pushed
    assert any("rollout engine 0 on node 0" in line and "restart 1 of 3" in line
               for line in lines), lines
    assert time.monotonic() - started < 120

    # the health check before a generation finds an engine that died between calls
    ray.kill(engines.workers[1], no_restart=True)
    again = engines.generate(requests[:10], PARAMS)
    assert engines.restarts == [1, 1]
    assert [g.token_ids for g in again] == [g.token_ids for g in expected[:10]]


@pytest.mark.slow
def test_restarts_exhausted_stop_the_run_naming_the_engine_and_its_node(groups):
    import ray

    config, group, train, rollout = groups
    lines: list[str] = []
    engines = _supervised(config, group, train, rollout, lines, max_restarts=1)
    ray.kill(engines.workers[1], no_restart=True)
    engines.generate(_requests(4), PARAMS)  # first death: replaced
    assert engines.restarts == [0, 1]
    ray.kill(engines.workers[1], no_restart=True)
    with pytest.raises(supervisor.EngineFailed) as failure:
        engines.generate(_requests(4), PARAMS)
    message = str(failure.value)
    assert message.startswith("rollout engine 1 on node 0: its actor died (")
    assert "restarted 1 time(s) already (max_restarts = 1)" in message


@pytest.mark.slow
def test_a_hung_engine_is_found_by_the_ping_deadline(groups):
    import ray

    config, group, train, rollout = groups
    lines: list[str] = []
    engines = _supervised(config, group, train, rollout, lines, health_timeout_s=1.0)
    # an engine busy with a long call cannot answer: to the supervisor it hangs
    # (6000 requests: seconds of work, longer than the 1 s deadline)
    generating = engines.workers[0].generate.remote(_requests(6000), PARAMS)
    assert busy(engines.workers[0], ping_s=0.1)
    replaced = engines.check_health()
    assert replaced == [0] and engines.restarts == [1, 0]
    assert "no answer to a health check in 1 s" in lines[-1]
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(generating)  # the hung engine was killed


def _dead(engine) -> None:
    """Waits until a call to the killed engine fails (ray.kill only sends the kill)."""
    import ray

    for _ in range(600):
        try:
            ray.get(engine.ping.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed engine still answers")


def test_an_engine_dead_at_the_weight_push_is_replaced_and_the_push_made_again(groups):
    import ray

    config, group, train, rollout = groups
    lines: list[str] = []
    engines = _supervised(config, group, train, rollout, lines, max_restarts=1)
    ray.kill(engines.workers[0], no_restart=True)
    _dead(engines.workers[0])
    train.push_weights(engines, 2, 1 << 20)
    assert engines.restarts == [1, 0]
    assert ray.get([w.weight_version.remote() for w in engines.workers]) == [2, 2]
    assert any("rollout engine 0 on node 0: its actor died" in line
               and "during the weight push; restart 1 of 1" in line for line in lines), lines

    ray.kill(engines.workers[0], no_restart=True)
    _dead(engines.workers[0])
    with pytest.raises(supervisor.EngineFailed) as failure:  # names the engine, not a rank
        train.push_weights(engines, 3, 1 << 20)
    assert str(failure.value).startswith("rollout engine 0 on node 0: its actor died (")
    assert "during the weight push" in str(failure.value)


def test_a_dead_training_actor_is_named_in_the_jobs_error(groups, tmp_path):
    import json

    import ray

    from runtime.node.errors import one_line

    config, group, train, rollout = groups
    where = {"train": train.where(), "rollout": rollout.where()}
    (config.job_dir / "placement.json").write_text(json.dumps(where))
    ray.kill(train.workers[1], no_restart=True)
    with pytest.raises(ray.exceptions.RayActorError) as failure:
        for _ in range(600):  # ray.kill only sends the kill
            train.where()
            time.sleep(0.05)
    line = one_line(failure.value, config.job_dir, tmp_path / "node-0.log")
    host, pid = where["train"][1]["host"], where["train"][1]["pid"]
    assert line.startswith(f"TrainWorker (training rank 1 on {host}, pid {pid}) died: "), line


def test_a_replaced_engine_gets_weights_from_the_callback_passed_in_and_is_counted():
    """Without Ray actors: the callback given at construction receives a group of just the
    new engine, and the restarts reach the rollout's metrics; a plain group reports none."""
    restored: list[list] = []
    engines = supervisor.SupervisedRollout(
        ["engine 0", "engine 1"], make_engine=lambda index: f"engine {index}, restarted",
        nodes=[[0], [1]], log=lambda line: None,
        restore_weights=lambda fresh: restored.append(fresh.workers))
    assert engines.rollout_numbers() == {"rollout/engine_restarts": 0}
    engines.replace(1, "a test")
    assert restored == [["engine 1, restarted"]]
    assert engines.workers == ["engine 0", "engine 1, restarted"]
    assert engines.rollout_numbers() == {"rollout/engine_restarts": 1}
    assert actors.RolloutGroup(["engine 0"]).rollout_numbers() == {}
