"""Moved to runtime/rl/checkpoint.py (issue 20); this path is importable for one release."""

from runtime.rl.checkpoint import *  # noqa: F403
