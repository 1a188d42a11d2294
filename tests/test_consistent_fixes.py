"""One mistake, one fix that clears every diagnostic it causes; causes before consequences,
and no memory verdict on a spec whose inputs are already wrong."""

from __future__ import annotations

import re

import pytest
from specsupport import ROOT, codes, run_spec

SPEC = ROOT / "specs" / "qwen3_30b.toml"
EPLB = ROOT / "specs" / "qwen3_30b_24gpu_eplb.toml"
TP_RULES = {"V201", "V203", "V204"}


def _helps(result, rules):
    return {d.code: d.help for d in result.diagnostics if d.code in rules}


def test_tp_3_gets_one_suggestion_that_clears_all_three():
    result = run_spec(SPEC, ["train.parallel.tp=3"])
    helps = _helps(result, TP_RULES)
    assert set(helps) == TP_RULES and set(helps.values()) == {"tp = 4"}
    assert not codes(run_spec(SPEC, ["train.parallel.tp=4"])) & TP_RULES


@pytest.mark.parametrize("spec", [SPEC, EPLB])
@pytest.mark.parametrize("tp", range(1, 17))
def test_every_suggested_tp_clears_every_tp_rule(spec, tp):
    result = run_spec(spec, [f"train.parallel.tp={tp}", "train.parallel.sequence_parallel=false"])
    matches = [re.fullmatch(r"tp = (\d+)", h or "") for h in _helps(result, TP_RULES).values()]
    suggested = {m[1] for m in matches if m}
    assert len(suggested) <= 1, suggested
    for value in suggested:
        fixed = run_spec(spec, [f"train.parallel.tp={value}",
                                "train.parallel.sequence_parallel=false"])
        assert not codes(fixed) & TP_RULES, (tp, value)


def test_pp_2_with_ep_8_on_8_gpus_under_megatron_is_told_pp_1():
    sets = ['train.backend="megatron"', "train.parallel.tp=1", "train.parallel.pp=2",
            "train.parallel.sequence_parallel=false"]
    result = run_spec(SPEC, sets)
    (diag,) = [d for d in result.diagnostics if d.code == "V202"]
    assert diag.help.startswith("pp = 1")
    fixed = run_spec(SPEC, [*sets[:2], "train.parallel.pp=1", sets[3]])
    assert not codes(fixed) & {"V202", "V905"}


def test_memory_is_not_judged_when_the_layout_is_wrong():
    big = "train.max_tokens_per_gpu=2097152"  # activations beyond any GPU (with the chunked
    # loss head 262144 tokens fit)
    assert "V801" in codes(run_spec(SPEC, [big]))
    for wrong in ("train.parallel.tp=3", "train.max_tokn=3", "train.parallel.ep=3"):
        result = run_spec(SPEC, [big, wrong])
        assert not result.ok and not any(c.startswith("V8") for c in codes(result)), wrong


def test_causes_are_listed_before_consequences():
    result = run_spec(SPEC, ["train.max_tokens_per_gpu=2097152",
                             'cluster.env.CUDA_VISIBLE_DEVICES="0"'])
    order = [d.code for d in result.diagnostics if d.severity == "error"]
    assert "V707" in order and "V801" in order
    assert order.index("V707") < order.index("V801")
