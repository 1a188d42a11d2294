"""Moved to runtime/rl/loop.py (issue 20); this path is importable for one release."""

from runtime.rl.loop import *  # noqa: F403
