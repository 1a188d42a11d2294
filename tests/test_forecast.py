"""vime/plan/forecast.py: the step-time forecast's arithmetic, and the forecast against the
H200 measurements it was calibrated on (docs/data/h200-step-breakdown-*-2026-12-02.json): within
20% of the measured step at both batch shapes and in both modes. In-sample: the same runs set
the constants, so this pins the arithmetic and the calibration, not the model's reach."""

from __future__ import annotations

import json
import statistics

import pytest
from specsupport import ROOT, run_spec

from vime.plan import forecast as fc

SLICE = ROOT / "specs" / "qwen3_30b_slice_h200.toml"
DATA = ROOT / "docs" / "data"


def plan_of(*sets, spec=SLICE):
    result = run_spec(spec, sets)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics]
    return result.plan


def lines(plan) -> dict[str, float]:
    return {line.name: line.seconds for line in plan.forecast.lines}


def measured_step(name: str) -> float:
    """The mean of the steady rollouts (1 and 2) less the checkpoint's save."""
    rows = json.loads((DATA / name).read_text())["metrics"][1:]
    return statistics.fmean(r["time/rollout"] - r.get("time/save", 0.0) for r in rows)


def test_each_line_is_its_formula():
    plan = plan_of()
    got, arch = lines(plan), plan.spec.arch
    tokens = 256 * (32 + 1024)
    per_token = 2 * (arch.params_active - arch.embedding_params) + 4 * 4 * 32 * 128 * 1056 / 2
    assert fc.forward_flops_per_token(plan.spec) == pytest.approx(per_token)
    step = fc.DECODE_BASE_S + 256 * (fc.DECODE_PER_SEQUENCE_S + 4 * fc.DECODE_PER_SEQUENCE_LAYER_S)
    assert got["generate"] == pytest.approx(1024 * step)
    assert got["log-probs"] == pytest.approx(tokens * per_token / fc.FORWARD_FLOPS_PER_S)
    assert got["train"] == pytest.approx(3 * tokens * per_token / fc.TRAIN_FLOPS_PER_S
                                         + fc.OPTIMIZER_S_PER_PARAM * arch.params_total)
    assert got["weight sync"] == pytest.approx(2 * arch.params_total / 8.0e9)
    assert got["overhead"] == pytest.approx(fc.LOOP_REST_S)
    assert plan.forecast.total == pytest.approx(sum(got.values()))
    # taking turns adds the actor's copies both ways and the engines' sleep and wake
    turns = plan_of('train.offload="always"')
    kept = 14 * arch.params_total  # bf16 weights + fp32 main params and two moments
    assert lines(turns)["overhead"] == pytest.approx(
        2 * kept / fc.OFFLOAD_BYTES_PER_S + fc.ENGINE_SLEEP_WAKE_S + fc.LOOP_REST_S, rel=1e-3)


@pytest.mark.parametrize(("sets", "data"), [
    ((), "h200-step-breakdown-resident-32x8-2026-12-02.json"),
    (('train.offload="always"',), "h200-step-breakdown-offload-32x8-2026-12-02.json"),
    (("rollout.batch_size=16",), "h200-step-breakdown-resident-16x8-2026-12-02.json"),
])
def test_within_20_percent_of_the_measured_step(sets, data):
    plan = plan_of(*sets)
    assert plan.forecast.total == pytest.approx(measured_step(data), rel=0.20)
    assert all(line.basis.kind == "gpu" for line in plan.forecast.lines)


def test_other_shapes_are_estimates_and_scale_with_the_batch():
    small, large = plan_of("rollout.batch_size=16"), plan_of("rollout.batch_size=64")
    assert all(line.basis.kind == "estimate" for line in large.forecast.lines)
    assert lines(large)["log-probs"] == pytest.approx(4 * lines(small)["log-probs"])
    assert lines(large)["generate"] > lines(small)["generate"]
    longer = plan_of("rollout.max_response_len=2048")
    assert lines(longer)["generate"] > 2 * lines(plan_of())["generate"] * 0.99
    assert plan_of(spec=ROOT / "specs" / "qwen3_30b.toml").forecast.mode == "offload"


def test_no_forecast_without_a_memory_plan():
    assert plan_of(spec=ROOT / "specs" / "tiny_cpu.toml").forecast is None
