"""The one model of a problem in a spec; rendered three ways by vime.render."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    col: int
    text: str = ""  # the source line, for the excerpt


@dataclass(frozen=True)
class Diagnostic:
    severity: Severity
    code: str
    path: tuple[str | int, ...]
    message: str
    location: Location | None = None
    help: str | None = None
    # Other keys the numbers came from (a rule that needs several keys points at all).
    related: tuple[tuple[tuple[str | int, ...], Location], ...] = field(default=())

    @property
    def key(self) -> str:
        return dotted(self.path)

    @property
    def is_consequence(self) -> bool:
        """Memory and KV-room verdicts (V8xx) follow from the layout, batch and model: they
        are listed after the diagnostics of their inputs."""
        return self.code.startswith("V8")

    def sort_key(self) -> tuple:
        loc = self.location
        return (
            0 if self.severity == "error" else 1,
            1 if self.is_consequence else 0,
            loc.file if loc else "",
            loc.line if loc else 0,
            loc.col if loc else 0,
            self.code,
            self.key,
            self.message,
        )


def dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def finalize(diagnostics: list[Diagnostic], strict: bool = False) -> list[Diagnostic]:
    """Sort, de-duplicate and (with --strict) turn warnings into errors."""
    seen: set[tuple] = set()
    out: list[Diagnostic] = []
    for diag in diagnostics:
        if strict and diag.severity == "warning":
            diag = Diagnostic("error", diag.code, diag.path, diag.message, diag.location,
                              diag.help, diag.related)
        ident = (diag.code, diag.path, diag.message)
        if ident not in seen:
            seen.add(ident)
            out.append(diag)
    return sorted(out, key=Diagnostic.sort_key)


def has_errors(diagnostics: list[Diagnostic]) -> bool:
    return any(d.severity == "error" for d in diagnostics)
