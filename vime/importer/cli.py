"""The `vime import` verb: read, map, write the spec, print the report.

Exit codes: 0 the spec is complete, 1 it is written but some flag did not map (the report
says which, and the file's header repeats it), 2 usage (vime/cli.py's UsageError).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

from vime.importer import ImportResult, import_argv, import_script
from vime.importer.shell import position
from vime.importer.toml_out import render

MAX_SCRIPT_BYTES = 4 * 1024 * 1024


class ImportUsageError(Exception):
    """A command line vime import cannot act on: exit 2."""


def _environ(pairs: list[str]) -> dict[str, str]:
    environ: dict[str, str] = {}
    for index, pair in enumerate(pairs):
        name, eq, value = pair.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ImportUsageError(f"--env[{index}] {pair!r}: write NAME=VALUE, e.g. "
                                   "--env ACTOR_NUM_NODES=2")
        environ[name] = value
    return environ


def _read(path: str) -> str:
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_SCRIPT_BYTES + 1)
        else:
            with open(path, "rb") as handle:
                data = handle.read(MAX_SCRIPT_BYTES + 1)
    except OSError as err:
        raise ImportUsageError(f"cannot read {path}: {err.strerror}") from None
    if len(data) > MAX_SCRIPT_BYTES:
        raise ImportUsageError(f"{path} is larger than {MAX_SCRIPT_BYTES // 1024 // 1024} MiB; "
                               "a launch script is a few KiB")
    return data.decode("utf-8", errors="replace")


def flag_list(text: str) -> list[str]:
    """The words of a flag list file; words up to `train.py` (a command line) are dropped."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError as err:
        raise ImportUsageError(f"--argv: the flag list is not shell words: {err}") from None
    for index, word in enumerate(words):
        if re.search(r"(^|/)train(_async)?\.py$", word):
            return words[index + 1:]
    return words


def report_text(result: ImportResult) -> str:
    """The report, one finding a line (errors, warnings, then notes; commands not run
    in one line)."""
    order = {"error": 0, "warning": 1, "note": 2}
    lines = []
    not_run = [f for f in result.findings if f.code == "V961"]
    for finding in sorted((f for f in result.findings if f.code != "V961"),
                          key=lambda f: order[f.severity]):
        where = f"{position(finding.file, finding.line)}: " if finding.file else ""
        lines.append(f"{where}{finding.severity}[{finding.code}]: {finding.message}")
        if finding.help:
            lines.append(f"  help: {finding.help}")
    if not_run:
        shown = ", ".join(position(f.file, f.line, basename=True) for f in not_run[:12])
        more = f" and {len(not_run) - 12} more" if len(not_run) > 12 else ""
        lines.append(f"note[V961]: {len(not_run)} commands not run (vime submit starts and "
                     f"stops Ray itself): {shown}{more}")
    counts = {s: sum(1 for f in result.findings if f.severity == s) for s in order}
    verdict = "complete" if result.complete else "incomplete: the errors above did not map"
    lines.append(f"vime import: {verdict} ({counts['error']} errors, {counts['warning']} "
                 f"warnings, {counts['note']} notes; `vime explain CODE` says more)")
    return "\n".join(lines) + "\n"


def run(script: str, output: str | None, force: bool, env: list[str], argv: bool,
        repo_root: str | None = None) -> int:
    """Import SCRIPT, write the spec (-o, or stdout) and print the report on stderr.

    Raises:
        ImportUsageError: unreadable input, a bad --env, a --repo-root that is no folder, or
            an -o file that exists.
    """
    environ = _environ(env)
    if repo_root is not None and not os.path.isdir(repo_root):
        raise ImportUsageError(f"--repo-root {repo_root}: no such folder; name the checkout "
                               "the script's `source` lines read from")
    if output and not force and os.path.lexists(output):
        raise ImportUsageError(f"{output} exists; vime import does not overwrite it without "
                               "--force")
    text = _read(script)
    if argv:
        name = "imported" if script == "-" else _name(script)
        result = import_argv(flag_list(text), name)
    else:
        if script == "-":
            raise ImportUsageError("a script is read from a file (its sourced files are found "
                                   "beside it); use --argv for a flag list on stdin")
        result = import_script(Path(script), text, environ,
                               Path(repo_root) if repo_root is not None else None)
    spec_dir = os.path.dirname(os.path.abspath(output)) if output else os.getcwd()
    spec = render(result, spec_dir)
    if output:
        try:
            with open(output, "w" if force else "x", encoding="utf-8") as handle:
                handle.write(spec)
        except FileExistsError:
            raise ImportUsageError(f"{output} exists; vime import does not overwrite it "
                                   "without --force") from None
        except OSError as err:
            raise ImportUsageError(f"cannot write {output}: {err.strerror}") from None
    else:
        sys.stdout.write(spec)
    sys.stderr.write(report_text(result))
    if output:
        sys.stderr.write(f"wrote {output}; next: vime plan {shlex.quote(output)}\n")
    return 0 if result.complete else 1


def _name(path: str) -> str:
    from vime.importer import _experiment_name

    return _experiment_name(os.path.basename(path))


__all__ = ["run", "report_text", "flag_list", "ImportUsageError"]
