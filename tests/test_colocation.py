"""vime/plan/colocation.py: which mode a colocated spec gets, and its arithmetic. The benchmark
spec of the colocated step (a 4-layer Qwen3-30B-A3B slice on one H200) fits resident at
gpu_memory_utilization 0.4 and not at 0.6; train.offload forces either mode."""

from __future__ import annotations

import pytest
from specsupport import ROOT, run_spec

from vime.plan.memory import CUDA_CONTEXT, GiB

SLICE = ROOT / "specs" / "qwen3_30b_slice_h200.toml"


def plan_of(*sets):
    result = run_spec(SLICE, sets)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics]
    return result.plan


def test_the_slice_fits_resident_and_the_sum_is_the_memory_plans():
    plan = plan_of()
    found = plan.colocation
    train = {t.name: t.bytes for t in plan.memory.train.terms}
    assert found.mode == "resident" and found.setting == "auto" and found.fits
    assert found.actor_bytes == pytest.approx(plan.memory.train.peak - train["sleeping engine"])
    assert found.engine_bytes == pytest.approx(0.4 * 139.8 * GiB + CUDA_CONTEXT)
    assert found.together_bytes <= 139.8 * GiB
    assert "both fit" in found.why


def test_a_larger_engine_share_takes_turns():
    found = plan_of("inference.gpu_memory_utilization=0.6").colocation
    assert found.mode == "offload" and found.fits is False
    assert found.together_bytes > 139.8 * GiB and "do not fit" in found.why


@pytest.mark.parametrize(("setting", "mode"), [("always", "offload"), ("never", "resident")])
def test_train_offload_forces_the_mode(setting, mode):
    found = plan_of(f'train.offload="{setting}"').colocation
    assert found.mode == mode and found.setting == setting


def test_not_colocated_has_no_mode():
    result = run_spec(ROOT / "specs" / "tiny_cpu.toml",
                      ["cluster.gpus_per_node=2", "train.colocate=false", "train.num_gpus=1"])
    assert result.ok and result.plan.colocation is None
