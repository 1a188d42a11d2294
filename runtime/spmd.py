"""Moved to runtime/core/spmd.py (the ranks' calls) and runtime/node/torchrun.py (the job)
(issue 20); `python -m runtime.spmd` works for one release."""

from runtime.core.spmd import *  # noqa: F403
from runtime.node.torchrun import *  # noqa: F403
from runtime.node.torchrun import main

if __name__ == "__main__":
    raise SystemExit(main())
