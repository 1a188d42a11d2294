"""Moved to runtime/core/nucleus.py (issue 20); this path is importable for one release."""

from runtime.core.nucleus import *  # noqa: F403
