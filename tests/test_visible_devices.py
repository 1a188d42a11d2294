"""V707: a visible-devices variable in [cluster.env] that hides GPUs the plan places."""

from __future__ import annotations

import pytest
from specsupport import ROOT, codes, run_spec

from vime.check.cluster import hidden_in_local_environment, visible_count
from vime.cli import main

SPEC = ROOT / "specs" / "qwen3_30b.toml"


@pytest.mark.parametrize("name, value, count", [
    ("CUDA_VISIBLE_DEVICES", "0,1,2,3", 4),
    ("CUDA_VISIBLE_DEVICES", "", 0),
    ("CUDA_VISIBLE_DEVICES", "0,1,-1,3", 2),  # CUDA stops at the first invalid index
    ("CUDA_VISIBLE_DEVICES", "GPU-8a3b,GPU-77f1", 2),
    ("CUDA_VISIBLE_DEVICES", "$SLURM_STEP_GPUS", None),
    ("NVIDIA_VISIBLE_DEVICES", "all", None),
    ("NVIDIA_VISIBLE_DEVICES", "none", 0),
    ("ROCR_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7", 8),
])
def test_visible_count(name, value, count):
    assert visible_count(name, value) == count


@pytest.mark.parametrize("name, value", [
    ("CUDA_VISIBLE_DEVICES", "0"), ("CUDA_VISIBLE_DEVICES", ""), ("ROCR_VISIBLE_DEVICES", "0,1"),
    ("NVIDIA_VISIBLE_DEVICES", "void"), ("HIP_VISIBLE_DEVICES", "0,1,2,3"),
])
def test_hiding_gpus_is_an_error_at_the_variable(name, value):
    result = run_spec(SPEC, [f'cluster.env.{name}="{value}"'])
    (diag,) = [d for d in result.diagnostics if d.code == "V707"]
    assert diag.severity == "error" and diag.key == f"cluster.env.{name}"
    assert "of the 8 GPUs per node" in diag.message and not result.ok


@pytest.mark.parametrize("value", ["0,1,2,3,4,5,6,7", "all", "$CUDA_VISIBLE_DEVICES"])
def test_every_gpu_shown_or_unknown_is_clean(value):
    name = "NVIDIA_VISIBLE_DEVICES" if value == "all" else "CUDA_VISIBLE_DEVICES"
    assert "V707" not in codes(run_spec(SPEC, [f'cluster.env.{name}="{value}"']))


def test_four_gpu_nodes_with_four_visible_are_clean():
    result = run_spec(SPEC, ["cluster.gpus_per_node=4", 'cluster.env.CUDA_VISIBLE_DEVICES="0,1,2,3"',
                             "inference.gpus_per_engine=4", "train.parallel.ep=4"])
    assert "V707" not in codes(result), [(d.code, d.message) for d in result.diagnostics]


def test_the_torch_pair_may_hide_gpus_to_run_on_the_cpu():
    result = run_spec(ROOT / "specs" / "tiny_cpu.toml", ['cluster.env.CUDA_VISIBLE_DEVICES=""'])
    assert "V707" not in codes(result)


# `vime submit --local`: the launcher's own environment, which its logical nodes inherit

H200 = ROOT / "specs" / "tiny_h200.toml"  # megatron + vllm on one GPU


@pytest.mark.parametrize("value", ["", "none"])
def test_submit_local_refuses_an_environment_that_hides_the_gpu(tmp_path, monkeypatch, capsys,
                                                                 value):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    code = main(["submit", "--local", str(H200), "--set", f'experiment.output_dir="{tmp_path}"'])
    err = capsys.readouterr().err
    assert code == 1 and "error[V707]" in err, err
    assert "in the environment of `vime submit --local` shows 0 of the 1 GPUs" in err
    assert "help: unset CUDA_VISIBLE_DEVICES" in err
    assert not any(tmp_path.iterdir())  # nothing started, no job folder


def test_the_gpus_the_environment_shows_are_counted_over_the_nodes():
    spec = run_spec(SPEC, ["cluster.nodes=2"]).spec
    (diag,) = hidden_in_local_environment(spec, {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    assert "shows 8 of the 16 GPUs" in diag.message and diag.key == "environment.CUDA_VISIBLE_DEVICES"
    assert not hidden_in_local_environment(spec, {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(16)))})
    assert not hidden_in_local_environment(spec, {})


def test_the_torch_pair_on_the_cpu_is_not_checked_at_submit():
    spec = run_spec(ROOT / "specs" / "tiny_cpu.toml").spec
    assert not hidden_in_local_environment(spec, {"CUDA_VISIBLE_DEVICES": ""})
