"""A job's start-up, phase by phase: the driver (runtime/node/driver.py) marks the end of each
phase, and each is logged as it ends ("vime: start-up: ray 2.1 s") and reported with the
total in the first metrics record of the run (startup/<phase>_s, startup/total_s).

The phases tile the start-up: each runs from the previous mark to its own, so they add up to
startup/total_s, from the driver's start to the end of the first weight push. Seconds the
workers measure themselves (the slowest rank's init, the slowest engine's start) are details
beside them (startup/slowest_*_s), not phases: concurrent ones overlap.
"""

from __future__ import annotations

import time
from collections.abc import Callable

PREFIX = "startup/"


class Startup:
    """The marks of one start-up, in order."""

    def __init__(self, log: Callable[[str], None], clock: Callable[[], float] = time.perf_counter):
        self.log, self.clock = log, clock
        self.began = self.last = clock()
        self.phases: dict[str, float] = {}
        self.details: dict[str, float] = {}

    def mark(self, phase: str, at: float | None = None) -> float:
        """End `phase` now (or at `at`, a reading of the same clock); logs and returns its
        seconds."""
        now = self.clock() if at is None else at
        seconds, self.last = max(now - self.last, 0.0), now
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds
        self.log(f"vime: start-up: {phase} {seconds:.1f} s")
        return seconds

    def detail(self, name: str, seconds: float) -> None:
        """A worker's own seconds, reported as startup/<name>_s and not added to the total."""
        self.details[name] = seconds

    def numbers(self) -> dict[str, float]:
        """startup/<phase>_s of every phase, the details, and startup/total_s."""
        out = {f"{PREFIX}{name}_s": seconds for name, seconds in self.phases.items()}
        out.update({f"{PREFIX}{name}_s": seconds for name, seconds in self.details.items()})
        out[f"{PREFIX}total_s"] = self.last - self.began
        return out
