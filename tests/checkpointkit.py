"""A training backend stand-in for runtime/rl/checkpoint.py's Checkpoints.save, shared by the
checkpoint tests of tests/runtime and tests/launch (imported as `checkpointkit`)."""

from __future__ import annotations

from pathlib import Path


class FakeTrain:
    """Saves one small file holding `payload`, as a backend saves its weights."""

    def __init__(self, payload: str = "w"):
        self.payload = payload

    def save(self, path: Path) -> None:
        path.mkdir(parents=True)
        (path / "weights.txt").write_text(self.payload)
