"""A reward server over HTTP (rollout.reward = "http://host:port/path"): the rollout's samples
are POSTed in batches, and every score comes back checked as a reward function's is.

This module moves the bytes; runtime/rl/rewards.py calls it and checks every score as it
checks a reward function's. The request, the response, the probe before the first rollout
and what a failed batch does: docs/design.md, "The reward server".
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# HTTP statuses after which the same request may succeed
RETRY_STATUSES = (429, 500, 502, 503, 504)
# OSError numbers of a host that cannot be reached (as against one that refuses)
UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN,
               errno.EADDRNOTAVAIL)
# characters of an answer's body quoted in messages
BODY_START = 200


class RewardServerError(RuntimeError):
    """The server stayed unreachable, or answered what is not {"scores": [...]} of the
    batch's length; the message names the server, the batch's first sample and what failed:
    a refused connection, an unreachable host, a timeout, or an HTTP status."""


@dataclass(frozen=True)
class Failure:
    """Why one request got no usable answer, in the words of messages."""

    kind: str  # "refused", "unreachable", "timeout", "broken", "http"
    detail: str
    retry: bool  # whether the same request may succeed
    status: int | None = None  # the HTTP status, for kind "http"

    def advice(self, server: RewardServer) -> str:
        host = f"{server.host}:{server.port}"
        return {
            "refused": f"nothing accepts connections at {host}: is the server running, and "
                       "on this port?",
            "unreachable": f"{host} cannot be reached from this node: is the host name "
                           "right, and is the server reachable from the head node?",
            "timeout": "make the server answer faster (or smaller batches), or raise "
                       "rollout.reward_timeout_s",
            "broken": "the server or something between closed the exchange: see the "
                      "server's log",
            "http": "the server is up and reports an error: see the server's log",
        }[self.kind]


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    body: bytes
    location: str | None  # a redirect's Location header


def _body_start(body: bytes) -> str:
    text = body[:BODY_START].decode("utf-8", "replace")
    return repr(text) + (" ..." if len(body) > BODY_START else "")


class RewardServer:
    """Scores samples by POSTing them to a URL, batch by batch. rollout.reward_timeout_s
    (timeout_s) bounds each request as a whole: connecting, sending, and reading the whole
    answer, however slowly its bytes come."""

    def __init__(self, url: str, timeout_s: float = 300.0, retries: int = 3,
                 batch_size: int = 64, backoff_s: float = 0.5,
                 log: Callable[[str], None] = print):
        self.url, self.timeout_s, self.retries = url, timeout_s, retries
        self.batch_size, self.backoff_s, self.log = batch_size, backoff_s, log
        self.name = url
        parts = urllib.parse.urlsplit(url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def configured(self, timeout_s: float, log: Callable[[str], None]) -> RewardServer:
        return RewardServer(self.url, timeout_s, self.retries, self.batch_size, self.backoff_s,
                            log)

    def _exchange(self, payload: bytes) -> Answer | Failure:
        """One POST, ended at timeout_s from its start: a timer shuts the socket down, which
        wakes a connect, send or read blocked on it (a per-read socket timeout never fires
        on an answer that drips in a byte at a time). The socket is the one connect made:
        http.client clears connection.sock when an answer says `Connection: close` (HTTP/1.0
        servers) and reads the body from that socket through the response."""
        kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        connection = kind(self.host, self.port, timeout=self.timeout_s)
        expired = threading.Event()
        phase = f"connecting to {self.host}:{self.port}"
        connected: list[socket.socket] = []

        def expire():
            expired.set()
            for sock in [connection.sock, *connected]:
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(self.timeout_s, expire)
        timer.daemon = True
        timer.start()
        try:
            connection.connect()
            connected.append(connection.sock)
            if expired.is_set():  # the name lookup and connect took the whole time
                raise TimeoutError
            phase = "sending the request"
            connection.request("POST", self.path, body=payload,
                               headers={"Content-Type": "application/json"})
            phase = "waiting for the answer"
            response = connection.getresponse()
            phase = f"reading the answer (HTTP {response.status})"
            body = response.read()
            return Answer(response.status, response.reason, body,
                          response.getheader("Location"))
        except (OSError, http.client.HTTPException) as err:
            if expired.is_set() or isinstance(err, TimeoutError):
                return Failure("timeout", f"timed out {phase}: no complete answer within "
                               f"rollout.reward_timeout_s = {self.timeout_s:g} s (for "
                               "connecting, sending and the whole answer)", retry=True)
            return self._failure(err, phase)
        finally:
            timer.cancel()
            connection.close()

    def _failure(self, err: Exception, phase: str) -> Failure:
        what = f"{type(err).__name__}: {err}"
        if isinstance(err, ConnectionRefusedError):
            return Failure("refused", f"connection refused by {self.host}:{self.port}",
                           retry=True)
        if isinstance(err, socket.gaierror):
            return Failure("unreachable", f"the host name {self.host!r} does not resolve "
                           f"({err.strerror})", retry=True)
        if isinstance(err, OSError) and err.errno in UNREACHABLE:
            return Failure("unreachable", f"{self.host}:{self.port} is unreachable ({what})",
                           retry=True)
        # a body cut short, a line that is no status line, a reset: the next may succeed
        return Failure("broken", f"the exchange broke off {phase} ({what})", retry=True)

    def _judge(self, answer: Answer) -> Failure | None:
        """A Failure for an answer whose status is not 2xx."""
        if 200 <= answer.status < 300:
            return None
        detail = f"HTTP {answer.status} {answer.reason}"
        if 300 <= answer.status < 400 and answer.location:
            detail += f" to {answer.location} (set rollout.reward to the URL it names)"
        elif answer.body:
            detail += f", body {_body_start(answer.body)}"
        return Failure("http", detail, retry=answer.status in RETRY_STATUSES,
                       status=answer.status)

    def _attempts(self, payload: bytes, retry_status: bool = True) -> tuple[Answer | Failure,
                                                                             int]:
        """The first 2xx answer, else the last failure, after up to `retries` repeats of a
        request that may succeed (HTTP statuses only when retry_status); and the attempts."""
        outcome: Answer | Failure = Failure("broken", "no attempt", retry=False)
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            outcome = self._exchange(payload)
            if isinstance(outcome, Answer):
                outcome = self._judge(outcome) or outcome
            if isinstance(outcome, Answer) or not outcome.retry or (
                    outcome.kind == "http" and not retry_status):
                return outcome, attempt + 1
        return outcome, self.retries + 1

    def _post(self, payload: bytes, first: str, count: int) -> list:
        outcome, attempts = self._attempts(payload)
        if isinstance(outcome, Failure):
            raise RewardServerError(
                f"reward server {self.name} failed {attempts} time(s) for the batch of "
                f"{count} sample(s) from {first}: {outcome.detail}; {outcome.advice(self)}")
        body = outcome.body
        try:
            scores = json.loads(body)["scores"]
        except (ValueError, KeyError, TypeError):
            raise RewardServerError(
                f"reward server {self.name} answered {body[:BODY_START]!r} for the batch of "
                f"{count} sample(s) from {first}: expected JSON "
                '{"scores": [...]}') from None
        if not isinstance(scores, list) or len(scores) != count:
            raise RewardServerError(
                f"reward server {self.name} returned "
                f"{len(scores) if isinstance(scores, list) else type(scores).__name__} "
                f"score(s) for a batch of {count} from {first}")
        return scores

    def probe(self) -> None:
        """POST an empty batch ({"samples": []}) once, before the first rollout: a server that
        refuses, cannot be reached or does not answer within timeout_s (after the retries)
        stops the run before anything is generated; one that answers an HTTP error is
        named in the log, since a server may fail on an empty batch alone.

        Raises:
            RewardServerError: no answer (refused, unreachable, timeout, broken off), or
                HTTP 404 or 405: no POST handler at the URL's path.
        """
        started = time.monotonic()
        outcome, attempts = self._attempts(b'{"samples": []}', retry_status=False)
        seconds = time.monotonic() - started
        if isinstance(outcome, Failure) and (outcome.kind != "http"
                                             or outcome.status in (404, 405)):
            advice = (f"nothing takes a POST at {self.path}: is the path right?"
                      if outcome.kind == "http" else outcome.advice(self))
            raise RewardServerError(
                f"reward server {self.name} did not answer the probe before the first "
                f"rollout ({attempts} attempt(s), an empty batch): {outcome.detail}; "
                f"{advice}")
        if isinstance(outcome, Failure):
            self.log(f"vime: reward server {self.name} answered an empty batch (the probe "
                     f"before the first rollout) with {outcome.detail}; going on, as a server "
                     "may fail on an empty batch alone")
            return
        self.log(f"vime: reward server {self.name} answered the probe in {seconds:.2f} s")

    def fetch(self, calls: Sequence[dict], describe: Callable[[int], str]) -> list:
        """What the server returned per call (each a sample's prompt, response, label and
        metadata), in order; describe(i) names call i in messages.

        Raises:
            RewardServerError: the server stayed unreachable, or answered no list of scores
                of the batch's length.
        """
        results: list = []
        for start in range(0, len(calls), self.batch_size):
            batch = list(calls[start:start + self.batch_size])
            payload = json.dumps({"samples": batch}, default=str).encode()
            results += self._post(payload, describe(start), len(batch))
        return results
