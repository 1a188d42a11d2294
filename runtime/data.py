"""Moved to runtime/rl/data.py (issue 20); this path is importable for one release."""

from runtime.rl.data import *  # noqa: F403
