"""V730 at plan time: model.hf_checkpoint given as an absolute path that is not on this
machine is the same warning from `vime plan`, `compile` and `submit --dry-run`."""

from __future__ import annotations

from specsupport import ROOT

from vime.cli import main

SPEC = ROOT / "specs" / "qwen3_30b.toml"


def _spec_in(folder, hf_checkpoint: str):
    spec = folder / "spec.toml"
    spec.write_text(SPEC.read_text().replace('hf_checkpoint = "/root/Qwen3-30B-A3B"',
                                             f'hf_checkpoint = "{hf_checkpoint}"'))
    return spec


def _v730_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "[V730]" in line]


def test_plan_and_submit_dry_run_say_the_same_about_a_missing_absolute_folder(
        tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "no-such-model"
    spec = _spec_in(tmp_path, str(missing))
    assert main(["plan", str(spec), "--format", "concise"]) == 0
    said_by_plan = _v730_lines(capsys.readouterr().err)
    assert said_by_plan == [
        f"{spec}:24:1: warning[V730] model.hf_checkpoint: model.hf_checkpoint = "
        f"'{missing}' is not on this machine: the job's nodes must have it, or the driver "
        f"stops after the queue wait (help: check it on a node (`srun -N1 ls {missing}`), "
        "or point model.hf_checkpoint at the folder with config.json, tokenizer.json and the "
        "safetensors (an absolute path on a file system the nodes mount))"]
    assert main(["compile", str(spec), "-o", str(tmp_path / "build"), "--format",
                 "concise"]) == 0
    assert _v730_lines(capsys.readouterr().err) == said_by_plan
    assert main(["submit", str(spec), "--dry-run", "--format", "concise"]) == 0
    assert _v730_lines(capsys.readouterr().err) == said_by_plan
    assert main(["plan", str(spec), "--strict"]) == 1


def test_an_absolute_folder_on_this_machine_is_clean(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    spec = _spec_in(tmp_path, str(tmp_path / "model"))
    assert main(["plan", str(spec), "--format", "concise"]) == 0
    assert _v730_lines(capsys.readouterr().err) == []
