"""What the test suite leaves outside its own temporary folders: nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vime.launch.jobdir import registry

ROOT = Path(__file__).resolve().parents[1]


def test_the_tests_jobs_are_remembered_outside_the_users_registry(tmp_path):
    users = Path(os.path.expanduser("~/.local/state/vime")).resolve()
    assert not registry().resolve().is_relative_to(users)
    # a `vime` the tests start remembers its jobs in the same registry
    printed = subprocess.run(
        [sys.executable, "-c", "from vime.launch.jobdir import registry; print(registry())"],
        capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    assert Path(printed) == registry()
