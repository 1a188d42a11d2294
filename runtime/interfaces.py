"""Moved to runtime/core/interfaces.py (issue 20); this path is importable for one release."""

from runtime.core.interfaces import *  # noqa: F403
