"""The docs quote the tool and link files: both are checked here so neither can drift.

A fenced block after `<!-- vime-output: plan SPEC [--set K=V]... -->` in README.md or a
docs/*.md page (README.md and docs/tutorial.md quote `vime plan`) quotes that command's output.
Its lines must appear in the real output of `python -m vime <command>` (stdout and stderr), in
order; a line of only "..." or "…" elides output lines, and the lines between two elisions must
be consecutive in the output. A first line `$ vime ...` (continued by trailing backslashes)
shows the command and must be the one in the marker. Every relative link `[text](path)` in README.md and docs/*.md must name a file or
folder of the repository (and a heading of it after `#`), and every repository path a doc
quotes as code (`specs/tiny_cpu.toml`, `runtime/rl/loop.py`) must exist.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `vime plan` and `explain` are pure and fast; nothing a doc quotes may start a run.
QUOTABLE_VERBS = {"plan", "explain"}
ELISIONS = {"...", "…"}

MARKER = re.compile(r"^<!-- vime-output: (?P<command>.+?) -->$")
LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
# A path in backticks that starts at one of the repository's top folders.
REPO_PATH = re.compile(r"`(?P<path>(?:specs|docs|tests|benchmarks|runtime|vime|schema|\.ci)/[\w./-]*)`")


@dataclasses.dataclass(frozen=True)
class Quote:
    """One marked block: where it is, the command, the shown command line and the lines."""

    doc: pathlib.Path
    line: int
    command: str
    shown: str | None
    lines: list[str]

    def __repr__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}: vime {self.command}"


def parse_quotes(doc: pathlib.Path) -> list[Quote]:
    """Return the marked blocks of DOC. Raises AssertionError on a marker without a block."""
    text = doc.read_text(encoding="utf-8").splitlines()
    quotes = []
    for number, line in enumerate(text, start=1):
        match = MARKER.match(line.strip())
        if not match:
            continue
        assert number < len(text) and text[number].startswith("```"), (
            f"{doc.relative_to(ROOT)}:{number}: a vime-output marker must be followed by a fenced block"
        )
        body = []
        for block_line in text[number + 1 :]:
            if block_line.startswith("```"):
                break
            body.append(block_line.rstrip())
        shown = None
        if body and body[0].startswith("$ vime "):
            shown_lines = [body.pop(0)]
            while shown_lines[-1].endswith("\\") and body:
                shown_lines.append(body.pop(0))
            shown = " ".join(part.rstrip("\\").strip() for part in shown_lines)[len("$ vime ") :]
        quotes.append(Quote(doc, number, match.group("command"), shown, body))
    return quotes


def chunks(lines: list[str]) -> list[list[str]]:
    """Split quoted lines at the elision lines into runs that must be consecutive."""
    runs: list[list[str]] = [[]]
    for line in lines:
        if line.strip() in ELISIONS:
            runs.append([])
        else:
            runs[-1].append(line)
    return [run for run in runs if run]


def find_in_order(runs: list[list[str]], output: list[str]) -> str | None:
    """Return None when every run appears in OUTPUT in order, else the first run's line that does not."""
    position = 0
    for run in runs:
        for start in range(position, len(output) - len(run) + 1):
            if output[start : start + len(run)] == run:
                position = start + len(run)
                break
        else:
            for line in run:
                if line not in output[position:]:
                    return line
            return run[0] + "  (the run's lines are not consecutive in the output)"
    return None


ALL_QUOTES = [quote for doc in DOCS for quote in parse_quotes(doc)]


def test_docs_quote_the_tool():
    assert len(ALL_QUOTES) >= 5, "README.md and docs/tutorial.md mark their `vime plan` excerpts"


@pytest.fixture(scope="module")
def outputs():
    cache: dict[str, list[str]] = {}

    def run(command: str) -> list[str]:
        if command not in cache:
            argv = shlex.split(command)
            assert argv[0] in QUOTABLE_VERBS, f"docs quote only {sorted(QUOTABLE_VERBS)}, not {argv[0]!r}"
            done = subprocess.run(
                [sys.executable, "-m", "vime", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120
            )
            assert done.returncode in (0, 1), f"vime {command}: exit {done.returncode}\n{done.stderr}"
            cache[command] = [line.rstrip() for line in (done.stdout + done.stderr).splitlines()]
        return cache[command]

    return run


@pytest.mark.parametrize("quote", ALL_QUOTES, ids=repr)
def test_quoted_output_is_the_tools(quote, outputs):
    if quote.shown is not None:
        assert shlex.split(quote.shown) == shlex.split(quote.command), (
            f"{quote!r}: the block shows `vime {quote.shown}`"
        )
    runs = chunks(quote.lines)
    assert runs, f"{quote!r}: the block quotes nothing"
    missing = find_in_order(runs, outputs(quote.command))
    assert missing is None, f"{quote!r}: not in the output of `vime {quote.command}`:\n{missing}"


def test_find_in_order_rejects_what_the_output_lacks():
    output = ["a", "b", "c", "d"]
    assert find_in_order([["a", "b"], ["d"]], output) is None
    assert find_in_order([["b", "a"]], output) is not None
    assert find_in_order([["a", "c"]], output) is not None
    assert find_in_order([["c"], ["a"]], output) == "a"
    assert find_in_order([["a", "b 2"]], output) == "b 2"


def relative_links(doc: pathlib.Path) -> list[tuple[int, str]]:
    """Return (line, target) of DOC's links that are not URLs, outside code blocks."""
    links, fenced = [], False
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for match in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = match.group("target")
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                links.append((number, target))
    return links


def anchors(doc: pathlib.Path) -> set[str]:
    """Return the anchors GitHub makes of DOC's headings (lower case, punctuation dropped,
    spaces as hyphens, a repeated one numbered -1, -2, ...)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    fenced = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = re.match(r"^#{1,6} (.+)$", line)
        if heading and not fenced:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = []
    for number, target in relative_links(doc):
        path, _, anchor = target.partition("#")
        linked = doc.parent / path if path else doc
        if not linked.exists():
            broken.append(f"{doc.relative_to(ROOT)}:{number}: {target}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{doc.relative_to(ROOT)}:{number}: {target} (no such heading)")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_anchors_follow_github():
    doc = ROOT / "docs" / "gpu-runs.md"
    assert "index-by-topic" in anchors(doc)
    assert "what-the-next-gpu-run-should-do-1" in anchors(doc)
    assert "the-backend-against-the-plain-loop-with-the-kernels-0991" in anchors(doc)


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_quoted_paths_exist(doc):
    missing = [
        f"{doc.relative_to(ROOT)}:{number}: {match.group('path')}"
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1)
        for match in REPO_PATH.finditer(line)
        if not (ROOT / match.group("path")).exists()
    ]
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def make_targets() -> set[str]:
    """Return the Makefile's targets: the names before a colon at the start of a line."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][a-z-]*):", text, flags=re.MULTILINE))


def vime_verbs() -> set[str]:
    """Return the CLI's verbs as its parser has them."""
    from vime.cli import build_parser

    parser = build_parser()
    (verbs,) = (action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return set(verbs.choices)


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_quoted_commands_exist(doc):
    targets, verbs = make_targets(), vime_verbs()
    unknown = []
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
        unknown += [
            f"{doc.relative_to(ROOT)}:{number}: make {name}"
            for name in re.findall(r"`make ([a-z][a-z-]*)", line)
            if name not in targets
        ]
        unknown += [
            f"{doc.relative_to(ROOT)}:{number}: vime {name}"
            for name in re.findall(r"`vime ([a-z]+)", line)
            if name not in verbs
        ]
    assert not unknown, "commands that do not exist:\n" + "\n".join(unknown)


# `docs/design.md, "The loss head"` in code: a doc and the words of one of its headings,
# possibly across a comment's line break.
SECTION_POINTER = re.compile(r'((?:docs|benchmarks)/[\w-]+\.md),\s*(?:#\s*)?"([^"\n]+)"')
CODE = [path for folder in ("vime", "runtime", "tests", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))]


def headings(doc: pathlib.Path) -> list[str]:
    """Return DOC's headings outside fenced blocks, without their leading #s."""
    found, fenced = [], False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = re.match(r"^#{1,6} (.+)$", line)
        if heading and not fenced:
            found.append(heading.group(1))
    return found


def test_section_pointers_in_code_name_a_heading():
    broken = []
    for path in CODE:
        text = path.read_text(encoding="utf-8")
        for match in SECTION_POINTER.finditer(text):
            doc, words = ROOT / match.group(1), " ".join(match.group(2).split())
            line = text.count("\n", 0, match.start()) + 1
            if not doc.is_file() or not any(words in heading for heading in headings(doc)):
                broken.append(f"{path.relative_to(ROOT)}:{line}: {match.group(1)}, \"{words}\"")
    assert broken == [], "pointers to no heading:\n" + "\n".join(broken)
