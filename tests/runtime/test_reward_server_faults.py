"""A reward server's faults against real sockets on loopback: an answer that drips in a byte
at a time is cut at rollout.reward_timeout_s (the whole request, not each read), and the
messages tell a refused connection, an unknown host, a timeout and an HTTP error status
apart; the loop probes the server once before its first rollout."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from httpkit import LoopbackServer
from runtimekit import in_process_loop, job_config, metrics

from runtime.rl import rewards
from runtime.rl.rewards import RewardError, Sample

SAMPLES = [Sample(0, i, i + 1, "prompts.jsonl") for i in range(2)]
CALLS = [{"prompt": "What is 1 + 2?", "response": r"\boxed{3}", "label": "3"}] * 2


def scorer(url: str, timeout_s: float, **options):
    server = rewards.load(url)
    for key, value in options.items():
        setattr(server, key, value)
    return rewards.caller(server, timeout_s, log=lambda line: None)


class DrippingServer:
    """A loopback socket that reads each request and answers a well-formed 200 with
    {"scores": [1.0, 1.0]}, `every_s` seconds between bytes, from the byte `from_byte` on
    (the bytes before it at once), until the test ends. closes: the answer says the
    connection ends with it (`Connection: close`, as HTTP/1.0 servers such as Python's
    http.server and Flask's do), where http.client hands the socket to the response."""

    def __init__(self, every_s: float, from_byte: int = 0, closes: bool = False):
        body = json.dumps({"scores": [1.0, 1.0]}).encode() + b" " * 200
        self.reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                      + (b"Connection: close\r\n" if closes else b"")
                      + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.every_s, self.from_byte = every_s, from_byte
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/score"
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(connection,), daemon=True).start()

    def _drip(self, connection):
        with connection:
            connection.recv(65536)
            try:
                connection.sendall(self.reply[:self.from_byte])
                for index in range(self.from_byte, len(self.reply)):
                    if self.stop.wait(self.every_s):
                        return
                    connection.sendall(self.reply[index:index + 1])
            except OSError:
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.listener.close()


@pytest.mark.parametrize(("from_byte", "closes"), [(0, False), (90, False), (110, True)],
                         ids=["status-line", "body", "body-connection-close"])
def test_an_answer_dripping_a_byte_at_a_time_is_cut_at_the_timeout(from_byte, closes):
    """Each byte comes well within the timeout (0.2 s of 1 s): only a deadline for the whole
    request ends it. Bounded: the call runs in a thread the test waits 6 s for."""
    outcome: list = []

    def score():
        try:
            outcome.append(scorer(server.url, 1.0, retries=1, backoff_s=0.01).score_many(
                SAMPLES, CALLS))
        except RewardError as err:
            outcome.append(err)

    with DrippingServer(every_s=0.2, from_byte=from_byte, closes=closes) as server:
        started = time.monotonic()
        caller = threading.Thread(target=score, daemon=True)
        caller.start()
        caller.join(6.0)
        seconds = time.monotonic() - started
        assert not caller.is_alive(), "the dripping answer was still being read after 6 s"
    assert isinstance(outcome[0], RewardError), outcome
    message = str(outcome[0])
    assert seconds < 4.0  # two attempts of 1 s
    assert "failed 2 time(s)" in message
    assert "no complete answer within rollout.reward_timeout_s = 1 s" in message


class ErrorServer(LoopbackServer):
    """A loopback HTTP server whose every POST gets `status` with `body`, counting them."""

    def __init__(self, status: int, body: bytes):
        self.status, self.body, self.requests = status, body, []
        super().__init__()

    def answer(self, handler, body: bytes) -> None:
        self.requests.append(body)
        self.reply(handler, self.status, self.body, "text/plain")


def free_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def failure(url: str, **options) -> str:
    with pytest.raises(RewardError) as caught:
        scorer(url, 5.0, backoff_s=0.01, **options).score_many(SAMPLES, CALLS)
    return str(caught.value)


def test_a_refused_connection_says_nothing_listens():
    port = free_port()
    message = failure(f"http://127.0.0.1:{port}/score", retries=1)
    assert "failed 2 time(s) for the batch of 2 sample(s) from rollout 0, sample 0" in message
    assert f"connection refused by 127.0.0.1:{port}" in message
    assert "is the server running, and on this port?" in message


def test_a_host_name_that_does_not_resolve_says_so():
    message = failure("http://reward-host.invalid:8000/score", retries=0)
    assert "the host name 'reward-host.invalid' does not resolve" in message
    assert "is the host name right" in message


def test_an_http_error_names_the_status_and_the_start_of_the_body():
    body = b"Traceback (most recent call last):\n  KeyError: 'label'\n" + b"x" * 500
    with ErrorServer(500, body) as server:
        message = failure(server.url, retries=1)
    assert len(server.requests) == 2  # a 500 is retried
    assert "HTTP 500 Internal Server Error, body " in message
    assert r"Traceback (most recent call last):\n  KeyError: 'label'" in message
    assert message.count("x") < 250
    assert "the server is up and reports an error" in message
    assert "reachable" not in message


def test_a_client_error_is_not_retried():
    with ErrorServer(422, b'{"detail": "samples.0.label: field required"}') as server:
        message = failure(server.url, retries=3)
    assert len(server.requests) == 1
    assert "failed 1 time(s)" in message and "HTTP 422" in message
    assert "field required" in message


def test_the_probe_stops_at_a_refused_server_and_logs_an_error_status():
    port = free_port()
    with pytest.raises(RewardError, match=rf"did not answer the probe before the first rollout "
                       rf"\(2 attempt\(s\), an empty batch\): connection refused by "
                       rf"127.0.0.1:{port}"):
        scorer(f"http://127.0.0.1:{port}/score", 5.0, retries=1, backoff_s=0.01).probe()
    with ErrorServer(404, b"Not Found") as server, pytest.raises(
            RewardError, match="HTTP 404 Not Found.*nothing takes a POST at /score"):
        scorer(server.url, 5.0).probe()
    lines: list[str] = []
    with ErrorServer(500, b"IndexError: list index out of range") as server:
        rewards.caller(rewards.load(server.url), 5.0, log=lines.append).probe()
    assert server.requests == [b'{"samples": []}']  # once: an empty batch may be all it fails
    assert "HTTP 500 Internal Server Error, body 'IndexError" in lines[0]
    assert "going on" in lines[0]


def test_the_loop_probes_the_server_before_generating(tmp_path, monkeypatch):
    port = free_port()
    _, _, config = job_config(tmp_path, rollout__reward=json.dumps(
        f"http://127.0.0.1:{port}/score"))
    loop = in_process_loop(config)
    loop.score.server.backoff_s = 0.01

    def generate(requests, params):
        raise AssertionError("generated before the reward server answered")

    monkeypatch.setattr(loop.rollout, "generate", generate)
    with pytest.raises(RewardError, match="did not answer the probe before the first rollout"):
        loop.run()
    assert not (config.job_dir / "metrics.jsonl").exists() or not metrics(config.job_dir)
