"""Tokens of the shell subset vime import reads: words (with their quoted and expanded
parts), operators and newlines; and the integer arithmetic of `$((...))`. Nothing here runs
or expands anything: vime/importer/shell.py does the reading."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ShellSyntaxError(Exception):
    pass


@dataclass
class Part:
    kind: str  # lit | var | cmd | arith
    text: str  # literal text, variable expression, command or arithmetic source
    quoted: bool


@dataclass
class Tok:
    kind: str  # word | op | nl | arr (NAME=( or NAME+=( )
    line: int
    parts: list[Part] = field(default_factory=list)
    text: str = ""  # op text, or the array's name
    source: str = ""  # a word as written
    redirects: bool = False  # a word of digits glued to < or >: a file descriptor (2>&1)

    @property
    def raw(self) -> str:
        return self.source if self.kind == "word" else self.text

    def literal(self) -> str | None:
        """The word's text when it has no expansion in it."""
        if self.kind != "word" or any(p.kind != "lit" for p in self.parts):
            return None
        return "".join(p.text for p in self.parts)


def _closing(src: str, i: int, open_: str, close: str) -> int:
    """Index just past the `close` that balances the `open_` before src[i]."""
    depth = 1
    while i < len(src):
        c = src[i]
        if c == "\\":
            i += 2
            continue
        if c == "'" and open_ == "(":
            end = src.find("'", i + 1)
            i = len(src) if end < 0 else end + 1
            continue
        if c == '"' and open_ == "(":
            i = _dquote_end(src, i + 1)
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ShellSyntaxError(f"no closing {close!r}")


def _dquote_end(src: str, i: int) -> int:
    while i < len(src):
        c = src[i]
        if c == "\\":
            i += 2
        elif c == '"':
            return i + 1
        elif src.startswith("$(", i):
            i = _closing(src, i + 2, "(", ")")
        elif src.startswith("${", i):
            i = _closing(src, i + 2, "{", "}")
        else:
            i += 1
    raise ShellSyntaxError("no closing '\"'")


def _dollar(src: str, i: int, quoted: bool) -> tuple[Part, int]:
    """The expansion starting at src[i] == '$'."""
    if src.startswith("$((", i):
        end = _closing(src, i + 3, "(", ")")
        if end < len(src) and src[end] == ")":
            return Part("arith", src[i + 3:end - 1], quoted), end + 1
        return Part("cmd", src[i + 2:end - 1], quoted), end
    if src.startswith("$(", i):
        end = _closing(src, i + 2, "(", ")")
        return Part("cmd", src[i + 2:end - 1], quoted), end
    if src.startswith("${", i):
        end = _closing(src, i + 2, "{", "}")
        return Part("var", src[i + 2:end - 1], quoted), end
    match = NAME.match(src, i + 1)
    if match:
        return Part("var", match.group(), quoted), match.end()
    if i + 1 < len(src) and src[i + 1] in "@*#?$!0123456789-":
        return Part("var", src[i + 1], quoted), i + 2
    return Part("lit", "$", quoted), i + 1


def _dquote_parts(src: str, start: int, end: int) -> list[Part]:
    parts: list[Part] = []
    buf = []
    i = start
    while i < end:
        c = src[i]
        if c == "\\" and i + 1 < end and src[i + 1] in '$`"\\\n':
            if src[i + 1] != "\n":
                buf.append(src[i + 1])
            i += 2
        elif c == "$":
            part, i = _dollar(src, i, True)
            if part.kind == "lit":
                buf.append(part.text)
                continue
            if buf:
                parts.append(Part("lit", "".join(buf), True))
                buf = []
            parts.append(part)
        elif c == "`":
            stop = src.find("`", i + 1)
            stop = end if stop < 0 or stop > end else stop
            if buf:
                parts.append(Part("lit", "".join(buf), True))
                buf = []
            parts.append(Part("cmd", src[i + 1:stop], True))
            i = stop + 1
        else:
            buf.append(c)
            i += 1
    parts.append(Part("lit", "".join(buf), True))  # "" stays a word
    return parts


OPERATORS = ("&&", "||", ";;", ">>", "&>", "<<<", "<<", ";", "&", "|", "(", ")", "<", ">")


def lex(src: str) -> list[Tok]:
    """Tokens of a whole file: words (with their parts), operators and newlines."""
    toks: list[Tok] = []
    heredocs: list[tuple[str, bool]] = []  # (delimiter, <<- strips tabs) of this line
    i, line = 0, 1
    n = len(src)
    while i < n:
        c = src[i]
        if c == "\\" and i + 1 < n and src[i + 1] == "\n":
            i, line = i + 2, line + 1
            continue
        if c in " \t\r":
            i += 1
            continue
        if c == "\n":
            toks.append(Tok("nl", line))
            i, line = i + 1, line + 1
            for delimiter, strip_tabs in heredocs:  # a here-document's body is not script
                while i < n:
                    end = src.find("\n", i)
                    end = n if end < 0 else end
                    body_line = src[i:end]
                    i, line = end + 1, line + 1
                    if (body_line.lstrip("\t") if strip_tabs else body_line) == delimiter:
                        break
            heredocs = []
            continue
        if c == "#":
            while i < n and src[i] != "\n":
                i += 1
            continue
        op = next((o for o in OPERATORS if src.startswith(o, i)), None)
        if op:
            toks.append(Tok("op", line, text=op))
            i += len(op)
            if op == "<<":
                heredoc = re.match(r"(-?)[ \t]*(['\"]?)([A-Za-z0-9_]+)\2", src[i:])
                if heredoc:
                    heredocs.append((heredoc.group(3), heredoc.group(1) == "-"))
            continue
        # a word
        tok = Tok("word", line)
        start_line, start = line, i
        while i < n and src[i] not in " \t\r\n;&|<>()":
            c = src[i]
            if c == "\\":
                if i + 1 < n and src[i + 1] == "\n":
                    i, line = i + 2, line + 1
                    continue
                tok.parts.append(Part("lit", src[i + 1:i + 2], True))
                i += 2
            elif c == "'":
                end = src.find("'", i + 1)
                if end < 0:
                    raise ShellSyntaxError(f"line {line}: no closing \"'\"")
                tok.parts.append(Part("lit", src[i + 1:end], True))
                line += src.count("\n", i, end)
                i = end + 1
            elif c == '"':
                try:
                    end = _dquote_end(src, i + 1)
                except ShellSyntaxError as err:
                    raise ShellSyntaxError(f"line {line}: {err}") from None
                tok.parts.extend(_dquote_parts(src, i + 1, end - 1))
                line += src.count("\n", i, end)
                i = end
            elif c == "$":
                try:
                    part, end = _dollar(src, i, False)
                except ShellSyntaxError as err:
                    raise ShellSyntaxError(f"line {line}: {err}") from None
                line += src.count("\n", i, end)
                tok.parts.append(part)
                i = end
            elif c == "`":
                end = src.find("`", i + 1)
                if end < 0:
                    raise ShellSyntaxError(f"line {line}: no closing '`'")
                tok.parts.append(Part("cmd", src[i + 1:end], False))
                line += src.count("\n", i, end)
                i = end + 1
            else:
                tok.parts.append(Part("lit", c, False))
                i += 1
            # NAME=( and NAME+=( open an array assignment
            if i < n and src[i] == "(":
                text = tok.literal()
                if text is not None and ASSIGN.fullmatch(text):
                    toks.append(Tok("arr", start_line, text=text))
                    i += 1
                    tok = None
                    break
        if tok is not None:
            tok.line, tok.source = start_line, src[start:i]
            tok.redirects = i < n and src[i] in "<>" and tok.source.isdigit()
            toks.append(tok)
    toks.append(Tok("nl", line))
    return toks


class ArithUnknown(Exception):
    """Arithmetic the reader cannot evaluate (the message says why)."""

    pass


def safe_eval(py: str, expr: str, line: int) -> int:
    """Integer arithmetic of digits, operators and parentheses (built above), no names."""
    try:
        tree = ast.parse(py, mode="eval")
    except SyntaxError:
        raise ArithUnknown(f"$(({expr.strip()})) (line {line}) is not arithmetic the reader "
                            "follows") from None

    def value(node) -> int:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp):
            operand = value(node.operand)
            if isinstance(node.op, ast.USub):
                return -operand
            if isinstance(node.op, ast.UAdd):
                return operand
            if isinstance(node.op, ast.Not):
                return int(not operand)
        if isinstance(node, ast.BinOp):
            a, b = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                if abs(a) > 2**62 or abs(b) > 2**62:
                    raise ArithUnknown(f"$(({expr.strip()})) (line {line}) overflows")
                return a * b
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)):
                if b == 0:
                    raise ArithUnknown(f"$(({expr.strip()})) (line {line}) divides by zero")
                # bash truncates toward zero
                quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
                return quotient if isinstance(node.op, ast.FloorDiv) else a - b * quotient
        if isinstance(node, ast.BoolOp):
            items = [value(v) for v in node.values]
            return int(all(items)) if isinstance(node.op, ast.And) else int(any(items))
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            a, b = value(node.left), value(node.comparators[0])
            op = node.ops[0]
            return int({ast.Lt: a < b, ast.Gt: a > b, ast.LtE: a <= b, ast.GtE: a >= b,
                        ast.Eq: a == b, ast.NotEq: a != b}[type(op)])
        raise ArithUnknown(f"$(({expr.strip()})) (line {line}) is not arithmetic the reader "
                            "follows")

    try:
        return value(tree)
    except (RecursionError, KeyError):
        raise ArithUnknown(f"$(({expr.strip()})) (line {line}) is not arithmetic the reader "
                            "follows") from None
