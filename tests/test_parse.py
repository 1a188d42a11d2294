from vime.parse import ParseError, Source, parse

TEXT = '''\
# comment
[experiment]
name = "x"   # trailing
"quoted key" = 1
dotted.inner = 2

[train.parallel]
tp = 4
note = """multi
line = not a key
"""
sizes = [
  1,
  2, # c
  [3, 4],
]
inline = { a = 1, b = { c = 2 } }

[[runs]]
x = 1
[[runs]]
x = 2
'''


def test_every_key_path_has_its_position():
    raw, spans = parse(Source("s.toml", TEXT))
    assert raw["train"]["parallel"]["tp"] == 4
    where = spans.spans
    assert where[("experiment",)] == (2, 1)
    assert where[("experiment", "name")] == (3, 1)
    assert where[("experiment", "quoted key")] == (4, 1)
    assert where[("experiment", "dotted", "inner")] == (5, 8)
    assert where[("train", "parallel", "tp")] == (8, 1)
    assert ("train", "parallel", "line") not in where  # inside a multi-line string
    assert where[("train", "parallel", "sizes", 1)] == (14, 3)
    assert where[("train", "parallel", "sizes", 2, 1)] == (15, 7)
    assert where[("train", "parallel", "inline", "b", "c")] == (17, 25)
    assert where[("runs", 1, "x")] == (22, 1)


def test_locate_falls_back_to_the_closest_written_table():
    _, spans = parse(Source("s.toml", TEXT))
    loc = spans.locate(("train", "parallel", "ep"))
    assert (loc.file, loc.line, loc.col, loc.text) == ("s.toml", 7, 1, "[train.parallel]")
    assert spans.locate(("nowhere",)).line == 1


def test_syntax_error_is_a_positioned_v001():
    try:
        parse(Source("bad.toml", "[a]\nx = 1\ny = oops\n"))
    except ParseError as err:
        diag = err.diagnostic
        assert diag.code == "V001"
        assert (diag.location.line, diag.location.col) == (3, 5)
        assert "at line" not in diag.message
    else:
        raise AssertionError("no ParseError")
