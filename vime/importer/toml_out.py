"""The imported spec as TOML text: each key with a comment naming the flag it came from, and
the report's warnings and errors at the top, so nothing the script said is lost."""

from __future__ import annotations

import os

import tomli_w

from vime import __version__
from vime.emit.resolved import schema_reference
from vime.importer import ImportResult
from vime.importer.shell import position

TABLE_ORDER = ("experiment", "cluster", "model", "model.arch", "data", "rollout", "train",
               "train.parallel", "train.optimizer", "algorithm", "inference", "inference.eplb",
               "checkpoint", "logging", "eval")


def _comment(text: str) -> str:
    """A comment line TOML accepts: no control character but tab (TOML 1.0, comments)."""
    return "".join(c if c == "\t" or (ord(c) >= 0x20 and ord(c) != 0x7F) else
                   f"\\x{ord(c):02x}" for c in " ".join(text.split("\n")))


def _value(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return tomli_w.dumps({"v": value}).rstrip("\n")[len("v = "):]


def _where(file: str, line: int) -> str:
    return f" ({position(file, line, basename=True)})" if file else ""


def render(result: ImportResult, spec_dir: str | None = None) -> str:
    """The spec text, for a file in spec_dir (its `#:schema` line is relative to it); `vime
    plan` reads it as any other spec."""
    lines = [
        f"#:schema {schema_reference(spec_dir)}",
        f"# imported by `vime import` (vime {__version__})",
        _comment(f"# from {result.source}" + ("" if not result.sourced else
                                              " and " + ", ".join(os.path.basename(s)
                                                                  for s in result.sourced))),
    ]
    serious = [f for f in result.findings if f.severity in ("error", "warning")]
    if serious:
        lines.append("# what did not become a key (vime explain CODE says more):")
        for finding in serious:
            message = " ".join(finding.message.split())
            lines.append(_comment(f"#   {finding.severity} {finding.code}"
                                  f"{_where(finding.file, finding.line)}: {message}"))
    tables: dict[str, dict[str, object]] = {}
    for dotted, value in result.values.items():
        table, _, name = dotted.rpartition(".")
        tables.setdefault(table, {})[name] = value
    order = [t for t in TABLE_ORDER if t in tables] + sorted(t for t in tables
                                                             if t not in TABLE_ORDER)
    for table in order:
        keys = {name: value for name, value in tables[table].items() if not _is_tables(value)}
        if keys:
            lines += ["", f"[{table}]"]
            lines += _keys(result, table, keys)
        for name, value in tables[table].items():
            if _is_tables(value):  # an array of tables: each with its keys' comments
                for item in value:
                    lines += ["", f"[[{table}.{name}]]"]
                    lines += _keys(result, f"{table}.{name}", item)
    return "\n".join(lines) + "\n"


def _is_tables(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _keys(result: ImportResult, table: str, keys: dict[str, object]) -> list[str]:
    lines = []
    for name, value in keys.items():
        origin = result.origins.get(f"{table}.{name}")
        if origin is not None:
            lines.append(_comment(f"# {origin.flag}{_where(origin.file, origin.line)}"))
        lines.append(f"{name} = {_value(value)}")
    return lines
