"""Moved to runtime/node/ray_bootstrap.py (issue 20); this path is importable for one release."""

from runtime.node.ray_bootstrap import *  # noqa: F403
