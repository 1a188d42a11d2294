"""`json.dumps(obj, indent=2, ensure_ascii=False)`, byte for byte, fast enough for the plan of
the largest cluster the schema admits (262,144 ranks and engines, 200 MB of JSON: the standard
library's indented encoder is pure Python and one call per value, 6.8 s there:
benchmarks/plan_startup.py).

Two things make it fast. A list of values of one kind (all ints, all strings, all objects with
the same keys, all lists of one length) is encoded as a whole, with map and join doing the
steps per value in C; text shared by every object of such a list (a key, a value that is the
same in all of them) is written once per object as one piece. And the plan's big arrays can be
given as `Rows` (objects with the same keys, held as one column per key) and `Chunks` (lists of
one length, held as one flat list), so that 262,144 dicts and lists need not be built to be
written. tests/test_jsontext.py compares it with json.dumps.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from itertools import chain, repeat
from json.encoder import encode_basestring
from operator import itemgetter


class Rows(Sequence):
    """A JSON array of objects that all have these keys in this order, held as one column per
    key: a sequence of the values of that key, object after object (a list, a range, or a
    Rows or Chunks when the values are objects or lists). Indexing gives plain dicts."""

    def __init__(self, keys: Sequence[str], columns: Sequence[Sequence]):
        self.keys, self.columns = tuple(keys), list(columns)
        lengths = set(map(len, self.columns))
        if len(self.keys) != len(self.columns) or len(lengths) > 1:
            raise ValueError("one column of one length per key")
        self._len = lengths.pop() if lengths else 0

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return dict(zip(self.keys, (column[index] for column in self.columns), strict=True))

    def __iter__(self):
        return map(dict, map(zip, repeat(self.keys), zip(*self.columns, strict=True)))

    def __eq__(self, other):
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"Rows({list(self.keys)}, {len(self)} rows)"


class Chunks(Sequence):
    """A JSON array of lists of `size` items each, held as one flat sequence of the items."""

    def __init__(self, flat: Sequence, size: int):
        if size < 1 or len(flat) % size:
            raise ValueError(f"{len(flat)} items are not lists of {size}")
        self.flat, self.size = flat, size

    def __len__(self) -> int:
        return len(self.flat) // self.size

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError("Chunks index out of range")
        start = index % len(self) * self.size
        return list(self.flat[start:start + self.size])

    def __iter__(self):
        return map(list, zip(*[iter(self.flat)] * self.size, strict=True))

    def __eq__(self, other):
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"Chunks({len(self)} lists of {self.size})"


def dumps(obj, end: str = "") -> str:
    """json.dumps(obj, indent=2, ensure_ascii=False) + end, Rows and Chunks written as the
    lists they stand for."""
    return "".join(_pieces(obj, end))


def write(obj, stream, end: str = "") -> None:
    """stream.write(dumps(obj, end)) a part at a time: the text of a plan of 262,144 ranks is
    200 MB, and its encoded bytes as much again."""
    pieces = _pieces(obj, end)
    for start in range(0, len(pieces), 1 << 16):
        stream.write("".join(pieces[start:start + (1 << 16)]))


def _pieces(obj, end: str) -> list[str]:
    out: list[str] = []
    _Encoder().one(obj, 0, out)
    out.append(end)
    return out


# types whose equal values have the same text (not float: 0.0 == -0.0; not containers: 1 == True)
_EXACT = {int, str, bool, type(None)}
_CONSTANTS = {None: "null", True: "true", False: "false"}
# an item of more pieces than this is joined into one string (a group of 262,144 ranks)
_MAX_PIECES = 64


def _newline(level: int) -> str:
    return "\n" + "  " * level


class _Encoder:
    """Lists are encoded as `Pieces`: (flat, m), item i's text the join of flat[i*m:(i+1)*m].
    Every item of a list has the same number of pieces (the braces, keys and separators of
    items of one shape are the same), so a list of objects is woven from its columns with a
    slice assignment per piece (flat[j::m] = ...), in C, not a Python step per item, and the
    whole text is joined once at the end."""

    # the text of the ints 0, 1, 2, ... up to the largest met so far: a plan writes the same
    # rank numbers many times over (ranks, groups, engines)
    ints: list[str]

    def __init__(self):
        self.ints = []

    def one(self, value, level: int, out: list[str]) -> None:
        """Append to `out` the pieces of the encoding of one value that sits at `level`."""
        inner = _newline(level + 1)
        if type(value) in (list, tuple) or isinstance(value, (Rows, Chunks)):
            if not len(value):
                out.append("[]")
                return
            out.append("[" + inner)
            flat, m = self.many(value, level + 1)
            sep, count = "," + inner, len(value)
            if m == 1:
                out.append(sep.join(flat))
            else:
                # the last piece of every item is the same (its closing brace): "," after it
                # but in the last item
                last = flat[m - 1]
                if flat[m - 1::m].count(last) == count:
                    flat[m - 1::m] = [last + sep] * count
                    flat[-1] = last
                else:
                    flat = _weave([(flat, m), sep], count)
                    flat[-1] = ""
                out += flat
            out.append(_newline(level) + "]")
        elif type(value) is dict and value and all(type(key) is str for key in value):
            out.append("{" + inner)
            for k, (key, item) in enumerate(value.items()):
                out.append(("," + inner if k else "") + encode_basestring(key) + ": ")
                self.one(item, level + 1, out)
            out.append(_newline(level) + "}")
        elif type(value) is str:
            out.append(encode_basestring(value))
        elif type(value) is int:
            out.append(int.__repr__(value))
        elif value is None or value is True or value is False:
            out.append(_CONSTANTS[value])
        elif type(value) is float:  # as json.encoder's floatstr
            out.append(float.__repr__(value) if math.isfinite(value) else
                       "NaN" if value != value else "Infinity" if value > 0 else "-Infinity")
        else:
            # anything else (an empty or odd dict, a subclass, ...): the standard
            # library's own text, indented to this level (JSON has no raw line breaks in
            # strings)
            out.append(json.dumps(value, indent=2, ensure_ascii=False).replace(
                "\n", _newline(level)))

    def encoded(self, value, level: int) -> str:
        out: list[str] = []
        self.one(value, level, out)
        return "".join(out)

    def many(self, values, level: int) -> tuple[list[str], int]:
        """The encodings of all of `values`, each a value at indentation `level`, as pieces."""
        if isinstance(values, Rows):
            return self.objects(values.keys, values.columns, len(values), level)
        if isinstance(values, Chunks):
            return self.chunks(self.many(values.flat, level + 1), values.size, len(values),
                               level)
        if type(values) is range:
            return self.int_texts(values), 1
        values = values if type(values) is list else list(values)
        kinds = set(map(type, values))
        if (len(kinds) == 1 and kinds <= _EXACT and values[-1] == values[0]
                and values.count(values[0]) == len(values)):
            return [self.encoded(values[0], level)] * len(values), 1  # a column of one value
        if kinds == {int}:
            return self.int_texts(values), 1
        if kinds == {str}:
            return list(map(encode_basestring, values)), 1
        if kinds == {dict}:
            keys = set(map(tuple, values))  # tuple(d): d's keys in order
            if len(keys) == 1:
                (names,) = keys
                if not names:
                    return ["{}"] * len(values), 1
                if all(type(name) is str for name in names):
                    columns = [list(map(itemgetter(name), values)) for name in names]
                    return self.objects(names, columns, len(values), level)
        if kinds and kinds <= {list, tuple}:
            lengths = set(map(len, values))
            if lengths == {0}:
                return ["[]"] * len(values), 1
            if len(lengths) == 1:
                flat = list(chain.from_iterable(values))
                return self.chunks(self.many(flat, level + 1), lengths.pop(), len(values),
                                   level)
        return [self.encoded(value, level) for value in values], 1

    def int_texts(self, values: list[int] | range) -> list[str]:
        """repr of each of a list or range of ints."""
        if not values:
            return []
        low, high = ((values[0], values[-1]) if type(values) is range and values.step > 0
                     else (min(values), max(values)))
        if low < 0 or high > 2 * len(values) + 1024:  # the table would not pay off
            return list(map(int.__repr__, values))
        if high >= len(self.ints):
            self.ints += map(int.__repr__, range(len(self.ints), high + 1))
        if type(values) is range:
            return self.ints[values.start:values.stop:values.step]
        return list(map(self.ints.__getitem__, values))

    @staticmethod
    def chunks(items: tuple[list[str], int], size: int, count: int,
               level: int) -> tuple[list[str], int]:
        """`count` arrays of `size` encoded items each, each array at `level`."""
        inner = _newline(level + 1)
        flat, m = items
        opening, closing, sep = "[" + inner, _newline(level) + "]", "," + inner
        pieces = size * (m + 1) + 1  # "[", each item's m pieces and a "," after it, "]"
        if pieces > _MAX_PIECES:  # long arrays, few of them (a dp group of every rank)
            texts = _strings(flat, m)
            return [opening + sep.join(texts[a * size:(a + 1) * size]) + closing
                    for a in range(count)], 1
        segments: list = [opening]
        for k in range(size):  # item k of every array: m pieces from k*m, every size*m
            segments += [(_every(flat, k * m, size * m, m), m), sep]
        segments[-1] = closing
        return _weave(segments, count), pieces

    def objects(self, names: tuple[str, ...], columns: list, count: int,
                level: int) -> tuple[list[str], int]:
        """`count` objects with these keys, each at `level`; columns[k] holds the values of
        names[k], object after object."""
        if count == 0:
            return [], 1
        inner = _newline(level + 1)
        # alternating: text shared by all objects (braces, keys, and the values that are the
        # same in every object), then the pieces of a column's values
        segments: list = []
        text = "{" + inner
        for k, (name, column) in enumerate(zip(names, columns, strict=True)):
            text += ("," + inner if k else "") + encode_basestring(name) + ": "
            flat, m = self.many(column, level + 1)
            if all(flat[q - m] == flat[q] and (flat if m == 1 else flat[q::m]).count(flat[q])
                   == count for q in range(m)):
                text += "".join(flat[:m])
            else:
                segments += [text, (flat, m)]
                text = ""
        segments.append(text + _newline(level) + "}")
        pieces = len(segments) // 2 + sum(seg[1] for seg in segments[1::2]) + 1
        if pieces > _MAX_PIECES:
            return _strings(_weave(segments, count), pieces), 1
        return _weave(segments, count), pieces


def _every(flat: list[str], start: int, step: int, m: int) -> list[str]:
    """The m pieces from flat[start], flat[start + step], ...: runs of m pieces."""
    if m == 1:
        return flat[start::step]
    return _weave([(flat[start + q::step], 1) for q in range(m)], len(flat) // step)


def _weave(segments: list, count: int) -> list[str]:
    """The pieces of `count` items, each the segments in order: a string (the same in every
    item) or (flat, m), m pieces of each item."""
    width = sum(1 if isinstance(seg, str) else seg[1] for seg in segments)
    out = [""] * (width * count)
    at = 0
    for seg in segments:
        if isinstance(seg, str):
            out[at::width] = [seg] * count
            at += 1
        else:
            flat, m = seg
            for q in range(m):
                out[at + q::width] = flat[q::m]
            at += m
    return out


def _strings(flat: list[str], m: int) -> list[str]:
    """Each item's text from its m pieces."""
    return flat if m == 1 else list(map("".join, zip(*[iter(flat)] * m, strict=True)))
