"""A reward server over HTTP (rollout.reward = "http://host:port/path"): the rollout's samples
are POSTed in batches, and every score comes back checked as a reward function's is.

This module moves the bytes; runtime/rl/rewards.py calls it and checks every score as it
checks a reward function's. The request, the response and what a failed batch does:
docs/design.md, "The reward server".
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

# HTTP statuses after which the same request may succeed
RETRY_STATUSES = (429, 500, 502, 503, 504)


class RewardServerError(RuntimeError):
    """The server stayed unreachable, or answered what is not {"scores": [...]} of the
    batch's length; the message names the server and the batch's first sample."""


class RewardServer:
    """Scores samples by POSTing them to a URL, batch by batch."""

    def __init__(self, url: str, timeout_s: float = 300.0, retries: int = 3,
                 batch_size: int = 64, backoff_s: float = 0.5,
                 log: Callable[[str], None] = print):
        self.url, self.timeout_s, self.retries = url, timeout_s, retries
        self.batch_size, self.backoff_s, self.log = batch_size, backoff_s, log
        self.name = url

    def configured(self, timeout_s: float, log: Callable[[str], None]) -> RewardServer:
        return RewardServer(self.url, timeout_s, self.retries, self.batch_size, self.backoff_s,
                            log)

    def _post(self, payload: bytes, first: str, count: int) -> list:
        problem, attempts = "", 0
        for attempt in range(self.retries + 1):
            attempts = attempt + 1
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=payload, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                    body = answer.read()
            except urllib.error.HTTPError as err:
                problem = f"HTTP {err.code} {err.reason}"
                if err.code not in RETRY_STATUSES:
                    break
                continue
            # http.client.HTTPException: the exchange broke (a body cut short, a line that is
            # no status line); neither is an OSError, and the next request may succeed
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError,
                    http.client.HTTPException) as err:
                problem = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
                continue
            try:
                scores = json.loads(body)["scores"]
            except (ValueError, KeyError, TypeError):
                raise RewardServerError(
                    f"reward server {self.name} answered {body[:200]!r} for the batch of "
                    f"{count} sample(s) from {first}: expected JSON "
                    '{"scores": [...]}') from None
            if not isinstance(scores, list) or len(scores) != count:
                raise RewardServerError(
                    f"reward server {self.name} returned "
                    f"{len(scores) if isinstance(scores, list) else type(scores).__name__} "
                    f"score(s) for a batch of {count} from {first}")
            return scores
        raise RewardServerError(
            f"reward server {self.name} failed {attempts} time(s) for the batch of "
            f"{count} sample(s) from {first}: {problem}; is it running and "
            "reachable from the head node? (rollout.reward_timeout_s = "
            f"{self.timeout_s:g} s per request)")

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
