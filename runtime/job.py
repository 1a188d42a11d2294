"""Moved to runtime/node/job.py (issue 20); `python -m runtime.job` works for one release."""

import sys

from runtime.node.job import *  # noqa: F403
from runtime.node.job import main

if __name__ == "__main__":
    sys.exit(main())
