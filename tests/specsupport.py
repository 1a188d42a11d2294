"""Helpers shared by the compiler tests (imported as `specsupport`; a module named
`conftest` would collide with the conftest.py files of test subfolders)."""

from __future__ import annotations

import json
from pathlib import Path

from vime import pipeline
from vime.parse import Source
from vime.resolve.model import PRESETS

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.toml"))


def run_text(text: str, sets=(), name: str = "spec.toml", spec_dir: Path = ROOT / "specs",
             strict: bool = False) -> pipeline.Result:
    return pipeline.run(Source(name, text), list(sets), spec_dir, strict)


def run_spec(path: Path, sets=(), strict: bool = False) -> pipeline.Result:
    return run_text(path.read_text(), sets, f"specs/{path.name}", path.parent, strict)


def codes(result: pipeline.Result) -> set[str]:
    return {d.code for d in result.diagnostics}


def _preset_checkpoint(tmp_path):
    """A folder with the config.json of a preset, as an HF checkpoint would have."""

    def make(preset: str) -> Path:
        folder = tmp_path / preset
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(PRESETS[preset]))
        return folder

    return make
