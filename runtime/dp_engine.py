"""Moved to runtime/workers/dp_engine.py (issue 20); this path is importable for one release."""

from runtime.workers.dp_engine import *  # noqa: F403
