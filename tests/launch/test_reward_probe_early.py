"""The driver loads the rewards (rollout.reward's and every [[eval.datasets]] reward's) and
asks each reward server for an answer before it connects to Ray and starts the actors and
models: a dead server, or an eval reward that does not import, stops the job there. The job here has no Ray (no
RAY_ADDRESS), so a driver that gets past its probes stops at `no Ray cluster` instead; the
servers are real sockets on loopback."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from httpkit import LoopbackServer

from runtime.core.slices import compile_job
from runtime.node import driver
from runtime.rl.rewards import RewardError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "specs" / "tiny_cpu.toml"


def _dead_url() -> str:
    with socket.socket() as free:  # a loopback port nothing listens on
        free.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{free.getsockname()[1]}/score"


class ScoringServer(LoopbackServer):
    """Answers every POST with {"scores": []} and counts the requests."""

    def __init__(self):
        self.requests: list[bytes] = []
        super().__init__()

    def answer(self, handler, body: bytes) -> None:
        self.requests.append(body)
        self.reply(handler, 200, b'{"scores": []}')


def _run_driver(tmp_path: Path, monkeypatch, *sets: str) -> BaseException:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    files = compile_job(TINY, [f'experiment.output_dir="{tmp_path / "runs"}"', *sets])
    job_dir = tmp_path / "runs" / "tiny-cpu" / "local-0"
    job_dir.mkdir(parents=True)
    with pytest.raises(Exception) as caught:
        driver.run(json.loads(files["plan.json"]), files["resolved.toml"], job_dir, False)
    return caught.value


def _eval_with_reward(name: str) -> str:
    return ('eval.datasets=[{name = "arith", prompt_data = "data/tiny_arithmetic.jsonl", '
            f'n_samples_per_prompt = 4, reward = "{name}"}}]')


def test_a_dead_reward_server_stops_the_driver_before_ray(tmp_path, monkeypatch):
    url = _dead_url()
    stopped = _run_driver(tmp_path, monkeypatch, f'rollout.reward="{url}"')
    assert isinstance(stopped, RewardError), stopped
    assert f"reward server {url}" in str(stopped) or url in str(stopped), stopped
    assert "did not answer the probe" in str(stopped)


def test_an_eval_reward_that_does_not_import_stops_the_driver_before_ray(tmp_path, monkeypatch):
    stopped = _run_driver(tmp_path, monkeypatch, _eval_with_reward("no_such_held_out_reward:score"))
    assert isinstance(stopped, ValueError), stopped
    assert "cannot import no_such_held_out_reward" in str(stopped), stopped


def test_a_live_reward_server_is_probed_once_and_the_driver_goes_on(tmp_path, monkeypatch):
    # the eval dataset's reward is rollout.reward's server too: asked once
    with ScoringServer() as server:
        stopped = _run_driver(tmp_path, monkeypatch, f'rollout.reward="{server.url}"')
    assert "no Ray cluster" in str(stopped), stopped  # past the probe, at Ray
    assert server.requests == [b'{"samples": []}']
