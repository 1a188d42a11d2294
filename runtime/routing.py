"""Moved to runtime/megatron/routing.py (issue 20); this path is importable for one release."""

from runtime.megatron.routing import *  # noqa: F403
