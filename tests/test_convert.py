"""`vime convert`: the command it runs. The conversion itself runs in
tests/runtime/test_convert_cpu.py (CPU) and docs/gpu-runs.md (H200)."""

from __future__ import annotations

import shlex

from specsupport import ROOT

from vime.cli import main

SPEC = str(ROOT / "specs" / "qwen3_30b.toml")


def test_dry_run_prints_the_exact_quoted_command(capsys, tmp_path):
    target = tmp_path / "a b;$(touch pwned)"
    assert main(["convert", SPEC, "--dry-run", "-o", str(target)]) == 0
    argv = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
    # the seed's layout (tp 4, ep 8, etp 1) needs 8 ranks: lcm(tp, ep × etp)
    assert argv[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=8"]
    assert argv[5:13] == ["-m", "runtime.megatron.convert", "--to", "torch_dist", "--tp=4",
                          "--pp=1", "--ep=8", "--etp=1"]
    assert argv[-2:] == ["/root/Qwen3-30B-A3B", str(target)]
    assert not (tmp_path / "pwned").exists()


def test_single_gpu_saves_the_unsharded_layout_from_one_process(capsys, tmp_path):
    assert main(["convert", SPEC, "--dry-run", "--single-gpu", "-o", str(tmp_path / "x")]) == 0
    argv = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
    assert argv[1:9] == ["-m", "runtime.megatron.convert", "--to", "torch_dist", "--tp=1",
                         "--pp=1", "--ep=1", "--etp=1"]


def test_the_world_is_the_smallest_that_holds_the_layout(capsys, tmp_path):
    assert main(["convert", SPEC, "--dry-run", "-o", str(tmp_path / "x"),
                 "--set", "train.parallel.tp=2", "--set", "train.parallel.ep=4",
                 "--set", "train.parallel.etp=2"]) == 0
    argv = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
    assert "--nproc-per-node=8" in argv and "--tp=2" in argv and "--etp=2" in argv
    # a pipeline stage holds that world; pp stages of it
    assert main(["convert", SPEC, "--dry-run", "-o", str(tmp_path / "x"),
                 "--set", "train.parallel.pp=2", "--set", "train.parallel.tp=2",
                 "--set", "train.parallel.ep=4"]) == 0
    argv = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
    assert "--nproc-per-node=8" in argv and "--pp=2" in argv and "--ep=4" in argv


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
