"""Word expansion and tests of the bash subset launch scripts use, for shell.py's Reader: what
`$VAR`, `${...}`, `$(...)`, `$((...))` and `[[ ]]` / `[ ]` / `(( ))` are on the values the
reader knows, or Unknown (with why) when only a run could tell. Nothing here runs a command."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from vime.importer.lexer import NAME, ArithUnknown, ShellSyntaxError, Tok, lex, safe_eval

# the script's own folder: SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" ... && pwd)"
SCRIPT_DIR_IDIOM = re.compile(r"^\s*cd\s+(--\s+)?\"?\$\(\s*dirname\s+(--\s+)?\"?\$\{?BASH_SOURCE(\[0\])?\}?\"?\s*\)\"?"
                              r"[^;|]*&&\s*pwd(\s+-P)?\s*$")
# $(cd -- DIR &>/dev/null && pwd) and $(dirname -- PATH): known from the text when DIR is an
# absolute path of known text (`cd` of a relative one depends on the working folder)
CD_PWD = re.compile(r"\s*cd\s+(?:--\s+)?(?P<folder>.+?)\s*(?:(?:&|[12])?>>?\s*/dev/null\s*)*"
                    r"&&\s*pwd(?:\s+-[LP])?\s*", re.S)
# $(IFS=', '; echo "${arr[*]}"): echo of words, an IFS assignment before it (no option)
ECHO = re.compile(r"\s*(?:IFS=(?P<ifs>'[^']*'|\"[^\"$`\\]*\"|[^\s;'\"]*)\s*;\s*)?echo"
                  r"(?:\s+(?P<words>(?!-)[^;&|<>`]*?))?\s*")
DIRNAME = re.compile(r"\s*dirname\s+(?:--\s+)?(?P<path>.+?)\s*", re.S)
MAX_SEQ = 100_000
MAX_VALUE_CHARS = 1_000_000


@dataclass(frozen=True)
class Unknown:
    """A value the reader cannot know without running something; `why` says what."""

    why: str


class Located(str):
    """An array element's text, remembering the file and line it was written on."""

    file: str
    line: int

    def __new__(cls, text: str, file: str, line: int):
        made = super().__new__(cls, text)
        made.file, made.line = file, line
        return made


class Fields(list):
    """Words an expansion made already (a default or alternative word): not split again."""


def _join(pieces: list[str]) -> str:
    return pieces[0] if len(pieces) == 1 else "".join(pieces)


class Env:
    def __init__(self, environ: dict[str, str]):
        self.scalars: dict[str, str | Unknown] = dict(environ)
        self.arrays: dict[str, list[str | Unknown]] = {}


class Expander:
    """The values of a script's words and tests, from the variables read so far (env)."""

    def __init__(self, environ: dict[str, str]):
        self.env = Env(environ)
        self.file = ""  # the file being read
        self.script_dir = Path(".")  # its folder
        self.in_test = False  # inside [[ ]]: an unset variable is ""

    def lookup(self, name: str, line: int) -> str | Unknown | None:
        if name in self.env.arrays:
            items = self.env.arrays[name]
            return items[0] if items else ""
        return self.env.scalars.get(name)

    def expand_var(self, expr: str, line: int, quoted: bool) -> list[str | Unknown] | str | Unknown:
        """A ${...} expression: a string, Unknown, or a list (an array's elements; Fields:
        words already split, as a default or alternative word expands to)."""
        array_op = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[[@*]\](:?[-+])(.*)", expr, re.S)
        if array_op:
            return self.array_alternative(*array_op.groups(), line)
        array = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[([@*])\]", expr)
        if array:
            name = array.group(1)
            if name in self.env.arrays:
                items = list(self.env.arrays[name])
                if array.group(2) == "*" and quoted:  # one word, joined by IFS's first character
                    ifs = self.env.scalars.get("IFS", " ")
                    unknown = next((v for v in [ifs, *items] if isinstance(v, Unknown)), None)
                    return unknown if unknown is not None else ifs[:1].join(items)
                return items
            value = self.env.scalars.get(name)
            if value is None:
                return []
            return [value]
        if expr == "BASH_SOURCE[0]" or expr == "BASH_SOURCE" or expr == "0":
            return self.file
        length = re.fullmatch(r"#([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?", expr)
        if length:
            name = length.group(1)
            if name in self.env.arrays:
                return str(len(self.env.arrays[name]))
            value = self.env.scalars.get(name)
            if isinstance(value, Unknown):
                return value
            if length.group(2):  # a scalar is an array of one element
                return "0" if value is None else "1"
            return str(len(value or ""))
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-=+?])(.*))?", expr, re.S)
        if not match:
            return Unknown(f"${{{expr}}} (line {line}) is an expansion the reader does not follow")
        name, op, arg = match.group(1), match.group(2), match.group(3)
        value = self.lookup(name, line)
        if op is None:
            if value is None and self.in_test:
                return ""  # a test of an unset variable sees "", as bash's does
            if value is None:
                return Unknown(f"${name} is not set (line {line}); pass --env {name}=VALUE")
            return value
        if isinstance(value, Unknown):
            return value
        empty = value is None or (op.startswith(":") and value == "")
        if op.endswith("+"):
            return "" if empty else self.expand_text(arg, line)
        if op.endswith("?"):
            if empty:
                return Unknown(f"${{{name}}} must be set (line {line}); pass --env {name}=VALUE")
            return value
        if empty:
            default = self.expand_text(arg, line)
            if op.endswith("=") and not isinstance(default, Unknown):
                self.env.scalars[name] = default
            return default
        return value

    def array_alternative(self, name: str, op: str, word: str, line: int) -> list | Unknown:
        """${A[@]+WORD} and ${A[@]-WORD} (with or without ':'): WORD's fields when A has
        elements (+) or has none (-), else A's elements. bash counts an array without elements
        as unset here, which is what `${A[@]+"${A[@]}"}` relies on under `set -u`."""
        items = self.env.arrays.get(name)
        if items is None:
            scalar = self.env.scalars.get(name)
            items = [] if scalar is None else [scalar]
        unknown = next((v for v in items if isinstance(v, Unknown)), None)
        if unknown is not None:
            return unknown
        has_elements = bool(items) and not (op.startswith(":") and "".join(items) == "")
        if op.endswith("+"):
            return self.expand_fields(word, line) if has_elements else Fields()
        return list(items) if has_elements else self.expand_fields(word, line)

    def expand_fields(self, text: str, line: int) -> Fields:
        """A fragment of shell text as the words bash makes of it (an array's elements stay
        one word each)."""
        try:
            toks = [t for t in lex(text) if t.kind == "word"]
        except ShellSyntaxError as err:
            return Fields([Unknown(f"line {line}: {err}")])
        return Fields(f for tok in toks for f in self.expand_word(tok, line))

    def expand_text(self, text: str, line: int) -> str | Unknown:
        """A fragment of shell text (a default value) as one string."""
        try:
            toks = [t for t in lex(text) if t.kind == "word"]
        except ShellSyntaxError as err:
            return Unknown(f"line {line}: {err}")
        out = []
        for tok in toks:
            fields = self.expand_word(tok, line, split=False)
            for f in fields:
                if isinstance(f, Unknown):
                    return f
                out.append(f)
        return " ".join(out)

    def command_subst(self, command: str, line: int) -> str | Unknown:
        seq = re.fullmatch(r"\s*seq\s+(-?\d+)(?:\s+(-?\d+))?(?:\s+(-?\d+))?\s*", command)
        if seq:
            nums = [int(g) for g in seq.groups() if g is not None]
            first, step, last = (1, 1, nums[0]) if len(nums) == 1 else \
                (nums[0], 1, nums[1]) if len(nums) == 2 else (nums[0], nums[1], nums[2])
            if step == 0 or (last - first) // step > MAX_SEQ:
                return Unknown(f"$({command.strip()}) (line {line}) is too long a sequence")
            return " ".join(str(v) for v in range(first, last + (1 if step > 0 else -1), step))
        seq = re.fullmatch(r"\s*seq\s+(.*)", command, re.S)
        if seq:  # seq of variables: expand them first
            value = self.expand_text(seq.group(1), line)
            if isinstance(value, Unknown):
                return value
            if re.fullmatch(r"[-\d\s]+", value):
                return self.command_subst("seq " + value, line)
        echo = ECHO.fullmatch(command)
        if echo:
            return self.echo(echo, line)
        if SCRIPT_DIR_IDIOM.match(command):
            return str(self.script_dir)
        path_of = CD_PWD.fullmatch(command) or DIRNAME.fullmatch(command)
        if path_of:
            return self.path_command(path_of, command, line)
        shown = " ".join(command.split())
        shown = shown if len(shown) <= 48 else shown[:47] + "…"
        return Unknown(f"$({shown}) (line {line}) runs a command, which the reader does not do")

    def echo(self, match: re.Match, line: int) -> str | Unknown:
        """$([IFS=X;] echo WORDS): the words, joined by a blank (an IFS set before echo holds
        in the subshell alone)."""
        saved = self.env.scalars.get("IFS")
        if match.group("ifs") is not None:
            ifs = self.expand_text(match.group("ifs"), line) if match.group("ifs") else ""
            self.env.scalars["IFS"] = ifs
        try:
            return self.expand_text(match.group("words") or "", line)
        finally:
            self.env.scalars.pop("IFS", None)
            if saved is not None:
                self.env.scalars["IFS"] = saved

    def path_command(self, match: re.Match, command: str, line: int) -> str | Unknown:
        """`cd -- DIR && pwd` and `dirname -- PATH` of one known word: the folder, computed
        from the text alone (no file system is asked)."""
        shown = " ".join(command.split())[:48]
        text = match.groupdict().get("folder") or match.group("path")
        try:
            words = [t for t in lex(text) if t.kind == "word"]
        except ShellSyntaxError as err:
            return Unknown(f"$({shown}) (line {line}): {err}")
        if len(words) != 1:
            return Unknown(f"$({shown}) (line {line}) runs a command, which the reader does not do")
        value = self.scalar(words[0], line)
        if isinstance(value, Unknown):
            return value
        if "folder" in match.groupdict():
            if not value.startswith("/"):
                return Unknown(f"$({shown}) (line {line}): cd to {value!r} is relative to a "
                               "working folder the reader does not know")
            return os.path.normpath(value)
        trimmed = value.rstrip("/")
        if not trimmed:
            return "/" if value else "."
        return os.path.dirname(trimmed) or "."

    def arith(self, expr: str, line: int) -> str | Unknown:
        try:
            return str(self._arith_value(expr, line))
        except ArithUnknown as err:
            return Unknown(str(err))

    def _arith_value(self, expr: str, line: int) -> int:
        tokens = re.findall(r"\d+|[A-Za-z_][A-Za-z0-9_]*|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|\*\*|"
                            r"==|!=|<=|>=|&&|\|\||[-+*/%()<>!]|\S", expr)
        py = []
        for tok in tokens:
            name = tok.strip("${}")
            if NAME.fullmatch(name):
                value = self.lookup(name, line)
                if value is None:
                    value = "0"
                if isinstance(value, Unknown) or not re.fullmatch(r"\s*-?\d+\s*", value):
                    raise ArithUnknown(f"$(({expr.strip()})) (line {line}): {name} is not a "
                                        "known integer")
                py.append(f"({int(value)})")
            elif tok.isdigit():
                py.append(str(int(tok)))
            elif tok in ("+", "-", "*", "%", "(", ")", "<", ">", "<=", ">=", "==", "!="):
                py.append(tok)
            elif tok == "/":
                py.append("//")
            elif tok == "&&":
                py.append(" and ")
            elif tok == "||":
                py.append(" or ")
            elif tok == "!":
                py.append(" not ")
            else:
                raise ArithUnknown(f"$(({expr.strip()})) (line {line}): {tok!r} is not arithmetic "
                                    "the reader follows")
        return safe_eval("".join(py), expr, line)

    def expand_word(self, tok: Tok, line: int, split: bool = True) -> list[str | Unknown]:
        """The fields a word expands to (unquoted expansions split on blanks)."""
        fields: list[str | Unknown] = []
        current: list[str] = []
        started = False  # the current field exists (quotes make an empty field)
        # "${A[@]}" of an array without elements is no field, so the empty quoted text that
        # closes its quotes makes none either
        no_elements = False
        unknown: Unknown | None = None
        for part in tok.parts:
            if part.kind == "lit":
                current.append(part.text)
                started = started or (part.quoted and not no_elements) or part.text != ""
                no_elements = False
                continue
            no_elements = False
            if part.kind == "var":
                value = self.expand_var(part.text, line, part.quoted)
            elif part.kind == "cmd":
                value = self.command_subst(part.text, line)
            else:
                value = self.arith(part.text, line)
            if isinstance(value, Unknown):
                unknown = unknown or value
                continue
            if isinstance(value, list):  # an array's elements, one field each
                if not value and part.quoted and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\[@\]",
                                                              part.text):
                    no_elements = True
                items: list[str | Unknown] = []
                for v in value:
                    if isinstance(v, Unknown) or part.quoted or isinstance(value, Fields) or \
                            (v and v.split() == [v]):
                        items.append(v)
                    else:
                        items.extend(v.split())
                for k, item in enumerate(items):
                    if k and (started or current):
                        fields.append(_join(current))
                        current, started = [], False
                    if isinstance(item, Unknown):
                        if current and "".join(current) or k == len(items) - 1 and \
                                part is not tok.parts[-1]:
                            unknown = unknown or item  # glued to other text: the word is unknown
                            continue
                        fields.append(item)
                        continue
                    current.append(item)
                    started = True
                continue
            if part.quoted or not split:
                current.append(value)
                started = True
                continue
            pieces = value.split()
            if not pieces:
                continue
            if value[:1].isspace() and started:
                fields.append("".join(current))
                current, started = [], False
            for k, piece in enumerate(pieces):
                if k:
                    fields.append("".join(current))
                    current = []
                current.append(piece)
                started = True
            if value[-1:].isspace():
                fields.append("".join(current))
                current, started = [], False
        if unknown is not None:
            return [unknown]
        if started or current and "".join(current):
            fields.append(_join(current))
        return [f[:MAX_VALUE_CHARS] if isinstance(f, str) and len(f) > MAX_VALUE_CHARS else f
                for f in fields]

    def scalar(self, tok: Tok, line: int) -> str | Unknown:
        fields = self.expand_word(tok, line, split=False)
        for f in fields:
            if isinstance(f, Unknown):
                return f
        return " ".join(fields)  # type: ignore[arg-type]

    # -- statements

    def condition(self, toks: list[Tok]) -> bool | Unknown:
        """A list of [[ ]] / [ ] / (( )) tests joined by && || and !."""
        groups: list[list[Tok]] = [[]]
        joins: list[str] = []
        for tok in toks:
            if tok.kind == "op" and tok.text in ("&&", "||") and not self._inside_double(groups[-1]):
                groups.append([])
                joins.append(tok.text)
            else:
                groups[-1].append(tok)
        result: bool | Unknown = self.one_test(groups[0])
        for join, group in zip(joins, groups[1:], strict=True):
            if not isinstance(result, Unknown) and \
                    ((join == "&&" and not result) or (join == "||" and result)):
                continue
            value = self.one_test(group)
            if isinstance(result, Unknown):
                if not isinstance(value, Unknown) and ((join == "||" and value) or
                                                       (join == "&&" and not value)):
                    result = value
                continue
            result = value
        return result

    @staticmethod
    def _inside_double(group: list[Tok]) -> bool:
        opened = sum(1 for t in group if t.literal() == "[[")
        closed = sum(1 for t in group if t.literal() == "]]")
        return opened > closed

    def one_test(self, toks: list[Tok]) -> bool | Unknown:
        negate = False
        while toks and toks[0].literal() == "!":
            negate, toks = not negate, toks[1:]
        if not toks:
            return Unknown("an empty test")
        head = toks[0]
        if head.literal() in ("[[", "[") and toks[-1].literal() in ("]]", "]"):
            result = self.bracket(toks[1:-1], head.line)
        elif head.kind == "op" and head.text == "(" and len(toks) >= 4 and toks[1].kind == "op" \
                and toks[1].text == "(":
            inner = " ".join(t.raw if t.kind == "word" else t.text for t in toks[2:-2])
            value = self.arith(inner, head.line)
            result = value if isinstance(value, Unknown) else value not in ("0", "False")
        elif head.literal() in ("true", ":"):
            result = True
        elif head.literal() == "false":
            result = False
        else:
            shown = " ".join(t.raw if t.kind == "word" else t.text for t in toks)
            return Unknown(f"`{shown[:60]}` (line {head.line}) runs a command")
        if isinstance(result, Unknown):
            return result
        return result != negate

    def bracket(self, toks: list[Tok], line: int) -> bool | Unknown:
        # nested && / || inside [[ ]]
        for join in ("||", "&&"):
            for k, tok in enumerate(toks):
                if tok.kind == "op" and tok.text == join:
                    left, right = self.bracket(toks[:k], line), self.bracket(toks[k + 1:], line)
                    if join == "||":
                        if left is True or right is True:
                            return True
                    elif left is False or right is False:
                        return False
                    if isinstance(left, Unknown):
                        return left
                    if isinstance(right, Unknown):
                        return right
                    return (left or right) if join == "||" else (left and right)
        words = [t for t in toks if t.kind == "word"]
        if words and words[0].literal() == "!":
            inner = self.bracket(toks[1:], line)
            return inner if isinstance(inner, Unknown) else not inner
        self.in_test = True
        try:
            values = [self.scalar(t, line) for t in words]
        finally:
            self.in_test = False
        if any(isinstance(v, Unknown) for v in values):
            return next(v for v in values if isinstance(v, Unknown))
        raw = [t.literal() for t in words]
        if len(values) == 1:
            return values[0] != ""
        if len(values) == 2 and raw[0] in ("-z", "-n"):
            return (values[1] == "") == (raw[0] == "-z")
        if len(values) == 2 and raw[0] in ("-f", "-d", "-e", "-x", "-r", "-s"):
            return Unknown(f"`{raw[0]} {values[1]}` (line {line}) asks the file system")
        if len(values) == 3:
            left, op, right = values[0], raw[1], values[2]
            if op in ("==", "="):
                return left == right
            if op == "!=":
                return left != right
            if op in ("-eq", "-ne", "-gt", "-ge", "-lt", "-le"):
                try:
                    a, b = int(left), int(right)
                except ValueError:
                    return Unknown(f"`{left} {op} {right}` (line {line}) compares non-integers")
                return {"-eq": a == b, "-ne": a != b, "-gt": a > b, "-ge": a >= b,
                        "-lt": a < b, "-le": a <= b}[op]
        shown = " ".join(str(v) for v in values)
        return Unknown(f"the test `{shown[:60]}` (line {line}) is not one the reader follows")
