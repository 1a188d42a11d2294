"""Moved to runtime/node/placement.py (issue 20); this path is importable for one release."""

from runtime.node.placement import *  # noqa: F403
