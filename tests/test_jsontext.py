"""vime/emit/jsontext.py writes what json.dumps(obj, indent=2, ensure_ascii=False) writes, byte
for byte, for any JSON data, and Rows and Chunks as the lists they stand for."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from vime.emit.jsontext import Chunks, Rows, dumps


def standard(obj) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False)


scalars = (st.integers(-3, 3) | st.integers() | st.booleans() | st.none()
           | st.floats(allow_nan=True) | st.sampled_from([0.0, -0.0, 1.0]) | st.text(max_size=4))
# values shaped like a plan's: lists of objects with the same keys, lists of lists of one length
keys = st.lists(st.text(max_size=3), min_size=0, max_size=3, unique=True)


def same_keys(children):
    return keys.flatmap(lambda names: st.lists(
        st.fixed_dictionaries({name: children for name in names}), max_size=6))


def same_length(children):
    return st.integers(0, 3).flatmap(lambda n: st.lists(
        st.lists(children, min_size=n, max_size=n), max_size=6))


values = st.recursive(
    scalars,
    lambda children: (st.lists(children, max_size=5) | st.tuples(children, children)
                      | st.dictionaries(st.text(max_size=3), children, max_size=4)
                      | same_keys(children) | same_length(children)),
    max_leaves=40)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(values)
def test_any_value_is_written_as_json_dumps_writes_it(value):
    assert dumps({"x": value, "y": [value, value]}) == standard({"x": value, "y": [value, value]})


def test_the_shapes_of_a_big_plan():
    ranks = [{"rank": r, "node": r // 8, "gpu": r % 8, "tp": r % 2, "pp": 0} for r in range(300)]
    groups = [[r, r + 1] for r in range(0, 300, 2)] + [[r] for r in range(4)]
    engines = [{"engine": e, "nodes": [e // 2], "gpus": [{"node": e // 2, "gpu": g}
                                                         for g in range(4)]} for e in range(9)]
    obj = {"ranks": ranks, "groups": {"two": groups[:150], "one": groups[150:],
                                      "all": [list(range(300))]},
           "engines": engines, "mixed": [1, True, 1.0, None, "1"], "same": [True] * 5,
           "zero": [0.0, -0.0, 0.0], "empty": [[], []], "empties": [{}, {}]}
    assert dumps(obj) == standard(obj)


def test_rows_and_chunks_are_written_as_their_lists():
    gpus = Rows(("node", "gpu"), (list(range(6)), [0, 1] * 3))
    engines = Rows(("engine", "tp", "gpus", "nodes"),
                   (range(3), [2] * 3, Chunks(gpus, 2), [[0], [1], [2]]))
    groups = Chunks(list(range(12)), 3)
    obj = {"engines": engines, "groups": groups, "long": Chunks(list(range(200)), 100),
           "none": Rows(("a",), ([],))}
    plain = {"engines": list(engines), "groups": list(groups),
             "long": [list(range(100)), list(range(100, 200))], "none": []}
    assert dumps(obj) == standard(plain)
    assert engines[1] == {"engine": 1, "tp": 2, "gpus": [{"node": 2, "gpu": 0},
                                                         {"node": 3, "gpu": 1}], "nodes": [1]}
    assert engines == list(engines) and groups[-1] == [9, 10, 11] and len(groups) == 4
