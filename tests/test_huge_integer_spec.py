"""An integer literal longer than Python converts (4,300 digits: sys.get_int_max_str_digits),
in the spec or a --set, is a positioned diagnostic, never an internal error: tomllib raises a
bare ValueError for it, not its TOMLDecodeError."""

from __future__ import annotations

from specsupport import ROOT, run_text

from vime.cli import main

TINY = (ROOT / "specs" / "tiny_cpu.toml").read_text()
HUGE = "9" * 5000


def _errors(text: str, sets=()):
    result = run_text(text, sets)
    assert not result.ok
    return [d for d in result.diagnostics if d.severity == "error"]


def test_a_huge_integer_in_the_spec_is_a_positioned_v001():
    text = TINY.replace("seed = 1234", f"seed = {HUGE}")
    [diag] = _errors(text)
    line = text[:text.index(HUGE)].count("\n") + 1
    assert diag.code == "V001" and diag.location.line == line
    assert diag.location.col == len("seed = ") + 1
    assert "an integer of 5000 digits" in diag.message


def test_a_huge_integer_in_a_set_is_a_bad_override():
    [diag] = [d for d in _errors(TINY, [f"experiment.seed={HUGE}"]) if d.code == "V004"]
    assert "5000 digits" in diag.message


def test_the_cli_exits_1(tmp_path, capsys):
    spec = tmp_path / "huge.toml"
    spec.write_text(f"x = {HUGE}\n")
    assert main(["plan", str(spec), "--format", "concise"]) == 1
    err = capsys.readouterr().err
    assert f"{spec}:1:5: error[V001]" in err and "internal error" not in err
