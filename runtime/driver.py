"""Moved to runtime/node/driver.py (issue 20); this path is importable for one release."""

from runtime.node.driver import *  # noqa: F403
