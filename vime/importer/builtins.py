"""The builtins of launch scripts that shell.py's Reader follows, as pure functions of their
words: `read` and `mapfile` (the variables they set), IFS field splitting, `printf` formats,
and the header of an arithmetic `for ((init; test; step))` loop."""

from __future__ import annotations

import re
from typing import NamedTuple

from vime.importer.lexer import NAME, Tok


class ReadCommand(NamedTuple):
    targets: tuple[str, ...]  # the variables `read` sets
    array: bool  # -a: one array of the fields
    here: Tok | None  # the word after <<<
    plain: bool  # no input but a here-string, no option but -r -s -e -a -p -t


def parse_read(toks: list[Tok]) -> ReadCommand:
    """The words after `read`: its options, the variables it sets and its here-string."""
    names: list[str] = []
    array_name: str | None = None
    here: Tok | None = None
    plain = True
    k = 0
    while k < len(toks):
        tok = toks[k]
        k += 1
        if tok.kind == "op":
            if tok.text == "<<<" and here is None and k < len(toks) and toks[k].kind == "word":
                here = toks[k]
                k += 1
            else:
                plain = False  # < FILE, < <(cmd), <<EOF, >: input the reader does not see
            continue
        text = tok.literal()
        if tok.kind != "word" or text is None or tok.redirects:
            plain = False
            continue
        if text.startswith("-") and len(text) > 1 and text != "--" and not names:
            for at, letter in enumerate(text[1:], start=1):
                if letter in "adinNptu":  # the options that take a value
                    value = text[at + 1:]
                    if not value and k < len(toks):
                        value = toks[k].literal() or ""
                        k += 1
                    if letter == "a":
                        array_name = value
                    elif letter not in "pt":
                        plain = False  # a delimiter, a count or a file descriptor
                    break
                if letter not in "rse":
                    plain = False
            continue
        if text != "--":
            names.append(text)
    targets = (array_name,) if array_name is not None else tuple(names) or ("REPLY",)
    targets = tuple(name for name in targets if NAME.fullmatch(name))
    return ReadCommand(targets, array_name is not None and bool(targets), here, plain)


def mapfile_target(toks: list[Tok]) -> str:
    """The array `mapfile`/`readarray` fills: the first word after its options."""
    k = 0
    while k < len(toks) and toks[k].kind == "word":
        text = toks[k].literal() or ""
        k += 1
        if text.startswith("-") and len(text) > 1:
            if text[-1] in "dnOsuCc" and len(text) == 2:  # an option whose value follows
                k += 1
            continue
        return text
    return "MAPFILE"


def split_on_ifs(text: str, ifs: str) -> list[tuple[int, int]]:
    """Where bash's `read` finds fields in a line: IFS whitespace at either end is dropped,
    a run of it separates; each other IFS character ends a field (so "a,,b" has an empty
    second field, and a trailing one makes no field)."""
    whitespace = "".join(c for c in ifs if c in " \t\n")
    start, stop = 0, len(text)
    while start < stop and text[start] in whitespace:
        start += 1
    while stop > start and text[stop - 1] in whitespace:
        stop -= 1
    spans: list[tuple[int, int]] = []
    field_start, i = start, start
    while i < stop:
        c = text[i]
        if c not in ifs:
            i += 1
            continue
        spans.append((field_start, i))
        j = i + 1
        while j < stop and text[j] in whitespace:
            j += 1
        if c in whitespace and j < stop and text[j] in ifs:  # blanks around one delimiter
            j += 1
            while j < stop and text[j] in whitespace:
                j += 1
        field_start = i = j
    if field_start < stop:
        spans.append((field_start, stop))
    return spans


def printf_format(form: str, args: list[str]) -> str | None:
    """What `printf FORM ARGS...` prints, for %s, %d and %% directives and backslash-n/-t
    escapes (FORM is reused while arguments remain, as bash does); None for any other
    directive."""
    pieces = re.split(r"(%[sd%]|%|\\[nt\\])", form)
    if any(piece == "%" for piece in pieces):
        return None  # %f, %x, %-5s and the like
    takes = sum(1 for piece in pieces if piece in ("%s", "%d"))
    out: list[str] = []
    rest = list(args)
    while True:
        for piece in pieces:
            if piece in ("%s", "%d"):
                value = rest.pop(0) if rest else ("" if piece == "%s" else "0")
                if piece == "%d" and not re.fullmatch(r"[-+]?\d+", value.strip()):
                    return None
                out.append(value if piece == "%s" else str(int(value)))
            elif piece == "%%":
                out.append("%")
            elif piece.startswith("\\"):
                out.append({"\\n": "\n", "\\t": "\t", "\\\\": "\\"}[piece])
            else:
                out.append(piece)
        if not rest or not takes:
            return "".join(out)


class ArithFor(NamedTuple):
    """`for ((NAME = START; TEST; NAME STEP))`: the loop variable, its first value's
    expression, the test, and the step as an operator and an expression."""

    name: str
    start: str
    test: str
    step_op: str  # "+" or "-" (NAME += EXPR, NAME++), "=" (NAME = EXPR)
    step: str


def arith_for(header: str) -> ArithFor | None:
    """The three parts of an arithmetic for loop's header, or None for a form the reader does
    not follow (several variables, an empty part)."""
    parts = header.split(";")
    if len(parts) != 3:
        return None
    init, test, step = (part.strip() for part in parts)
    first = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([^,=]+)", init)
    if first is None or not test:
        return None
    name = first.group(1)
    counted = re.fullmatch(rf"(?:{name}\s*(\+\+|--)|(\+\+|--)\s*{name})", step)
    if counted:
        return ArithFor(name, first.group(2), test, (counted.group(1) or counted.group(2))[0], "1")
    moved = re.fullmatch(rf"{name}\s*([-+]?)=\s*([^,=]+)", step)
    if moved is None:
        return None
    return ArithFor(name, first.group(2), test, moved.group(1) or "=", moved.group(2))
