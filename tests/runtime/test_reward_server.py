"""Rewards from a server (rollout.reward = "http://..."), against a real HTTP server on
loopback: batches, retries, a server that stays down or answers late or wrong, each named by
the sample; async reward functions; and the loop scored by the server repeats the loop scored
by the same function in process."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from httpkit import LoopbackServer
from runtimekit import in_process_loop, job_config, metrics

from runtime import toy
from runtime.rl import rewards
from runtime.rl.rewards import RewardError, Sample


class ToyRewardServer(LoopbackServer):
    """runtime.toy's reward behind POST /score; the first `failures` requests get a 503, each
    answer waits `delay_s`, and `answer` (when set) replaces the scores."""

    def __init__(self, failures: int = 0, delay_s: float = 0.0, answer=None):
        self.failures, self.delay_s, self.scores = failures, delay_s, answer
        self.batches: list[int] = []
        super().__init__()

    def answer(self, handler, body: bytes) -> None:
        samples = json.loads(body)["samples"]
        self.batches.append(len(samples))
        if self.failures:
            self.failures -= 1
            handler.send_error(503, "warming up")
            return
        time.sleep(self.delay_s)
        scores = self.scores if self.scores is not None else [
            toy.reward(s["prompt"], s["response"], s["label"]) for s in samples]
        self.reply(handler, 200, json.dumps({"scores": scores}).encode())


SAMPLES = [Sample(0, i, i + 1, "prompts.jsonl") for i in range(7)]
CALLS = [{"prompt": "What is 1 + 2?", "response": r"\boxed{3}" if i % 2 else "no",
          "label": "3"} for i in range(7)]


def scorer(url: str, timeout_s: float = 5.0, **options):
    server = rewards.load(url)
    for key, value in options.items():
        setattr(server, key, value)
    return rewards.caller(server, timeout_s, log=lambda line: None)


def test_batches_and_retries_score_every_sample_in_order():
    with ToyRewardServer(failures=2) as server:
        results = scorer(server.url, batch_size=3, backoff_s=0.01).score_many(SAMPLES, CALLS)
    assert [value for value, _ in results] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert [extra["acc"] for _, extra in results] == [0.0, 1.0] * 3 + [0.0]
    assert server.batches == [3, 3, 3, 3, 1]  # two refused, then batches of 3, 3, 1


def test_a_server_that_stays_down_is_named_with_the_sample():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(RewardError) as caught:
        scorer(f"http://127.0.0.1:{port}/score", retries=2, backoff_s=0.01).score_many(
            SAMPLES, CALLS)
    message = str(caught.value)
    assert f"127.0.0.1:{port}/score failed 3 time(s)" in message
    assert "rollout 0, sample 0 (prompt at prompts.jsonl:1)" in message


def test_a_late_answer_is_a_timeout_and_retried():
    with ToyRewardServer(delay_s=1.0) as server, pytest.raises(RewardError) as caught:
        scorer(server.url, timeout_s=0.2, retries=1, backoff_s=0.01).score_many(
            SAMPLES[:2], CALLS[:2])
    assert "failed 2 time(s)" in str(caught.value) and "timed out" in str(caught.value)
    assert server.batches == [2, 2]


@pytest.mark.parametrize(("answer", "words"), [
    ([0.0, float("nan")], "returned nan on rollout 0, sample 1"),
    ([0.0, "0.5"], "returned '0.5', a str, not a number"),
    ([0.0], r"returned 1 score\(s\) for a batch of 2 from rollout 0, sample 0"),
])
def test_a_wrong_answer_names_the_sample(answer, words):
    with ToyRewardServer(answer=answer) as server, pytest.raises(RewardError, match=words):
        scorer(server.url).score_many(SAMPLES[:2], CALLS[:2])


async def async_reward(prompt, response, label):
    return {"score": float(response == label), "acc": 1.0}


def test_an_async_reward_function_is_awaited():
    caller = rewards.caller(async_reward, 5.0)
    assert caller(SAMPLES[0], prompt="p", response="3", label="3") == (1.0, {"acc": 1.0})


def test_the_loop_scored_by_a_server_repeats_the_loop_scored_in_process(tmp_path):
    _, _, local = job_config(tmp_path / "a", "local", rollout__num_rollout="2")
    in_process_loop(local).run()
    with ToyRewardServer() as server:
        _, _, remote = job_config(tmp_path / "b", "remote", rollout__num_rollout="2",
                                  rollout__reward=json.dumps(server.url))
        in_process_loop(remote).run()
    # the probe's empty batch, the evaluation's 100 samples before rollout 0 (tiny_cpu.toml's
    # [[eval.datasets]], the rollout's reward), then each rollout's 64, in batches of at most 64
    assert server.batches == [0, 64, 36, 64, 64]
    local_records, remote_records = metrics(local.job_dir), metrics(remote.job_dir)
    assert "eval/arith/reward" in remote_records[0]
    for want, have in zip(local_records, remote_records, strict=True):
        for key in ("reward/mean", "reward/acc", "train/pg_loss", "eval/arith/reward"):
            if key in want:
                assert have[key] == pytest.approx(want[key], abs=1e-9), key


def with_metadata(prompt, response, label, metadata):
    return float(metadata["operands"] == [1, 2])


def test_metadata_reaches_a_reward_that_takes_it_and_spares_one_that_does_not():
    call = {"prompt": "p", "response": r"\boxed{3}", "label": "3",
            "metadata": {"operands": [1, 2]}}
    assert rewards.caller(with_metadata, 5.0).score_many(SAMPLES[:1], [call]) == [(1.0, {})]
    assert rewards.caller(rewards.load("deepscaler"), 5.0).score_many(
        SAMPLES[:1], [call]) == [(1.0, {})]


class BrokenHTTPServer:
    """A loopback socket that reads each request and answers `reply` bytes, then closes: a
    server that breaks the HTTP exchange itself (a cut body, a line that is no status)."""

    def __init__(self, reply: bytes):
        self.reply, self.requests = reply, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/score"
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with connection:
                connection.recv(65536)
                self.requests += 1
                connection.sendall(self.reply)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.listener.close()


@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    b'{"scores": [',
    b"garbage\r\n\r\n",
], ids=["cut-body", "no-status-line"])
def test_a_broken_answer_is_retried_and_named_with_the_sample(reply):
    with BrokenHTTPServer(reply) as server, pytest.raises(RewardError) as caught:
        scorer(server.url, retries=1, backoff_s=0.01).score_many(SAMPLES[:2], CALLS[:2])
    message = str(caught.value)
    assert f"{server.url} failed 2 time(s)" in message
    assert "rollout 0, sample 0 (prompt at prompts.jsonl:1)" in message
    assert server.requests == 2
