"""A spec nested deeper than any key vime has (arrays, inline tables, dotted keys or tables,
in the file or a --set) is V007 at the place it goes too deep, never an internal error."""

from __future__ import annotations

from specsupport import ROOT, run_text

from vime.cli import main
from vime.parse import MAX_NESTING

TINY = (ROOT / "specs" / "tiny_cpu.toml").read_text()


def _one(text: str, sets=()):
    result = run_text(text, sets)
    assert not result.ok
    return [d for d in result.diagnostics if d.severity == "error"]


def test_arrays_500_deep_are_pointed_at_where_they_pass_the_limit():
    [diag] = _one("x = 1\nnested = " + "[" * 500 + "]" * 500 + "\n" + TINY)
    assert diag.code == "V007" and diag.location.line == 2
    assert diag.location.col == len("nested = ") + MAX_NESTING + 1
    assert f"more than {MAX_NESTING} levels deep" in diag.message
    assert diag.help


def test_inline_tables_dotted_keys_and_headers_500_deep():
    for text, line in (("a = " + "{x = " * 500 + "1" + "}" * 500 + "\n", 1),
                       ("\n" + ".".join(["a"] * 500) + " = 1\n", 2),
                       ("\n\n[" + ".".join(["a"] * 500) + "]\n", 3)):
        [diag] = _one(text + TINY)
        assert diag.code == "V007" and diag.location.line == line, (text[:20], diag)


def test_nesting_just_past_the_limit_is_caught_before_the_later_stages():
    depth = MAX_NESTING + 1
    [diag] = _one("nested = " + "[" * depth + "]" * depth + "\n" + TINY)
    assert diag.code == "V007"
    assert not [d for d in _one(TINY.replace('name = "tiny-cpu"', 'name = 1'))
                if d.code == "V007"]


def test_a_deep_set_is_a_bad_override():
    deep_value = "x=" + "[" * 500 + "]" * 500
    deep_key = ".".join(["a"] * 500) + "=1"
    for argument in (deep_value, deep_key):
        [diag] = [d for d in _one(TINY, [argument]) if d.code == "V004"]
        assert f"more than {MAX_NESTING} levels deep" in diag.message


def test_the_cli_exits_1_with_the_diagnostic(tmp_path, capsys):
    spec = tmp_path / "deep.toml"
    spec.write_text("a = " + "[" * 500 + "]" * 500 + "\n")
    assert main(["plan", str(spec), "--format", "concise"]) == 1
    err = capsys.readouterr().err
    assert f"{spec}:1:{5 + MAX_NESTING}: error[V007]" in err and "internal error" not in err
