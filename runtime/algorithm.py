"""Moved to runtime/core/algorithm.py (issue 20); this path is importable for one release."""

from runtime.core.algorithm import *  # noqa: F403
