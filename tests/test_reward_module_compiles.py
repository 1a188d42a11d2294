"""V907 and V930 read a reward or rollout-function module's source without running it: a
module that cannot be compiled is reported with the file and line of its syntax error."""

from __future__ import annotations

import sys
from pathlib import Path

from specsupport import ROOT, run_spec

SPEC = ROOT / "specs" / "qwen3_30b.toml"


def _spec_beside(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "spec.toml"
    spec.write_text(SPEC.read_text())
    return spec


def _found(spec: Path, code: str, *sets: str):
    result = run_spec(spec, list(sets))
    return [d for d in result.diagnostics if d.code == code]


def test_a_reward_module_with_a_syntax_error_is_named_with_its_line(tmp_path):
    spec = _spec_beside(tmp_path)
    (tmp_path / "broken_reward.py").write_text(
        "import torch\n\ndef score(**kw):\n    return 1.0 +\n")
    [diag] = _found(spec, "V907", 'rollout.reward="broken_reward:score"')
    assert diag.severity == "warning"
    assert f"{tmp_path / 'broken_reward.py'}:4" in diag.message
    assert "invalid syntax" in diag.message
    assert diag.location is not None and diag.location.line >= 1
    assert diag.help and "python -m py_compile" in diag.help
    assert "broken_reward" not in sys.modules


def test_a_syntax_error_in_the_package_above_the_module_is_named(tmp_path):
    spec = _spec_beside(tmp_path)
    package = tmp_path / "rewardpkg"
    package.mkdir()
    (package / "__init__.py").write_text("x = (\n")
    (package / "scores.py").write_text("def score(**kw):\n    return 1.0\n")
    [diag] = _found(spec, "V907", 'rollout.reward="rewardpkg.scores:score"')
    assert f"{package / '__init__.py'}:1" in diag.message


def test_a_rollout_function_module_with_a_syntax_error_is_named(tmp_path):
    spec = _spec_beside(tmp_path)
    (tmp_path / "broken_rollout.py").write_text("def rollout(x):\n  return x\n    pass\n")
    [diag] = _found(spec, "V930", 'rollout.function="broken_rollout:rollout"')
    assert f"{tmp_path / 'broken_rollout.py'}:3" in diag.message


def test_an_eval_datasets_own_reward_module_is_checked(tmp_path):
    spec = _spec_beside(tmp_path)
    (tmp_path / "eval_reward.py").write_text("def score(**kw)\n    return 1.0\n")
    text = spec.read_text() + (
        '\n[eval]\ninterval = 5\n[[eval.datasets]]\nname = "held"\n'
        f'prompt_data = "{ROOT / "specs" / "data" / "tiny_arithmetic.jsonl"}"\n'
        'reward = "eval_reward:score"\n')
    spec.write_text(text)
    [diag] = _found(spec, "V907")
    assert diag.key == "eval.datasets[0].reward"
    assert f"{tmp_path / 'eval_reward.py'}:1" in diag.message


def test_a_module_that_compiles_is_clean(tmp_path):
    spec = _spec_beside(tmp_path)
    (tmp_path / "good_reward.py").write_text("def score(**kw):\n    return 1.0\n")
    assert _found(spec, "V907", 'rollout.reward="good_reward:score"') == []
