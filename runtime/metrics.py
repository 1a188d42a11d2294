"""Moved to runtime/rl/metrics.py (issue 20); `python -m runtime.metrics` works for one release."""

from runtime.rl.metrics import *  # noqa: F403
from runtime.rl.metrics import main

if __name__ == "__main__":
    raise SystemExit(main())
