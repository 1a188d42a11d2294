"""The module paths from before issue 20 still work, for one release: each old module gives
the public names of its new place (the same objects), and the old `python -m` entries run."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest
from test_import_layers import SHIMS

NEW_PLACE = {"runtime.spmd": ("runtime.core.spmd", "runtime.node.torchrun")}


def _new_places(shim: str) -> tuple[str, ...]:
    if shim in NEW_PLACE:
        return NEW_PLACE[shim]
    name = shim.rpartition(".")[2]
    found = [f"runtime.{layer}.{name}" for layer in ("core", "node", "rl", "workers", "megatron")
             if importlib.util.find_spec(f"runtime.{layer}.{name}") is not None]
    assert len(found) == 1, (shim, found)
    return tuple(found)


@pytest.mark.parametrize("shim", sorted(SHIMS))
def test_an_old_path_gives_the_names_of_its_new_place(shim):
    old = importlib.import_module(shim)
    for place in _new_places(shim):
        new = importlib.import_module(place)
        public = [n for n in vars(new) if not n.startswith("_")]
        assert public
        for name in public:
            assert getattr(old, name) is getattr(new, name), (shim, name)


@pytest.mark.parametrize("module", ["runtime.job", "runtime.spmd"])
def test_the_old_entries_run(module):
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_the_old_metrics_entry_runs():
    done = subprocess.run([sys.executable, "-m", "runtime.metrics"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "usage: python -m runtime.rl.metrics" in done.stderr
