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
    (the bytes before it at once), until the test ends."""

    def __init__(self, every_s: float, from_byte: int = 0):
        body = json.dumps({"scores": [1.0, 1.0]}).encode() + b" " * 200
        self.reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
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


@pytest.mark.parametrize("from_byte", [0, 90], ids=["status-line", "body"])
def test_an_answer_dripping_a_byte_at_a_time_is_cut_at_the_timeout(from_byte):
    """Each byte comes well within the timeout (0.2 s of 1 s): only a deadline for the whole
    request ends it. Bounded: the call runs in a thread the test waits 6 s for."""
    outcome: list = []

    def score():
        try:
            outcome.append(scorer(server.url, 1.0, retries=1, backoff_s=0.01).score_many(
                SAMPLES, CALLS))
        except RewardError as err:
            outcome.append(err)

    with DrippingServer(every_s=0.2, from_byte=from_byte) as server:
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
