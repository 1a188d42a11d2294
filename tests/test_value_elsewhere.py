"""A value that is not one of its key's names but is one of another key's (algorithm.name =
"gspo", the advantage estimator's name) points at that key, not at the closest name."""

from __future__ import annotations

from specsupport import ROOT, run_spec

SPEC = ROOT / "specs" / "tiny_cpu.toml"


def _v003(*sets: str):
    return [d for d in run_spec(SPEC, list(sets)).diagnostics if d.code == "V003"]


def test_an_estimators_name_in_algorithm_name_points_at_advantage_estimator():
    [diag] = _v003("algorithm.name=gspo")
    assert diag.message == "algorithm.name: 'gspo' is not one of 'grpo'"
    assert diag.help == ('"gspo" is a value of algorithm.advantage_estimator, not of '
                         'algorithm.name: write algorithm.advantage_estimator = "gspo" '
                         '(algorithm.name takes "grpo")')
    [diag] = _v003("algorithm.name=RLOO")
    assert 'write algorithm.advantage_estimator = "rloo"' in diag.help


def test_a_value_of_a_key_in_another_table_names_that_key():
    [diag] = _v003('train.recompute="token-mean"')
    assert diag.help == ('"token-mean" is a value of algorithm.loss_aggregation, '
                                "not of train.recompute: write algorithm.loss_aggregation = "
                                '"token-mean" (train.recompute takes "none", "selective", '
                                '"full")')


def test_a_misspelt_name_still_gets_the_closest_one():
    [diag] = _v003("algorithm.name=grp0")
    assert diag.help == 'did you mean "grpo"?'
    [diag] = _v003("algorithm.advantage_estimator=gsp0")
    assert diag.help == 'did you mean "gspo"?'
