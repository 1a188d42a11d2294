"""Moved to runtime/rl/rewards.py (issue 20); this path is importable for one release."""

from runtime.rl.rewards import *  # noqa: F403
