"""V730: model.hf_checkpoint pointing nowhere is said by plan, compile and submit, before the
queue wait and Ray's start-up where the driver found it ("has no tokenizer")."""

from __future__ import annotations

import json
import shutil

import pytest
from specsupport import ROOT, run_text

from vime.cli import main
from vime.resolve.model import PRESETS

SPEC = ROOT / "specs" / "qwen3_30b.toml"


def _v730(diagnostics):
    return [d for d in diagnostics if d.code == "V730"]


def _spec_in(folder, hf_checkpoint: str):
    spec = folder / "spec.toml"
    text = SPEC.read_text().replace('hf_checkpoint = "/root/Qwen3-30B-A3B"',
                                    f'hf_checkpoint = "{hf_checkpoint}"')
    assert hf_checkpoint in text
    spec.write_text(text)
    return spec


def test_a_model_id_is_not_a_folder_and_the_help_says_how_to_get_one():
    [diag] = _v730(run_text(SPEC.read_text(), ['model.hf_checkpoint="Qwen/Qwen3-30B-A3B"'],
                            spec_dir=SPEC.parent).diagnostics)
    assert diag.severity == "warning" and diag.key == "model.hf_checkpoint"
    assert diag.help.startswith("the runtime loads the tokenizer and weights from a folder, "
                                "not a model id: `huggingface-cli download Qwen/Qwen3-30B-A3B "
                                "--local-dir /shared/models/Qwen3-30B-A3B`")


def test_a_relative_folder_beside_the_spec_is_found_as_the_runtime_finds_it(tmp_path,
                                                                           monkeypatch):
    spec = _spec_in(tmp_path, "weights/qwen")
    monkeypatch.chdir(ROOT)  # not the spec's folder
    args = ["plan", str(spec)]
    assert main(args) == 0
    (tmp_path / "weights" / "qwen").mkdir(parents=True)
    result = run_text(spec.read_text(), spec_dir=tmp_path)
    assert not _v730(result.diagnostics)
    shutil.rmtree(tmp_path / "weights")
    assert _v730(run_text(spec.read_text(), spec_dir=tmp_path).diagnostics)


def test_an_absolute_path_not_here_is_a_warning_and_random_init_needs_no_folder():
    [diag] = _v730(run_text(SPEC.read_text(), spec_dir=SPEC.parent).diagnostics)
    assert diag.severity == "warning" and "the job's nodes must have it" in diag.message
    tiny = ROOT / "specs" / "tiny_cpu.toml"  # random_init: no weights, a built tokenizer
    assert not _v730(run_text(tiny.read_text(), spec_dir=tiny.parent).diagnostics)


def test_submit_dry_run_warns_that_the_nodes_must_have_an_absolute_path(tmp_path, capsys,
                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["submit", str(SPEC), "--dry-run", "--format", "concise"]) == 0
    err = capsys.readouterr().err
    assert ("warning[V730] model.hf_checkpoint: model.hf_checkpoint = '/root/Qwen3-30B-A3B' is "
            "not on this machine: the job's nodes must have it") in err
    assert "(help: check it on a node (`srun -N1 ls /root/Qwen3-30B-A3B`)" in err


@pytest.mark.parametrize("made", ["nothing", "no-tokenizer"])
def test_submit_local_refuses_a_checkpoint_this_machine_does_not_have(tmp_path, capsys,
                                                                      monkeypatch, made):
    monkeypatch.delenv("VIME_DRIVER", raising=False)
    folder = tmp_path / "Qwen3-30B-A3B"
    if made == "no-tokenizer":
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(PRESETS["qwen3-30b-a3b"]))
    spec = _spec_in(tmp_path, str(folder))
    code = main(["submit", str(spec), "--local", "--set",
                 f'experiment.output_dir="{tmp_path}/out"', "--format", "concise"])
    err = capsys.readouterr().err
    assert code == 1, err
    why = ("is not a folder on this machine" if made == "nothing" else
           "has no tokenizer.json or tokenizer_config.json")
    assert f"error[V730] model.hf_checkpoint: model.hf_checkpoint = '{folder}' {why}" in err
    assert not (tmp_path / "out").exists()  # nothing started
