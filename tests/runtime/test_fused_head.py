"""runtime/core/fused_head.py's Triton kernels on the CPU: tests/runtime/fused_head_cases.py in
a pytest of its own under Triton's interpreter (TRITON_INTERPRET=1 before Triton is imported,
which this pytest process may have done already). The fast tier runs its cases not marked slow,
the full tier the others."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CASES = Path(__file__).with_name("fused_head_cases.py")


def _run_cases(selection: str) -> tuple[int, int]:
    """(passed, deselected) of the cases that `-m selection` picks, under the interpreter."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop("VIME_LOSS_HEAD", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p",
                          "no:cacheprovider", "-m", selection, str(CASES)], env=env,
                         capture_output=True, text=True, timeout=600,
                         cwd=Path(__file__).parents[2])
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "skipped" not in summary and "error" not in summary, summary
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|deselected)", summary)}
    return counts.get("passed", 0), counts.get("deselected", 0)


def test_the_kernels_under_the_interpreter():
    passed, deselected = _run_cases("not slow")
    # every case was collected (a parametrized one counts once per case: at least one each)
    assert passed >= 4 and passed + deselected >= len(
        re.findall(r"^def test_", CASES.read_text(), re.M)), (passed, deselected)


@pytest.mark.slow
def test_the_kernels_under_the_interpreter_every_case():
    passed, deselected = _run_cases("slow")
    assert passed >= 5 and deselected >= 4, (passed, deselected)
