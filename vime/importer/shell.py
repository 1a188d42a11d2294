"""A reader of the bash subset that launch scripts use; it never executes anything.

It follows assignments (scalars, arrays, `+=`), `export`, `source`/`.` of a file next to the
script (with `VAR=value` before it), `${VAR:-default}` and friends, `${A[@]+"${A[@]}"}`, `$VAR`,
`if`/`elif`/`else` on `[[ ]]`, `[ ]` and `(( ))` tests of known values, `$(seq a b c)`,
`$(cd -- DIR && pwd)`, `$(dirname -- PATH)`, `$([IFS=X;] echo ...)`, `$((...))` on known
values, `for ((i=0; i<N; i++))` loops on known integers, `printf -v VAR FORMAT ...`, `read` of
a here-string (`IFS=, read -r -a A <<< "$LIST"`), line continuations and comments inside
arrays (expand.py has word expansion and tests, builtins.py the builtins' pure parts,
sourcing.py where a sourced file is). Every
other construct is a Note with its line, and a value that
depends on one is Unknown (never a guess). The words after `train.py` on the last command that
runs it are the flags the importer maps (`Reading.argv`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from vime.importer.builtins import (
    arith_for,
    mapfile_target,
    parse_read,
    printf_format,
    split_on_ifs,
)
from vime.importer.expand import Expander, Located, Unknown
from vime.importer.lexer import (
    ASSIGN,
    NAME,
    ArithUnknown,
    Part,
    ShellSyntaxError,
    Tok,
    lex,
)
from vime.importer.sourcing import find_sourced

TRAIN_ENTRY = re.compile(r"(^|/)train(_async)?\.py$")
MAX_SOURCE_DEPTH = 4
MAX_SOURCED_READS = 100  # files read by `source` in all (a launch script sources one or two)
MAX_ARRAY_ITEMS = 100_000  # an array's elements (train.py's argv has a few hundred)
MAX_STATEMENTS = 200_000  # statements read in all, sourced files included
MAX_LOOP_PASSES = 4096  # passes of a for loop followed (a models file's loop runs once a layer)


class _StopFile(Exception):
    """The reader stops reading the current file, as bash stops it: the message says why."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class Word:
    """One argv element: its text (or Unknown), the file and line it was written on; in a
    flag list (file ARGV) `line` is the word's position in the list."""

    value: str | Unknown
    file: str
    line: int


ARGV = "--argv"  # the file of a flag list's words, which are counted rather than lined


def counted_as(file: str) -> str:
    """What a position in `file` counts: "word" in a flag list, else "line"."""
    return "word" if file == ARGV else "line"


def position(file: str, line: int, basename: bool = False) -> str:
    """Where a word was written: "run.sh:12", or "--argv word 7" in a flag list."""
    if file == ARGV:
        return f"{ARGV} word {line}" if line else ARGV
    shown = os.path.basename(file) if basename else file
    return f"{shown}:{line}" if line else shown


@dataclass(frozen=True)
class Note:
    """Something the reader did not follow: code V960 (a construct) or V961 (a command)."""

    code: str
    file: str
    line: int
    message: str
    severity: str = ""  # "": the code's own (vime/importer/table.py's CODES)


class HeadGpus(NamedTuple):
    count: int
    file: str
    line: int


@dataclass
class Reading:
    argv: list[Word] | None = None  # the flags after train.py; None: no train.py command
    entry_line: tuple[str, int] | None = None
    entry: str = ""  # train.py or train_async.py
    notes: list[Note] = field(default_factory=list)
    sourced: list[str] = field(default_factory=list)
    head_gpus: HeadGpus | None = None  # `ray start --head --num-gpus N`, the last one read


class Reader(Expander):
    """Reads one script (and the files it sources) into a Reading."""

    def __init__(self, environ: dict[str, str], reading: Reading | None = None,
                 repo_root: Path | None = None):
        super().__init__(environ)
        self.repo_root = repo_root  # the user's checkout, where `source` paths are found
        self.reading = reading or Reading()
        self.depth = 0
        self.reading_now: list[Path] = []  # the files being read, the outermost first
        self.sourced_reads = 0
        self.statements = 0
        self.said: set[str] = set()  # notes said once for the whole script
        self.in_test = False
        self.train_ended: int | None = None  # the last line of a train.py command just read
        self.file = ""
        self.script_dir = Path(".")

    # -- notes
    def note(self, code: str, line: int, message: str) -> None:
        self.reading.notes.append(Note(code, self.file, line, message))

    def note_once(self, key: str, code: str, line: int, message: str) -> None:
        """A note said once whatever the number of lines (or readings of a file) it is true of."""
        if key not in self.said:
            self.said.add(key)
            self.note(code, line, message)

    def read_file(self, path: Path, text: str) -> None:
        saved = (self.file, self.script_dir)
        self.file, self.script_dir = str(path), path.parent
        self.reading_now.append(_identity(path))
        try:
            try:
                toks = lex(text)
            except ShellSyntaxError as err:
                line = int(m.group(1)) if (m := re.match(r"line (\d+)", str(err))) else 1
                self.note("V960", line, f"the reader stops here: {err}")
                return
            self.block(toks, 0, len(toks), live=True)
        except _StopFile as stop:
            self.note("V960", stop.line, f"the reader stops here: {stop}")
        finally:
            self.reading_now.pop()
            self.file, self.script_dir = saved

    def block(self, toks: list[Tok], i: int, end: int, live: bool) -> None:
        while i < end:
            self.statements += 1
            if self.statements > MAX_STATEMENTS:
                raise _StopFile(toks[i].line, f"the script runs more than {MAX_STATEMENTS} "
                                "statements (sourced files included)")
            after = self.statement(toks, i, end, live)
            i = max(after, i + 1)  # a statement takes one token at least

    def statement(self, toks: list[Tok], i: int, end: int, live: bool) -> int:
        tok = toks[i]
        if tok.kind == "nl" or (tok.kind == "op" and tok.text in (";", "&")):
            return i + 1
        if live and not (tok.literal() or "").startswith("--") and \
                not (tok.kind == "word" and tok.literal() is None):
            # only lines of --flags (or of expansions, `${ARGS[@]}`) right after it are its
            self.train_ended = None
        if tok.kind == "op" and tok.text == ";;":  # skip_compound passes over case's own
            raise _StopFile(tok.line, "';;' outside a case statement is a syntax error, where "
                            "bash stops the script")
        if tok.kind == "arr":
            return self.array_assignment(toks, i, end, live)
        first = tok.literal()
        if first in ("if",):
            return self.if_statement(toks, i, end, live)
        if first == "for" and i + 2 < end and all(t.kind == "op" and t.text == "("
                                                  for t in toks[i + 1:i + 3]):
            return self.arith_loop(toks, i, end, live)
        if first in ("for", "while", "until", "case", "select", "function") or \
                (tok.kind == "word" and i + 2 < end and toks[i + 1].kind == "op" and
                 toks[i + 1].text == "(" and toks[i + 2].kind == "op" and toks[i + 2].text == ")"):
            return self.skip_compound(toks, i, end, live)
        if tok.kind == "op" and tok.text == "(":
            stop = self._matching_paren(toks, i, end)
            if live:
                self.note("V960", tok.line, "a subshell ( ... ) is not followed")
            return stop
        if first == "{":
            stop = self._find_keyword(toks, i + 1, end, {"{"}, {"}"})
            if live:
                self.note("V960", tok.line, "a { ... } group is not followed")
            return stop + 1
        # a simple command, possibly joined by && || |
        stop = i
        while stop < end and not (toks[stop].kind == "nl" or
                                  (toks[stop].kind == "op" and toks[stop].text in (";", "&", ";;"))):
            if toks[stop].kind == "arr":  # an array assignment after && or ;
                break
            stop += 1
        if live:
            self.simple(toks[i:stop])
        return stop

    def simple(self, toks: list[Tok]) -> None:
        # split on && and || and |: each piece is a command; only the first runs for certain
        pieces: list[list[Tok]] = [[]]
        joins: list[str] = []
        for tok in toks:
            if tok.kind == "op" and tok.text in ("&&", "||", "|"):
                pieces.append([])
                joins.append(tok.text)
            else:
                pieces[-1].append(tok)
        if len(pieces) > 1:
            # `cmd || true`, `[[ ]] && X=1`: a test decides; anything else is a command
            head = pieces[0]
            if head and head[0].literal() in ("[[", "[") and joins[0] in ("&&", "||"):
                verdict = self.condition(head)
                if isinstance(verdict, Unknown):
                    self.note("V960", head[0].line, f"a test the reader cannot decide: {verdict.why}")
                    for piece in pieces[1:]:
                        self.forget_assigned(piece)
                    return
                if verdict == (joins[0] == "&&"):
                    self.simple([t for piece in pieces[1:2] for t in piece])
                return
            if all(piece and piece[0].literal() in ("true", ":") for piece in pieces[1:]):
                self.simple(pieces[0])
                return
            for piece in pieces:
                if piece:
                    self.simple(piece)
            return
        if not toks:
            return
        line = toks[0].line
        words = toks
        # leading assignments
        k = 0
        assigns: list[tuple[str, str, Tok]] = []
        while k < len(words) and words[k].kind == "word":
            match = self._assign(words[k])
            if not match:
                break
            assigns.append(match)
            k += 1
        if k == len(words):
            for name, op, value_tok in assigns:
                self.assign(name, op, value_tok, line)
            return
        command = words[k].literal() or ""
        rest = words[k + 1:]
        if command in ("export", "declare", "typeset", "local", "readonly"):
            for tok in rest:
                if tok.kind != "word":
                    break
                match = self._assign(tok)
                if match:
                    self.assign(*match, line)
                elif tok.literal() and NAME.fullmatch(tok.literal() or "") is None and \
                        not (tok.literal() or "").startswith("-"):
                    self.note("V960", line, f"{command} {tok.raw} is not followed")
            return
        if self.train_ended is not None and not command and not assigns:
            first = self.expand_word(words[k], line)
            if first and isinstance(first[0], str) and first[0].startswith("--"):
                command = f"{words[k].raw} ({first[0]} ...)"
        if command.startswith(("--", "$", '"$')) and self.train_ended is not None:
            self.note("V960", line, f"line {line} begins with {command}, but the command that "
                      f"runs train.py ends on line {self.train_ended}: a '\\' missing at the end "
                      "of a line before? bash runs this line as a command of its own, and "
                      "train.py does not get its flags")
            return
        if command in ("source", "."):
            # VAR=value source FILE: the assignments hold while FILE is read, then end
            saved = {name: (self.env.scalars.get(name), self.env.arrays.get(name))
                     for name, _op, _value in assigns}
            for name, op, value_tok in assigns:
                self.assign(name, op, value_tok, line)
            try:
                self.source(rest, line)
            finally:
                for name, (scalar, array) in saved.items():
                    self.env.scalars.pop(name, None)
                    self.env.arrays.pop(name, None)
                    if scalar is not None:
                        self.env.scalars[name] = scalar
                    if array is not None:
                        self.env.arrays[name] = array
            return
        if command == "read":
            self.read_builtin(rest, assigns, line)
            return
        if command == "unset":
            for tok in rest:
                name = tok.literal() or ""
                self.env.scalars.pop(name, None)
                self.env.arrays.pop(name, None)
            return
        entry = self._train_entry(words[k:])
        if entry is not None:
            self.train_command(words[k:], entry, line)
            return
        if command == "eval":
            self.note("V960", line, "eval is not followed")
            return
        if command == "printf" and len(rest) >= 3 and rest[0].literal() == "-v":
            self.printf_to(rest[1:], line)
            return
        if command in ("printf", "mapfile", "readarray"):
            self.forget_assigned(words[k:])
        if command == "ray":
            self.ray_head(rest, line)
        shown = " ".join(t.raw for t in words[k:] if t.kind == "word")
        self.note("V961", line, f"not run: {shown[:100]}")

    def printf_to(self, rest: list[Tok], line: int) -> None:
        """`printf -v NAME FORMAT ARGS...`: NAME is what printf would print, when the format
        and every argument are known (builtins.py's printf_format)."""
        name = rest[0].literal() or ""
        if not NAME.fullmatch(name):
            self.note("V960", line, f"printf -v {rest[0].raw} is not followed")
            return
        fields = [f for tok in rest[1:] if tok.kind == "word" for f in self.expand_word(tok, line)]
        unknown = next((f for f in fields if isinstance(f, Unknown)), None)
        printed = None if unknown is not None or not fields else printf_format(fields[0],
                                                                                fields[1:])
        self.env.arrays.pop(name, None)
        if printed is None:
            why = unknown.why if unknown is not None else \
                f"printf -v {name} (line {line}) uses a format the reader does not follow"
            self.env.scalars[name] = Unknown(why)
            self.note("V960", line, f"printf -v {name} is not followed: {why}")
            return
        self.env.scalars[name] = printed

    def ray_head(self, rest: list[Tok], line: int) -> None:
        """`ray start --head ... --num-gpus N`: the GPUs of the node the script runs on."""
        words = [self.scalar(tok, line) if tok.kind == "word" else None for tok in rest]
        if words[:1] != ["start"] or "--head" not in words:
            return
        for at, word in enumerate(words):
            count = words[at + 1] if word == "--num-gpus" and at + 1 < len(words) else \
                word.removeprefix("--num-gpus=") if isinstance(word, str) and \
                word.startswith("--num-gpus=") else None
            if isinstance(count, str) and count.isdigit():
                self.reading.head_gpus = HeadGpus(int(count), self.file, line)

    def read_builtin(self, rest: list[Tok], prefix: list[tuple[str, str, Tok]], line: int) -> None:
        """read [-r] [-a NAME | NAME...] <<< WORD: the fields of WORD's first line split on
        IFS (an IFS= before read, else the script's). From any other input (a pipe, a file,
        `< <(cmd)`) or a WORD the reader cannot know, the variables are unknown, said at the
        line: never silently empty."""
        parsed = parse_read(rest)
        text: str | Unknown = Unknown("it reads a pipe, a file or an option the reader does "
                                      "not follow (only `<<< WORD` is read)")
        ifs: str | Unknown = self.env.scalars.get("IFS", " \t\n")
        if parsed.plain and parsed.here is not None:
            text = self.scalar(parsed.here, line)
            for name, _op, value_tok in prefix:
                if name == "IFS":
                    ifs = self.scalar(value_tok, line)
        unknown = text if isinstance(text, Unknown) else ifs if isinstance(ifs, Unknown) else None
        if unknown is not None:
            for name in parsed.targets:
                self.env.arrays.pop(name, None)
                self.env.scalars[name] = Unknown(f"{name} is set by `read` on line {line} from "
                                                 f"input the reader cannot know ({unknown.why});"
                                                 f" pass --env {name}=VALUE")
            self.note("V960", line, f"read sets {', '.join(parsed.targets) or 'nothing'} from "
                      f"input the reader cannot know ({unknown.why}): unknown")
            return
        first_line = text.split("\n", 1)[0]
        spans = split_on_ifs(first_line, ifs)
        fields = [first_line[start:stop] for start, stop in spans]
        if parsed.array:
            name = parsed.targets[0]
            self.env.scalars.pop(name, None)
            self.env.arrays[name] = self.bounded(name, [Located(f, self.file, line)
                                                        for f in fields], line)
            return
        whitespace = "".join(c for c in ifs if c in " \t\n")
        for index, name in enumerate(parsed.targets):
            if index == len(parsed.targets) - 1 and index < len(spans):
                value = first_line[spans[index][0]:].rstrip(whitespace)  # the rest of the line
            else:
                value = fields[index] if index < len(fields) else ""
            self.env.arrays.pop(name, None)
            self.env.scalars[name] = value

    def _entry_name(self, tok: Tok) -> str | None:
        """train.py or train_async.py when the word runs it: from its text, or, where a
        variable names the folder (`"${REPO_ROOT}/train.py"`), from the literal text after
        the last expansion."""
        if tok.kind != "word":
            return None
        text = tok.literal()
        if text is None:
            fields = self.expand_word(tok, tok.line)
            text = fields[0] if len(fields) == 1 and isinstance(fields[0], str) else None
        if text is None:
            suffix = ""
            for part in reversed(tok.parts):
                if part.kind != "lit":
                    break
                suffix = part.text + suffix
            text = suffix if "/" in suffix else None
        if text and TRAIN_ENTRY.search(text):
            return os.path.basename(text)
        return None

    def _train_entry(self, toks: list[Tok]) -> int | None:
        for k, tok in enumerate(toks):
            if self._entry_name(tok) is not None:
                return k
        return None

    def train_command(self, toks: list[Tok], entry: int, line: int) -> None:
        argv: list[Word] = []
        for tok in toks[entry + 1:]:
            if tok.kind != "word" or tok.redirects:
                break  # a redirection or a pipe ends train.py's arguments
            for field_ in self.expand_word(tok, tok.line):
                if isinstance(field_, Located):
                    argv.append(Word(str(field_), field_.file, field_.line))
                else:
                    argv.append(Word(field_, self.file, tok.line))
        if self.reading.argv is not None:
            self.note("V960", line, "a second train.py command: its flags replace the first's")
        self.reading.argv = argv
        self.reading.entry_line = (self.file, line)
        self.reading.entry = self._entry_name(toks[entry]) or "train.py"
        self.train_ended = toks[-1].line

    def _assign(self, tok: Tok) -> tuple[str, str, Tok] | None:
        if not tok.parts or tok.parts[0].kind != "lit" or tok.parts[0].quoted:
            return None
        # the name and '=' are unquoted literal characters at the word's start
        head = ""
        for index, part in enumerate(tok.parts):
            if part.kind != "lit" or part.quoted:
                break
            head += part.text
            match = ASSIGN.match(head)
            if match:
                value_tok = Tok("word", tok.line, [Part("lit", head[match.end():], False),
                                                   *tok.parts[index + 1:]])
                return match.group(1), match.group(2), value_tok
        return None

    def assign(self, name: str, op: str, value_tok: Tok, line: int) -> None:
        value = self.scalar(value_tok, line)
        if op == "+":
            if name in self.env.arrays:
                self.env.arrays[name].append(value)
                return
            old = self.env.scalars.get(name, "")
            value = old if isinstance(old, Unknown) else value if isinstance(value, Unknown) \
                else old + value
        self.env.arrays.pop(name, None)
        self.env.scalars[name] = value

    def array_assignment(self, toks: list[Tok], i: int, end: int, live: bool) -> int:
        head = toks[i]
        match = ASSIGN.fullmatch(head.text)
        stop = i + 1
        items: list[str | Unknown] = []
        while stop < end and not (toks[stop].kind == "op" and toks[stop].text == ")"):
            tok = toks[stop]
            if tok.kind == "word" and live:
                items.extend(v if isinstance(v, (Unknown, Located)) else Located(v, self.file, tok.line)
                             for v in self.expand_word(tok, tok.line))
            elif tok.kind in ("op", "arr") and live:
                self.note("V960", tok.line, f"{tok.text!r} inside an array is not followed")
            stop += 1
        if stop >= end:
            if live:
                self.note("V960", head.line, f"the array {match.group(1)}=( has no closing ')'")
            return end
        if live:
            name, append = match.group(1), match.group(2) == "+"
            if append:
                base = self.env.arrays.get(name)
                if base is None:
                    scalar = self.env.scalars.pop(name, None)
                    base = [] if scalar is None else [scalar]
                items = base + items
            else:
                self.env.scalars.pop(name, None)
            self.env.arrays[name] = self.bounded(name, items, head.line)
        return stop + 1

    def bounded(self, name: str, items: list, line: int) -> list:
        """An array's elements, or one Unknown when there are more than MAX_ARRAY_ITEMS (an
        array that doubles itself grows past any argv)."""
        if len(items) <= MAX_ARRAY_ITEMS:
            return items
        why = (f"{name} has more than {MAX_ARRAY_ITEMS} elements (line {line}); the reader "
               "stops following it")
        self.note_once(f"array {name}", "V960", line, why)
        return [Unknown(why)]

    def source(self, rest: list[Tok], line: int) -> None:
        if not rest or rest[0].kind != "word":
            self.note("V960", line, "source without a file")
            return
        target = self.scalar(rest[0], line)
        if isinstance(target, Unknown):
            self.note("V960", line, f"source of an unknown file: {target.why}")
            return
        found = find_sourced(target, self.script_dir,
                             self.reading_now[0] if self.reading_now else None, self.repo_root)
        if found is None:
            self.note("V974", line, f"cannot read the sourced file {target}")
            return
        path = found.path
        if found.checkout is not None:
            self.reading.notes.append(Note(
                "V974", self.file, line, f"source {target}: no such file here; read {path}, "
                f"the same path under the checkout {found.checkout}"
                + ("" if self.repo_root else " (--repo-root names another)"), "note"))
        if _identity(path) in self.reading_now:
            self.note_once(f"cycle {_identity(path)}", "V960", line,
                           f"source {target}: the file is being read already (it sources "
                           "itself); bash would source it again and again")
            return
        if self.depth >= MAX_SOURCE_DEPTH:
            self.note("V960", line, f"source {target}: more than {MAX_SOURCE_DEPTH} files deep")
            return
        self.sourced_reads += 1
        if self.sourced_reads > MAX_SOURCED_READS:
            self.note_once("sourced reads", "V960", line,
                           f"source {target}: the script sources more than "
                           f"{MAX_SOURCED_READS} files; the reader sources no more")
            return
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as err:
            self.note("V974", line, f"cannot read the sourced file {path}: {err.strerror}")
            return
        self.reading.sourced.append(str(path))
        self.depth += 1
        try:
            self.read_file(path, text)
        finally:
            self.depth -= 1

    # -- if / compound
    def if_statement(self, toks: list[Tok], i: int, end: int, live: bool) -> int:
        """if COND; then BODY [elif COND; then BODY]... [else BODY] fi"""
        branches: list[tuple[list[Tok], int, int]] = []  # (condition, body start, body end)
        else_body: tuple[int, int] | None = None
        k = i
        line = toks[i].line
        while True:
            keyword = toks[k].literal() if k < end else None
            if keyword in ("if", "elif"):
                then = self._find_keyword(toks, k + 1, end, set(), {"then"})
                condition = [t for t in toks[k + 1:then] if t.kind != "nl" and
                             not (t.kind == "op" and t.text == ";")]
                body_end = self._find_keyword(toks, then + 1, end, {"if"}, {"elif", "else", "fi"})
                branches.append((condition, then + 1, body_end))
                k = body_end
            elif keyword == "else":
                body_end = self._find_keyword(toks, k + 1, end, {"if"}, {"fi"})
                else_body = (k + 1, body_end)
                k = body_end
            elif keyword == "fi":
                k += 1
                break
            else:  # ran off the end
                if live:
                    self.note("V960", line, "an if without its fi is not followed")
                return end
        if not live:
            return k
        for condition, start, stop in branches:
            verdict = self.condition(condition)
            if isinstance(verdict, Unknown):
                self.note("V960", condition[0].line if condition else line,
                          f"a condition the reader cannot decide: {verdict.why}; the values its "
                          "branches set are unknown")
                for _cond, s, e in branches:
                    self.forget_assigned(toks[s:e])
                if else_body:
                    self.forget_assigned(toks[else_body[0]:else_body[1]])
                return k
            if verdict:
                self.block(toks, start, stop, live=True)
                return k
        if else_body:
            self.block(toks, else_body[0], else_body[1], live=True)
        return k

    def _find_keyword(self, toks: list[Tok], i: int, end: int, opens: set[str],
                      closes: set[str]) -> int:
        """The index of the first of `closes` at this nesting level (if/fi, do/done, {/})."""
        depth = 0
        nest_open = {"if": "fi", "case": "esac", "for": "done", "while": "done", "until": "done",
                     "{": "}"}
        at_start = True
        while i < end:
            tok = toks[i]
            text = tok.literal() if at_start else None
            if text in closes and depth == 0:
                return i
            if text in nest_open or (text in opens):
                depth += 1
            elif text in ("fi", "esac", "done", "}") and depth > 0:
                depth -= 1
            at_start = tok.kind == "nl" or (tok.kind == "op" and tok.text in (";", "&&", "||", "|", "(", ")")) \
                or (text in ("then", "do", "else", "elif", "if", "while", "until", "!", "{"))
            i += 1
        return end

    def _matching_paren(self, toks: list[Tok], i: int, end: int) -> int:
        depth = 0
        while i < end:
            if toks[i].kind == "op" and toks[i].text == "(":
                depth += 1
            elif toks[i].kind == "op" and toks[i].text == ")":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return end

    def arith_loop(self, toks: list[Tok], i: int, end: int, live: bool) -> int:
        """`for ((i=0; i<N; i++)); do BODY; done` (upstream's models files build
        --moe-layer-freq so): on known integers the body is read once a pass, up to
        MAX_LOOP_PASSES passes; any other loop is skipped, and what it sets is unknown."""
        close = i + 3
        while close + 1 < end and not all(t.kind == "op" and t.text == ")"
                                          for t in toks[close:close + 2]):
            close += 1
        do = self._find_keyword(toks, close + 2, end, set(), {"do"})
        done = self._find_keyword(toks, do + 1, end, set(), {"done"})
        header = arith_for("".join(t.raw if t.kind == "word" else t.text
                                   for t in toks[i + 3:close]))
        if not live or header is None or done >= end or any(
                t.literal() in ("break", "continue", "return", "exit") for t in toks[do:done]):
            return self.skip_compound(toks, i, end, live)
        line = toks[i].line
        try:
            value = self._arith_value(header.start, line)
            said = len(self.reading.notes)
            for _ in range(MAX_LOOP_PASSES):
                self.env.arrays.pop(header.name, None)
                self.env.scalars[header.name] = str(value)
                if not self._arith_value(header.test, line):
                    break
                self.block(toks, do + 1, done, live=True)
                step = self._arith_value(header.step, line)
                value = step if header.step_op == "=" else \
                    value + step if header.step_op == "+" else value - step
            else:
                self.note("V960", line, f"a for loop of more than {MAX_LOOP_PASSES} passes is "
                          "not followed; the values it sets are unknown")
                self.forget_assigned(toks[i:done + 1])
            # a pass says what the one before it said
            fresh = self.reading.notes[said:]
            self.reading.notes[said:] = [n for k, n in enumerate(fresh) if n not in fresh[:k]]
        except ArithUnknown as err:
            self.note("V960", line, f"a for loop the reader cannot count: {err}; the values it "
                      "sets are unknown")
            self.forget_assigned(toks[i:done + 1])
        return done + 1

    def skip_compound(self, toks: list[Tok], i: int, end: int, live: bool) -> int:
        first = toks[i].literal()
        if first in ("for", "while", "until", "select"):
            do = self._find_keyword(toks, i + 1, end, set(), {"do"})
            stop = self._find_keyword(toks, do + 1, end, set(), {"done"}) + 1
            what = f"a {first} loop"
        elif first == "case":
            stop = self._find_keyword(toks, i + 1, end, set(), {"esac"}) + 1
            what = "a case statement"
        else:  # a function definition: NAME() { ... } or function NAME { ... }
            brace = i
            while brace < end and toks[brace].literal() != "{":
                brace += 1
            stop = self._find_keyword(toks, brace + 1, end, set(), {"}"}) + 1
            what = "a function definition"
        stop = min(stop, end)
        if live:
            self.note("V960", toks[i].line, f"{what} is not followed; the values it sets are unknown")
            self.forget_assigned(toks[i:stop])
        return stop

    def forget_assigned(self, toks: list[Tok]) -> None:
        """Every variable a skipped piece of script may set becomes Unknown."""
        for k, tok in enumerate(toks):
            names: tuple[str | None, ...] = ()
            if tok.kind == "arr":
                names = (ASSIGN.fullmatch(tok.text).group(1),)
            elif tok.kind == "word":
                match = self._assign(tok)
                if match:
                    names = (match[0],)
                elif tok.literal() == "-v" and k and toks[k - 1].literal() == "printf" and \
                        k + 1 < len(toks):
                    names = (toks[k + 1].literal(),)
                elif tok.literal() in ("read", "mapfile", "readarray"):
                    stop = next((j for j in range(k + 1, len(toks)) if toks[j].kind == "nl" or
                                 (toks[j].kind == "op" and toks[j].text in
                                  (";", "&", "&&", "||", "|", ";;"))), len(toks))
                    names = parse_read(toks[k + 1:stop]).targets if tok.literal() == "read" \
                        else (mapfile_target(toks[k + 1:stop]),)
            for name in names:
                if name and NAME.fullmatch(name):
                    why = Unknown(f"{name} is set on line {tok.line} by script the reader does "
                                  f"not follow; pass --env {name}=VALUE")
                    self.env.arrays.pop(name, None)
                    self.env.scalars[name] = why

    # -- tests
def _identity(path: Path) -> Path:
    """A file's one name, whatever the path it was reached by."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path.absolute()


def read_script(path: Path, text: str, environ: dict[str, str],
                repo_root: Path | None = None) -> Reading:
    """Read a launch script (never running it) with `environ` as its environment; a file it
    sources that is not where it names it is looked for under `repo_root` (sourcing.py)."""
    reader = Reader(dict(environ), repo_root=repo_root)
    try:
        reader.read_file(path, text)
    except RecursionError:  # expansions nested hundreds deep
        reader.note("V960", 1, "expansions nested too deeply to follow; the reader stops")
    return reader.reading
