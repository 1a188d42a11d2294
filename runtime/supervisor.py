"""Moved to runtime/workers/supervisor.py (issue 20); this path is importable for one release."""

from runtime.workers.supervisor import *  # noqa: F403
