"""`--set key.path=value`: TOML values on the command line, merged over the spec."""

from __future__ import annotations

import copy
import re
import tomllib

from vime.diagnostics import Diagnostic, Location
from vime.parse import MAX_NESTING, Path, SpanIndex, deepest, long_integer, too_deep

_KEY_PATH = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
_BARE_WORD = re.compile(r"^[A-Za-z_/.~][^\s\"'=\[\]{}#]*$")


class Override:
    def __init__(self, index: int, argument: str, path: Path, value: object):
        self.index, self.argument, self.path, self.value = index, argument, path, value

    @property
    def location(self) -> Location:
        col = self.argument.find("=") + 2
        return Location(f"--set[{self.index}]", 1, col, self.argument)


def parse_override(index: int, argument: str) -> Override | Diagnostic:
    where = Location(f"--set[{index}]", 1, 1, argument)
    key, sep, text = argument.partition("=")
    key = key.strip()
    if not sep or not _KEY_PATH.match(key):
        return Diagnostic("error", "V004", (), f"--set {argument!r} is not key.path=value", where,
                          help="write it as --set train.parallel.tp=8 (TOML value syntax)")
    path = tuple(key.split("."))
    deep = Diagnostic("error", "V004", path[:MAX_NESTING],
                      f"--set {key[:60]}{'...' if len(key) > 60 else ''}: the key and value "
                      f"nest tables and arrays more than {MAX_NESTING} levels deep; no key of "
                      "vime's is deeper than 4", where,
                      help="set a key of the spec (docs/spec.md has every key)")
    if len(path) > MAX_NESTING or too_deep(text) is not None:  # before tomllib recurses
        return deep
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except RecursionError:
        return deep
    except tomllib.TOMLDecodeError:
        # torchtitan-style: a bare word is a string (--set experiment.name=run2)
        if not _BARE_WORD.match(text.strip()):
            return Diagnostic("error", "V004", tuple(key.split(".")),
                              f"--set {key}: {text!r} is not a TOML value", where,
                              help='quote strings: --set data.prompt_data="/data/x.jsonl"')
        value = text.strip()
    except ValueError:  # int() refused a literal for its length (tomllib's bare ValueError)
        long = long_integer(text)
        return Diagnostic("error", "V004", path,
                          f"--set {key}: an integer of {long[1] if long else 'too many'} digits "
                          "(Python reads integers of up to 4300)", where,
                          help="write a number of the key's range (docs/spec.md)")
    if isinstance(value, dict | list) and deepest(value, path[:-1] + ("",)) is not None:
        return deep
    return Override(index, argument, path, value)


def apply(raw: dict, overrides: list[Override]) -> tuple[dict, list[Diagnostic]]:
    """A new dict with the overrides merged in; the input is not changed."""
    merged = copy.deepcopy(raw)
    problems = []
    for override in overrides:
        table = merged
        for depth, part in enumerate(override.path[:-1]):
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                problems.append(Diagnostic(
                    "error", "V004", override.path[: depth + 1],
                    f"--set {'.'.join(override.path)}: {'.'.join(override.path[:depth + 1])} "
                    "is a value, not a table", override.location,
                    help="set the key itself, not a key inside it"))
                break
        else:
            table[override.path[-1]] = override.value
    return merged, problems


class Positions:
    """Maps key paths to the place the user wrote them: a --set wins over the file."""

    def __init__(self, spans: SpanIndex, overrides: list[Override] = ()):
        self.spans = spans
        self.overrides = {o.path: o for o in overrides}

    def origin_kind(self, path: Path) -> str:
        return "set" if self._override(path) else "spec"

    def _override(self, path: Path) -> Override | None:
        for end in range(len(path), 0, -1):
            if path[:end] in self.overrides:
                return self.overrides[path[:end]]
        return None

    def locate(self, path: Path) -> Location:
        override = self._override(path)
        if override is not None:
            return override.location
        if tuple(path) not in self.spans.spans:
            # a table only a --set wrote (--set train.paralel.tp=2): point at that argument,
            # not at the closest table of the file
            below = [o for p, o in self.overrides.items() if p[:len(path)] == tuple(path)]
            if below:
                first = min(below, key=lambda o: o.index)
                return Location(first.location.file, 1, 1, first.argument)
        return self.spans.locate(path)

    def written(self, path: Path) -> bool:
        return self._override(path) is not None or path in self.spans.spans
