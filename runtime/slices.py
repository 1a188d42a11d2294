"""Moved to runtime/core/slices.py (issue 20); this path is importable for one release."""

from runtime.core.slices import *  # noqa: F403
