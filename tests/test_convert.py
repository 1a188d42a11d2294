"""`vime convert`: the command it runs (the conversion itself needs a GPU: docs/gpu-runs.md)."""

from __future__ import annotations

import shlex

from specsupport import ROOT

from vime.cli import main

SPEC = str(ROOT / "specs" / "qwen3_30b.toml")


def test_dry_run_prints_the_exact_quoted_command(capsys, tmp_path):
    target = tmp_path / "a b;$(touch pwned)"
    assert main(["convert", SPEC, "--dry-run", "-o", str(target)]) == 0
    argv = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
    assert argv[1:5] == ["-m", "runtime.megatron.convert", "--to", "torch_dist"]
    assert argv[-2:] == ["/root/Qwen3-30B-A3B", str(target)]
    assert not (tmp_path / "pwned").exists()


def test_back_to_hf_defaults_next_to_the_torch_dist_folder(capsys):
    assert main(["convert", SPEC, "--to", "hf", "--dry-run"]) == 0
    argv = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
    assert argv[-2:] == ["/root/Qwen3-30B-A3B_torch_dist", "/root/Qwen3-30B-A3B_torch_dist_hf"]


def test_never_overwrites_and_needs_a_target(capsys, tmp_path):
    assert main(["convert", SPEC, "-o", str(tmp_path)]) == 2
    assert "never overwrites" in capsys.readouterr().err
    spec = tmp_path / "s.toml"
    spec.write_text((ROOT / "specs" / "qwen3_30b.toml").read_text().replace(
        'torch_dist_checkpoint = "/root/Qwen3-30B-A3B_torch_dist"\n', ""))
    assert main(["convert", str(spec), "--dry-run"]) == 2
    assert "torch_dist_checkpoint" in capsys.readouterr().err


def test_a_spec_with_errors_converts_nothing(capsys):
    assert main(["convert", SPEC, "--dry-run", "--set", "train.parallel.ep=3"]) == 1
    assert "runtime.megatron.convert" not in capsys.readouterr().out
