"""Stage 1, parse: TOML text -> raw dict + span index (key path -> line:col).

tomllib keeps no positions, so values come from tomllib (the reference parser) and
positions come from a small scanner that walks the same text and records where each
key path is written. The scanner only has to find keys; tomllib has already said the
text is valid TOML by the time the scanner runs, so it can be lenient.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field

from vime.diagnostics import Diagnostic, Location, dotted

Path = tuple[str | int, ...]

# Tables and arrays inside one another: the schema's deepest value is 4 (eval.datasets[0].name,
# model.arch's rope_scaling.factor); tomllib recurses once an array or inline table nests, and
# stops with RecursionError near 500 levels, the later stages (deepcopy, jsonschema) sooner.
MAX_NESTING = 32
# an integer literal of more digits than int() converts (sys.get_int_max_str_digits, 4300 by
# default): tomllib raises a bare ValueError for it, not a TOMLDecodeError
_LONG_INTEGER = re.compile(r"(?<![\w.])[+-]?\d[\d_]{4000,}")


def long_integer(text: str) -> tuple[int, int] | None:
    """(offset, digits) of the first integer literal in text that int() refuses for its
    length, or None."""
    for found in _LONG_INTEGER.finditer(text):
        digits = sum(ch.isdigit() for ch in found[0])
        if digits > 4300:
            return found.start(), digits
    return None


@dataclass(frozen=True)
class Source:
    """One input text: a spec file, or one `--set` argument."""

    name: str
    text: str

    def line(self, number: int) -> str:
        lines = self.text.splitlines()
        return lines[number - 1] if 0 < number <= len(lines) else ""


@dataclass
class SpanIndex:
    """Where each key path was written. Tables map to their header line."""

    source: Source
    spans: dict[Path, tuple[int, int]] = field(default_factory=dict)

    def locate(self, path: Path) -> Location:
        """The position of `path`, or of its closest written ancestor, or the file's start."""
        probe = tuple(path)
        while probe:
            if probe in self.spans:
                line, col = self.spans[probe]
                return Location(self.source.name, line, col, self.source.line(line))
            probe = probe[:-1]
        return Location(self.source.name, 1, 1, self.source.line(1))


class ParseError(Exception):
    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


def decode(name: str, data: bytes) -> Source:
    """The text of a spec file: TOML is UTF-8 (a leading byte-order mark is dropped). Any
    other encoding is a V006 at the line and column of the first byte that is not UTF-8."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding, start = "UTF-16 (it starts with a UTF-16 byte-order mark)", 0
    else:
        try:
            return Source(name, data.decode("utf-8-sig"))
        except UnicodeDecodeError as err:
            encoding, start = "another encoding (Latin-1 or Windows-1252, most often)", err.start
    before = data[:start].decode("utf-8-sig")  # the bytes before the first bad one are UTF-8
    line = before.count("\n") + 1
    col = len(before) - (before.rfind("\n") + 1) + 1
    text = data.decode("utf-8", errors="replace")
    raise ParseError(Diagnostic(
        "error", "V006", (),
        f"the spec is not UTF-8: byte 0x{data[start]:02x} at line {line}, column {col} cannot "
        f"be read; the file is saved in {encoding}",
        Location(name, line, col, Source(name, text).line(line)),
        help="save the file as UTF-8 (an editor's Save with Encoding > UTF-8, or "
        "`iconv -t utf-8`): TOML files are UTF-8"))


_TOMLLIB_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")


def too_deep(text: str) -> tuple[int, int] | None:
    """The line and column of the first `[` or `{` that nests arrays and inline tables more
    than MAX_NESTING deep in TOML text, skipping strings and comments; None when none does.
    Table headers count as one or two levels while they are open."""
    depth, i, line, line_start = 0, 0, 1, 0
    while i < len(text):
        ch = text[i]
        if ch == "\n":
            line, line_start = line + 1, i + 1
        elif ch == "#":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        elif ch in "\"'":
            end = _string_end(text, i)
            line += text.count("\n", i, end)
            if "\n" in text[i:end]:
                line_start = text.rfind("\n", i, end) + 1
            i = end
            continue
        elif ch in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return line, i - line_start + 1
        elif ch in "]}":
            depth = max(depth - 1, 0)
        i += 1
    return None


def _string_end(text: str, start: int) -> int:
    """The index after the TOML string (any of the four kinds) that starts at `start`."""
    quote = text[start]
    if text.startswith(quote * 3, start):
        end = text.find(quote * 3, start + 3)
        if end < 0:
            return len(text)
        end += 3
        while text[end:end + 1] == quote:  # """a"""" ends one later
            end += 1
        return end
    i = start + 1
    while i < len(text) and text[i] not in (quote, "\n"):
        i += 2 if quote == '"' and text[i] == "\\" else 1
    return min(i + 1, len(text))


def deepest(value, path: Path = ()) -> Path | None:
    """The path of the first table or array (value's own at `path` included) nested more than
    MAX_NESTING deep, counting `path`'s own tables; None when there is none."""
    stack = [(tuple(path), value)]
    while stack:
        at, node = stack.pop()
        if len(at) > MAX_NESTING:
            return at
        children = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend(reversed([((*at, key), child) for key, child in children
                               if isinstance(child, dict | list)]))
    return None


def _too_deep_error(source: Source, line: int, col: int, path: Path = ()) -> ParseError:
    return ParseError(Diagnostic(
        "error", "V007", path,
        f"the spec nests tables and arrays more than {MAX_NESTING} levels deep; no key of "
        "vime's is deeper than 4", Location(source.name, line, col, source.line(line)),
        help="remove the nesting: a spec's values are numbers, strings, booleans and short "
        "lists (docs/spec.md has every key)"))


def parse(source: Source) -> tuple[dict, SpanIndex]:
    """Parse a spec; a syntax error becomes a V001 diagnostic, nesting deeper than any key a
    V007 (raised as ParseError)."""
    bracket = too_deep(source.text)
    if bracket is not None:  # before tomllib, which recurses into arrays and inline tables
        raise _too_deep_error(source, *bracket)
    try:
        raw = tomllib.loads(source.text)
    except RecursionError:
        raise _too_deep_error(source, 1, 1) from None
    except tomllib.TOMLDecodeError as err:
        found = _TOMLLIB_POSITION.search(str(err))
        line, col = (int(found[1]), int(found[2])) if found else (1, 1)
        message = _TOMLLIB_POSITION.sub("", str(err)).strip()
        if message.startswith(_WRITTEN_TWICE):
            twice = _written_twice(source)
            if twice is not None:
                raise ParseError(twice) from None
        raise ParseError(
            Diagnostic(
                "error",
                "V001",
                (),
                f"the spec is not valid TOML: {message}",
                Location(source.name, line, col, source.line(line)),
                help="fix the TOML syntax at this position (strings need quotes, "
                "tables are written [section])",
            )
        ) from None
    except ValueError:  # int() refused a literal for its length
        at, digits = long_integer(source.text) or (0, 0)
        line = source.text.count("\n", 0, at) + 1
        col = at - (source.text.rfind("\n", 0, at) + 1) + 1
        raise ParseError(Diagnostic(
            "error", "V001", (), f"the spec is not valid TOML for vime: an integer of {digits} "
            "digits (Python reads integers of up to 4300)",
            Location(source.name, line, col, source.line(line)),
            help="write a number of the key's range here (docs/spec.md)")) from None
    spans = SpanIndex(source, _Scanner(source.text).scan())
    deep = deepest(raw)
    if deep is not None:  # dotted keys and [a.b.c] headers nest without brackets
        deep = deep[:MAX_NESTING + 1]
        # the key's own place, or the first header written below it ([a.b.c] marks only itself)
        below = [at for path, at in spans.spans.items() if path[:len(deep)] == deep]
        where = spans.locate(deep)
        line, col = min(below) if below else (where.line, where.col)
        raise _too_deep_error(source, line, col, deep)
    return raw, spans


# tomllib's messages for a key or table written twice; they name neither the key nor the
# first place (and "Cannot overwrite a value" says "at end of document")
_WRITTEN_TWICE = ("Cannot overwrite a value", "Cannot declare", "Cannot mutate")


def _written_twice(source: Source) -> Diagnostic | None:
    """The first key or table the scanner saw written twice, as a V001 naming both places."""
    try:
        scanner = _Scanner(source.text)
        scanner.scan()
    except Exception:  # the scanner is lenient, but this text is known to be invalid
        return None
    if not scanner.conflicts:
        return None
    path, (first_line, first_col), (line, col) = scanner.conflicts[0]
    key = dotted(path)
    first = Location(source.name, first_line, first_col, source.line(first_line))
    return Diagnostic(
        "error", "V001", path,
        f"the spec is not valid TOML: {key} is written twice, at line {first_line} and "
        f"line {line}", Location(source.name, line, col, source.line(line)),
        help=f"keep one of the two: delete line {line} or line {first_line}",
        related=((path, first),))


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class _Scanner:
    """Records the position of every key, table header, inline-table key and array item."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.spans: dict[Path, tuple[int, int]] = {}
        self._array_tables: dict[Path, int] = {}
        # key paths given a value, and tables declared with a [header]: where, to name both
        # places of a key written twice (path, first line:col, second line:col)
        self._values: dict[Path, tuple[int, int]] = {}
        self._declared: dict[Path, tuple[int, int]] = {}
        self.conflicts: list[tuple[Path, tuple[int, int], tuple[int, int]]] = []

    # -- positions -------------------------------------------------------------------
    def _line_col(self, pos: int) -> tuple[int, int]:
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return line, col

    def _mark(self, path: Path, pos: int) -> None:
        self.spans.setdefault(path, self._line_col(pos))

    # -- low-level lexing ------------------------------------------------------------
    def _peek(self, n: int = 1) -> str:
        return self.text[self.pos : self.pos + n]

    def _skip_blank(self, newlines: bool) -> None:
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            if ch in " \t\r" or (newlines and ch == "\n"):
                self.pos += 1
            elif ch == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            else:
                return

    def _string(self) -> str:
        """Consume a string literal of any of TOML's four kinds and return its value (roughly)."""
        for quote in ('"""', "'''"):
            if self._peek(3) == quote:
                end = self.text.find(quote, self.pos + 3)
                end = len(self.text) if end < 0 else end
                while self.text[end + 3 : end + 4] == quote[0]:  # """a"""" ends one later
                    end += 1
                value = self.text[self.pos + 3 : end]
                self.pos = end + 3
                return value
        quote = self.text[self.pos]
        start = self.pos + 1
        self.pos = start
        while self.pos < len(self.text) and self.text[self.pos] not in (quote, "\n"):
            if quote == '"' and self.text[self.pos] == "\\":
                self.pos += 1
            self.pos += 1
        value = self.text[start : self.pos]
        self.pos += 1
        return value

    def _key(self) -> list[tuple[str, int]]:
        """A dotted key: its parts and where each part starts."""
        parts: list[tuple[str, int]] = []
        while True:
            self._skip_blank(newlines=False)
            start = self.pos
            if self._peek() in ('"', "'"):
                parts.append((self._string(), start))
            else:
                found = _BARE_KEY.match(self.text, self.pos)
                if not found:
                    return parts
                parts.append((found[0], start))
                self.pos = found.end()
            self._skip_blank(newlines=False)
            if self._peek() != ".":
                return parts
            self.pos += 1

    # -- values ----------------------------------------------------------------------
    def _value(self, path: Path) -> None:
        self._skip_blank(newlines=False)
        ch = self._peek()
        if ch in ('"', "'"):
            self._string()
        elif ch == "[":
            self._array(path)
        elif ch == "{":
            self._inline_table(path)
        else:  # number, bool, date: up to a delimiter
            while self.pos < len(self.text) and self.text[self.pos] not in ",]}\n#":
                self.pos += 1

    def _array(self, path: Path) -> None:
        self.pos += 1
        index = 0
        while self.pos < len(self.text):
            self._skip_blank(newlines=True)
            if self._peek() == "]":
                self.pos += 1
                return
            if self._peek() == ",":
                self.pos += 1
                continue
            self._mark((*path, index), self.pos)
            self._value((*path, index))
            index += 1

    def _inline_table(self, path: Path) -> None:
        self.pos += 1
        while self.pos < len(self.text):
            self._skip_blank(newlines=True)
            if self._peek() == "}":
                self.pos += 1
                return
            if self._peek() == ",":
                self.pos += 1
                continue
            self._key_value(path)

    def _key_value(self, table: Path) -> None:
        parts = self._key()
        if not parts:  # not a key: skip the rest of the line
            end = self.text.find("\n", self.pos)
            self.pos = len(self.text) if end < 0 else end
            return
        path = table
        for name, start in parts:
            path = (*path, name)
            self._mark(path, start)
            if path in self._values:  # a = 1 then a = 2, or a.b = 2
                self.conflicts.append((path, self._values[path], self._line_col(start)))
        self._values.setdefault(path, self._line_col(parts[0][1]))
        self._skip_blank(newlines=False)
        if self._peek() == "=":
            self.pos += 1
            self._value(path)

    # -- document --------------------------------------------------------------------
    def _header(self) -> Path:
        array = self._peek(2) == "[["
        start = self.pos
        self.pos += 2 if array else 1
        path: Path = tuple(name for name, _ in self._key())
        self.pos = self.text.find("\n", self.pos)
        self.pos = len(self.text) if self.pos < 0 else self.pos
        if not array:
            here = self._line_col(start)
            for earlier in (self._declared, self._values):
                if path in earlier:  # [a] twice, or x = 1 then [x]
                    self.conflicts.append((path, earlier[path], here))
                    break
            self._declared.setdefault(path, here)
        if array:
            index = self._array_tables.get(path, -1) + 1
            self._array_tables[path] = index
            self._mark(path, start)
            path = (*path, index)
        self._mark(path, start)
        return path

    def scan(self) -> dict[Path, tuple[int, int]]:
        table: Path = ()
        while True:
            self._skip_blank(newlines=True)
            if self.pos >= len(self.text):
                return self.spans
            if self._peek() == "[":
                table = self._header()
            else:
                self._key_value(table)
