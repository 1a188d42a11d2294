"""`vime doctor` and V925: which packages the runtime imports are installed, which a spec
needs, and a logger turned on whose package is missing (found with the import system's own
finders: stand-in packages on sys.path, nothing mocked)."""

from __future__ import annotations

import importlib
import sys

import pytest
from specsupport import ROOT, run_text

from vime import doctor
from vime.cli import main

TINY = ROOT / "specs" / "tiny_cpu.toml"


def _package(folder, name: str, body: str = "") -> None:
    (folder / name).mkdir()
    (folder / name / "__init__.py").write_text(body)
    importlib.invalidate_caches()


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """A folder first on sys.path and on the PYTHONPATH of child Pythons."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    for name in ("wandb", "transformer_engine"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_a_spec_logging_to_wandb_warns_only_where_wandb_is_missing(stand_ins):
    sets = ['logging.wandb_project="vime-runs"']
    [warning] = [d for d in run_text(TINY.read_text(), sets).diagnostics if d.code == "V925"]
    assert warning.severity == "warning" and warning.key == "logging.wandb_project"
    assert "wandb is not installed in this Python" in warning.message
    assert warning.help.startswith("pip install 'vime[wandb]'")
    _package(stand_ins, "wandb")
    assert "V925" not in [d.code for d in run_text(TINY.read_text(), sets).diagnostics]


def test_a_package_that_is_installed_but_does_not_import_is_told_apart(stand_ins):
    _package(stand_ins, "transformer_engine",
             'raise ImportError("libcudart.so.12: cannot open shared object file")\n')
    packages = [doctor.BY_MODULE["transformer_engine"], doctor.BY_MODULE["wandb"]]
    engine, wandb, *hardware = doctor.imports(packages, timeout_s=60)
    assert [row.package.module for row in hardware] == ["cuda", "driver", "gpus"]
    assert engine.version == "(version unknown)" and not engine.usable
    assert engine.problem == "ImportError: libcudart.so.12: cannot open shared object file"
    assert (wandb.version, wandb.problem, wandb.usable) == (None, None, False)
    [line] = doctor.table([engine], {"transformer_engine": "train.transformer_impl"})
    assert line.startswith("MISSING  transformer_engine  (version unknown), does not import: "
                           "ImportError: libcudart.so.12")
    assert line.endswith("docs/install.md (built against this machine's torch and CUDA)")


def test_doctor_says_what_the_spec_needs_and_exits_1_while_it_is_missing(stand_ins, capsys):
    command = ["doctor", str(TINY), "--no-import", "--set", 'logging.wandb_project="x"']
    assert main(command) == 1
    out = capsys.readouterr().out
    assert ("MISSING  wandb               not installed  (needed: logging.wandb_project = 'x'); "
            "pip install 'vime[wandb]'") in out.splitlines()
    assert f"{TINY} needs 1 package this Python cannot import: wandb" in out
    _package(stand_ins, "wandb")
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "ok       torch " in out and "(needed: the runtime)" in out
    assert f"{TINY}: every package it needs imports here (metadata only: --no-import)" in out


def test_what_a_spec_needs_follows_its_backends_and_loggers():
    qwen = run_text((ROOT / "specs" / "qwen3_30b.toml").read_text(),
                    ['train.transformer_impl="transformer_engine"']).spec
    assert set(doctor.needs(qwen)) == {"torch", "ray", "vllm", "megatron.core",
                                       "transformer_engine"}
    tiny = run_text(TINY.read_text(), ['logging.tensorboard_dir="tb"']).spec
    assert doctor.needs(tiny) == {"torch": "the runtime", "ray": "the runtime",
                                  "tensorboard": "logging.tensorboard_dir = 'tb'"}


def test_a_flex_dispatcher_needs_deep_ep_and_doctor_imports_it(stand_ins, capsys):
    flex = run_text((ROOT / "specs" / "qwen3_30b.toml").read_text(),
                    ['train.moe_token_dispatcher="flex"']).spec
    assert doctor.needs(flex)["deep_ep"] == 'train.moe_token_dispatcher = "flex"'
    assert "deep_ep" not in doctor.needs(run_text(
        (ROOT / "specs" / "qwen3_30b.toml").read_text()).spec)
    _package(stand_ins, "deep_ep", 'raise OSError("libnvshmem_host.so.3: cannot open shared '
             'object file")\n')
    [deep_ep, *_hardware] = doctor.imports([doctor.BY_MODULE["deep_ep"]], timeout_s=60)
    assert not deep_ep.usable and deep_ep.problem.startswith("OSError: libnvshmem_host.so.3")
    [line] = doctor.table([deep_ep], doctor.needs(flex))
    assert line.startswith("MISSING  deep_ep  (version unknown), does not import: OSError")
    assert "(needed: train.moe_token_dispatcher = \"flex\"); build DeepEP from " in line
