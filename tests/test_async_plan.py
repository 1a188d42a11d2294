"""rollout.async in `vime plan`: what overlaps with what, and the one-step step forecast
(vime/plan/forecast.py, Forecast.step): max(generate, log-probs + train) + weight sync +
overhead on GPUs of their own, the sum where actor and engines share the GPUs."""

from __future__ import annotations

import pytest
from specsupport import ROOT, run_spec

from vime import render
from vime.emit import plan_json

SLICE = ROOT / "specs" / "qwen3_30b_slice_h200.toml"
ONE_STEP = 'rollout.async="one_step"'
APART = ("cluster.gpus_per_node=2", "train.colocate=false", "train.num_gpus=1")


def _plan(*sets):
    result = run_spec(SLICE, list(sets))
    assert result.ok, [(d.code, d.message) for d in result.diagnostics]
    return result.plan


def test_disaggregated_one_step_forecasts_generation_beside_training():
    plan = _plan(ONE_STEP, "algorithm.tis=true", *APART)
    found = plan.forecast
    seconds = {line.name: line.seconds for line in found.lines}
    assert found.mode == "disaggregated" and found.overlapped
    beside = seconds["log-probs"] + seconds["train"]
    assert found.step == pytest.approx(max(seconds["generate"], beside)
                                       + seconds["weight sync"] + seconds["overhead"])
    assert found.step < found.total
    # the synchronous run of the same placement: the sum
    assert _plan("algorithm.tis=true", *APART).forecast.step == pytest.approx(found.total)
    text = render.plan_text(plan)
    assert "one-step async: max(generate" in text
    assert "async one_step: rollout k+1 generates (weights version k) while the actor trains on " \
        "rollout k, on the engines' 1 GPU and the actor's 1" in text


def test_resident_one_step_counts_no_overlap_and_says_what_runs_beside_what():
    plan = _plan(ONE_STEP, "algorithm.tis=true", 'train.offload="never"')
    found = plan.forecast
    assert found.mode == "resident" and not found.overlapped
    assert found.step == pytest.approx(found.total)
    assert plan_json._forecast(plan)["async"] == {"mode": "one_step", "overlapped": False,
                                                 "step_s": round(found.total, 2)}
    assert "async" not in plan_json._forecast(_plan('train.offload="never"'))
    text = render.plan_text(plan)
    assert f"one-step async: {found.total:.1f} s, the total: actor and engines share the GPUs" \
        in text
    assert "on the same GPUs, both resident" in text
