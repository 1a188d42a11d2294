"""Per-rule fixtures: every code has a failing spec and a passing neighbour."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from specsupport import ROOT, codes, run_text

from vime import check, pipeline

FIXTURES = tomllib.loads((Path(__file__).parent / "fixtures" / "rules.toml").read_text())
ALL_CODES = sorted({*check.RULES, *check.STAGE_CODES})


def _case(code: str, side: str, tmp_path: Path, make_checkpoint):
    fixture = FIXTURES[code]
    base = ROOT / "specs" / f"{fixture['base']}.toml"
    text = base.read_text()
    edit = fixture.get(f"{side}_edit")
    if edit:
        assert edit[0] in text, f"{code}: {side}_edit does not match {base.name}"
        text = text.replace(edit[0], edit[1])
    tmp = make_checkpoint(fixture["config_json"]) if "config_json" in fixture else tmp_path
    patch = fixture.get(f"{side}_config_patch")
    if patch:  # the preset's config.json with these keys changed (another architecture)
        config = json.loads((tmp / "config.json").read_text())
        (tmp / "config.json").write_text(json.dumps({**config, **patch}))
    for name, content in fixture.get("files", {}).items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(content)
    sets = [s.replace("{tmp}", str(tmp)) for s in fixture.get(side, [])]
    encoding = fixture.get(f"{side}_encoding")
    if encoding:  # the file's bytes in another encoding (V006)
        return pipeline.run_file(f"specs/{base.name}", text.encode(encoding), sets, base.parent)
    return run_text(text, sets, name=f"specs/{base.name}", spec_dir=base.parent)


def test_every_code_has_a_fixture_pair_and_an_explanation():
    assert sorted(FIXTURES) == ALL_CODES
    for code in ALL_CODES:
        text = check.explain(code)
        assert text and code in text and len(text.splitlines()) >= 4, code
        assert "Fix" in text or "fix" in text, f"{code}: the explanation must say how to fix it"


@pytest.mark.parametrize("code", ALL_CODES)
def test_failing_fixture_reports_the_code(code, tmp_path, preset_checkpoint):
    result = _case(code, "fail", tmp_path, preset_checkpoint)
    found = [d for d in result.diagnostics if d.code == code]
    assert found, f"{code} not reported; got {[d.code for d in result.diagnostics]}"
    assert any(d.key == FIXTURES[code]["path"] for d in found), [d.key for d in found]
    for diag in found:
        assert diag.location is not None and diag.location.line >= 1
        assert diag.message
    severity = check.RULES[code].severity if code in check.RULES else "error"
    if severity == "error":
        assert not result.ok and result.plan is None


@pytest.mark.parametrize("code", ALL_CODES)
def test_passing_neighbour_is_clean(code, tmp_path, preset_checkpoint):
    result = _case(code, "pass", tmp_path, preset_checkpoint)
    assert code not in codes(result)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics]
    assert result.plan is not None


def test_docs_rules_md_is_current():
    from vime.check.catalog import markdown

    assert (ROOT / "docs" / "rules.md").read_text() == markdown(), "run `make docs`"


@pytest.mark.parametrize("impl, warns", [("auto", True), ("local", True),
                                         ("transformer_engine", False)])
def test_v214_is_silent_only_where_the_layer_spec_already_needs_te(impl, warns):
    """transformer_engine makes TE a requirement of every node (the backend stops at start
    without it), so FusedAdam is there; under auto or local it may not be."""
    spec = ROOT / "specs" / "qwen3_30b_2node.toml"
    result = run_text(spec.read_text(), ["train.optimizer.precision_aware=true",
                                         f'train.transformer_impl="{impl}"'],
                      name=f"specs/{spec.name}", spec_dir=spec.parent)
    found = [d for d in result.diagnostics if d.code == "V214"]
    assert bool(found) == warns and result.ok
    for diag in found:
        assert f'transformer_impl = "{impl}"' in diag.message and diag.severity == "warning"
        assert 'train.transformer_impl = "transformer_engine"' in diag.help
        assert ("train", "transformer_impl") in [path for path, _ in diag.related]


@pytest.mark.parametrize("estimator, warns", [
    ("grpo", True), ("gspo", True), ("rloo", True), ("reinforce_plus_plus_baseline", True),
    ("reinforce_plus_plus", False)])
def test_v404_warns_for_every_estimator_whose_baseline_is_the_group(estimator, warns):
    spec = ROOT / "specs" / "tiny_cpu.toml"
    result = run_text(spec.read_text(), ["rollout.n_samples_per_prompt=1",
                                         "train.micro_batch_size=4",
                                         f'algorithm.advantage_estimator="{estimator}"'],
                      name=f"specs/{spec.name}", spec_dir=spec.parent)
    found = [d for d in result.diagnostics if d.code == "V404"]
    assert bool(found) == warns and result.ok
    assert all(estimator in d.message for d in found)


def test_the_checks_and_the_schema_name_what_the_runtime_runs():
    """The schema's enums and the rules' estimator groups are the runtime's own lists."""
    from runtime.core import algorithm, lr_schedule
    from vime import schema
    from vime.check import algorithm as algorithm_rules

    properties = schema.load()["properties"]
    algo = properties["algorithm"]["properties"]
    optimizer = properties["train"]["properties"]["optimizer"]["properties"]
    assert tuple(algo["advantage_estimator"]["enum"]) == algorithm.ADVANTAGE_ESTIMATORS
    assert tuple(algo["loss_aggregation"]["enum"]) == algorithm.LOSS_AGGREGATIONS
    assert tuple(optimizer["lr_decay_style"]["enum"]) == lr_schedule.LR_DECAY_STYLES
    assert algorithm_rules.GROUP_ESTIMATORS == algorithm.GROUP_ESTIMATORS
