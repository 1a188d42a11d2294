"""`vime plan` says where a run of the spec writes, as absolute folders, and by which rule a
relative path was read: experiment.output_dir from the folder vime runs in, the data and model
paths from the spec's folder."""

from __future__ import annotations

import shutil

from specsupport import ROOT

from vime.cli import main

TINY = ROOT / "specs" / "tiny_cpu.toml"


def _plan_text(capsys, *argv: str) -> str:
    assert main(["plan", *argv]) == 0
    return capsys.readouterr().out


def test_the_folders_a_run_writes_are_absolute_and_say_their_rule(tmp_path, capsys,
                                                                   monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    out = _plan_text(capsys, str(TINY))
    assert ("\nwrites (experiment.output_dir is read from the folder vime runs in, the data "
            "and model\n        paths from the spec's folder: docs/spec.md, \"Paths\")\n"
            f"  job folders  {work}/build/runs/tiny-cpu/<job id>/\n"
            f"  checkpoints  {work}/build/runs/tiny-cpu/checkpoints/\n") in out


def test_model_save_is_read_from_the_specs_folder(tmp_path, capsys, monkeypatch):
    spec = tmp_path / "exp" / "spec.toml"
    spec.parent.mkdir()
    shutil.copytree(ROOT / "specs" / "data", tmp_path / "exp" / "data")
    spec.write_text(TINY.read_text())
    monkeypatch.chdir(tmp_path)
    out = _plan_text(capsys, str(spec), "--set", 'model.save="ckpt"', "--set",
                     "checkpoint.save_hf_interval=10")
    assert f"  job folders  {tmp_path}/build/runs/tiny-cpu/<job id>/\n" in out
    assert f"  checkpoints  {tmp_path}/exp/ckpt/ (model.save)\n" in out
    assert (f"  HF model folder every 10 rollouts and after the last (4 folders): "
            f"{tmp_path}/exp/ckpt/hf/rollout_XXXXXX/\n") in out
