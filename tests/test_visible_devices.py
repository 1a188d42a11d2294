"""V707: a visible-devices variable in [cluster.env] that hides GPUs the plan places."""

from __future__ import annotations

import pytest
from specsupport import ROOT, codes, run_spec

from vime.check.cluster import visible_count

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
