"""Moved to runtime/core/weights.py (issue 20); this path is importable for one release."""

from runtime.core.weights import *  # noqa: F403
