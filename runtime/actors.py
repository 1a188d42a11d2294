"""Moved to runtime/workers/actors.py (issue 20); this path is importable for one release."""

from runtime.workers.actors import *  # noqa: F403
