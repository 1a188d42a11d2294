"""Golden files for `plan --json` and the build folder of every spec in specs/.
Refresh with UPDATE_GOLDEN=1 and review the diff."""

from __future__ import annotations

import os

import pytest
from specsupport import ROOT, SPECS, run_spec

from vime.check import disk
from vime.emit import argfile, build, plan_json

GOLDEN = ROOT / "tests" / "golden"


@pytest.fixture(autouse=True)
def _in_the_checkout(monkeypatch):
    # resolved.toml names the schema from build_dir, a folder relative to the checkout
    monkeypatch.chdir(ROOT)
    # V738 compares the checkpoints' disk with this machine's free space, which goldens do
    # not depend on (tests/test_disk_forecast.py reads the real one)
    monkeypatch.setattr(disk, "free_bytes", lambda folder: None)


def _artifacts(path):
    result = run_spec(path)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics]
    name = f"specs/{path.name}"
    obj = plan_json.plan_object(name, result.diagnostics, result.spec, result.plan)
    build_dir = f"build/{result.spec.experiment.name}"
    return build.files(result.plan, name, path.read_text(), obj, build_dir)


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_build_folder_matches_golden(path):
    folder = GOLDEN / path.stem
    files = _artifacts(path)
    if os.environ.get("UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text)
    for name, text in files.items():
        assert (folder / name).read_text() == text, f"{path.stem}/{name} differs from golden"


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_artifacts_are_deterministic_and_args_round_trip(path):
    first, second = _artifacts(path), _artifacts(path)
    assert first == second
    tokens = argfile.parse(first["megatron.args"])
    assert tokens[:2] == ["--tensor-model-parallel-size", tokens[1]]
    assert all("\n" not in t for t in tokens)


def test_resolved_toml_plans_to_the_same_plan(tmp_path):
    for path in SPECS:
        files = _artifacts(path)
        resolved = tmp_path / f"{path.stem}.toml"
        resolved.write_text(files["resolved.toml"])
        again = run_spec(resolved)
        assert again.ok, [(d.code, d.message) for d in again.diagnostics]
        original = run_spec(path)
        assert again.plan.groups == original.plan.groups
        assert again.plan.engines == original.plan.engines
        assert again.plan.batch == original.plan.batch
        assert again.spec.arch == original.spec.arch
