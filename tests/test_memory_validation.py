"""The planner against the GPU measurements recorded in the repository (issue 18: "a CPU test
keeps the planner's numbers for the recorded cases").

benchmarks/memory_validation.py plans each measured case of docs/data/ and prints the table of
docs/memory-validation.md; this test holds its predictions. A change of the memory model that
moves them must update PREDICTED here and the table and its reason in docs/memory-validation.md
(predicted against measured, the error of every case, before and after).
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from specsupport import ROOT

DATA = ROOT / "docs" / "data" / "h200-megatron-memory-2026-11-29.jsonl"


def _validation():
    spec = importlib.util.spec_from_file_location(
        "memory_validation", ROOT / "benchmarks" / "memory_validation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cases() -> list[dict]:
    """The per-phase run (the first lines of the file recorded only the overall peak)."""
    cases = [json.loads(line) for line in DATA.read_text().splitlines()]
    return [c for c in cases if "peak_backward_gib" in c]


# (layers, recompute, tokens): vime's allocated and reserved GiB, as the table in
# docs/memory-validation.md gives them
PREDICTED = {
    (2, "none", 2048): (36.6, 40.2),
    (2, "none", 8192): (52.3, 57.5),
    (2, "none", 16384): (73.2, 80.5),
    (2, "full", 16384): (70.9, 78.0),
    (4, "none", 8192): (75.5, 83.1),
    (4, "selective", 8192): (75.3, 82.8),
    (4, "full", 16384): (92.0, 101.1),
    (4, "full", 24576): (111.8, 123.0),
}


def test_every_recorded_case_is_held():
    assert sorted((c["layers"], c["recompute"], c["tokens"]) for c in _cases()) == sorted(PREDICTED)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c['layers']}:{c['recompute']}:{c['tokens']}")
def test_planner_numbers_for_the_recorded_cases(case):
    predicted = _validation().predict(case)
    allocated, reserved = PREDICTED[case["layers"], case["recompute"], case["tokens"]]
    assert round(predicted["allocated"], 1) == allocated
    assert round(predicted["reserved"], 1) == reserved
