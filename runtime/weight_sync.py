"""Moved to runtime/workers/weight_sync.py (issue 20); this path is importable for one release."""

from runtime.workers.weight_sync import *  # noqa: F403
