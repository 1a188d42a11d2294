"""A job's driver asks its reward server for an answer once: before Ray and the models start
(runtime/node/driver.py's probe_rewards), and not again when the loop begins. The driver on a
real Ray with logical GPUs, the reward a real HTTP server on loopback that counts the empty
batches (the probe's) among the batches it scores."""

from __future__ import annotations

import json

import pytest
from httpkit import LoopbackServer
from runtimekit import job_config, metrics

from runtime import toy
from runtime.node import driver


class CountingRewardServer(LoopbackServer):
    """runtime.toy's reward behind POST /score; the size of every batch asked, in order."""

    def __init__(self):
        self.batches: list[int] = []
        super().__init__()

    def answer(self, handler, body: bytes) -> None:
        samples = json.loads(body)["samples"]
        self.batches.append(len(samples))
        scores = [toy.reward(s["prompt"], s["response"], s["label"]) for s in samples]
        self.reply(handler, 200, json.dumps({"scores": scores}).encode())


@pytest.mark.slow
def test_the_driver_probes_the_reward_server_once(tmp_path, ray_cluster):
    with CountingRewardServer() as server:
        plan, resolved, config = job_config(
            tmp_path, rollout__num_rollout="1", rollout__reward=json.dumps(server.url),
            eval__at_start="false", eval__at_end="false")
        driver.run(plan, resolved, config.job_dir, False)
    assert len(metrics(config.job_dir)) == 1
    # the probe's empty batch before Ray, then the rollout's 64 samples
    assert server.batches == [0, 64]
