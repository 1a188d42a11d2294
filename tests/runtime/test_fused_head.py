"""runtime/core/fused_head.py's Triton kernels on the CPU: tests/runtime/fused_head_cases.py in
a pytest of its own under Triton's interpreter (TRITON_INTERPRET=1 before Triton is imported,
which this pytest process may have done already)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CASES = Path(__file__).with_name("fused_head_cases.py")


def test_the_kernels_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop("VIME_LOSS_HEAD", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider",
                          str(CASES)], env=env, capture_output=True, text=True, timeout=600,
                         cwd=Path(__file__).parents[2])
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    expected = len(re.findall(r"^def test_", CASES.read_text(), re.M))
    # every case ran (a parametrized one counts once per case: at least one each), none skipped
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= expected and "skipped" not in summary, summary
