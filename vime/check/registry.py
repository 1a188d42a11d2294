"""The rule registry: each rule is a small function with a stable code and a short name.

A rule's docstring is what `vime explain CODE` prints: what it protects against, which
library enforces it at run time (with the message users would otherwise meet after the
queue wait) and how to fix it. Code ranges:

  V0xx schema and command line    V1xx model          V2xx Megatron layout and optimizer
  V3xx MoE and EPLB               V4xx batch          V5xx rollout engines (vLLM)
  V6xx GPU budget and placement   V7xx cluster, Slurm, Ray and paths
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from vime.diagnostics import Diagnostic, Severity
from vime.overrides import Positions
from vime.parse import Path
from vime.resolve.spec import Spec


@dataclass(frozen=True)
class Finding:
    """What a rule returns: the key to point at, the numbers, the fix, the other keys involved."""

    path: str
    message: str
    help: str | None = None
    related: tuple[str, ...] = ()
    severity: Severity | None = None  # None: the rule's own severity


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: Severity
    enforced_by: str  # "megatron", "vllm", "slime", "vime": who fails at run time
    needs_arch: bool
    func: Callable[[Spec], Iterable[Finding]]

    @property
    def explanation(self) -> str:
        return inspect.cleandoc(self.func.__doc__ or "")

    @property
    def summary(self) -> str:
        return self.explanation.split("\n", 1)[0]


RULES: dict[str, Rule] = {}

# Codes reported by the stages before check (parse, --set, validate), documented here so
# `vime explain` and docs cover them too.
STAGE_CODES: dict[str, tuple[str, str]] = {
    "V001": ("toml-syntax", """The spec is not valid TOML.

        vime parses specs with Python's tomllib (TOML 1.0). The position is where the
        parser stopped; the mistake is often just before it: a string without quotes,
        a missing `]` in a table header, or a key written twice.
        Fix: correct the syntax; `taplo check` or an editor with the Even Better TOML
        extension and the spec's `#:schema` header shows the same error as you type."""),
    "V002": ("unknown-key", """A key or section the spec format does not have.

        The schema (schema/vime.schema.json) is the single list of keys. An unknown key is
        most often a typo or a key written in the wrong table (tp belongs in
        [train.parallel], not [train]); vime suggests the closest known key, and for a
        flag name of slime, Megatron-LM or vLLM (tensor_model_parallel_size, rm_type) the key
        that sets it (vime/aliases.py). Unknown keys
        are ignored by the rest of the checks, so every other problem is still reported.
        Fix: rename or move the key as the help line says, or delete it."""),
    "V003": ("invalid-value", """A value of the wrong type, out of its range, or not one of the allowed names.

        Each key's type, bounds and allowed values are in schema/vime.schema.json (for
        example gpu_memory_utilization must lie in (0, 1], as vLLM's CacheConfig requires,
        cudagraph capture sizes must be positive, and names may only use safe characters
        because they end up in job names, folders and command lines).
        Fix: write a value of the stated type and range."""),
    "V004": ("bad-override", """A `--set key.path=value` argument that cannot be applied.

        The value uses TOML syntax (numbers, true/false, "strings", [arrays]); a bare word
        is taken as a string. The key path must name a key, not a value inside one.
        Fix: --set train.parallel.tp=8 or --set inference.cudagraph_capture_sizes=[1,2,4]."""),
    "V005": ("missing-key", """A required key or section is missing.

        Keys without a sensible default (the experiment name, the cluster size, the model
        checkpoint, the prompt data and the rollout counts) must be written.
        Fix: add the key; the help line gives its meaning. An empty spec is reported once
        more, first, with the example specs to start from (specs/tiny_cpu.toml runs on a
        laptop)."""),
    "V006": ("spec-not-utf8", """The spec file is not UTF-8 text.

        TOML files are UTF-8 (TOML 1.0, and Python's tomllib reads nothing else). A file
        saved as Latin-1 or Windows-1252 (an accented letter in a comment or a path) or as
        UTF-16 (some Windows editors) cannot be read; the position is the first byte that
        is not UTF-8.
        Fix: save the file as UTF-8 (an editor's "Save with Encoding", or
        `iconv -f latin1 -t utf-8 spec.toml > fixed.toml`)."""),
    "V007": ("spec-too-deep", """The spec nests tables and arrays more than 32 levels deep.

        No key of vime's is deeper than 4 (eval.datasets[0].name); a spec nested hundreds
        deep (a generated file, a fuzzer's) is not a spec vime can read: Python's tomllib
        recurses once per array or inline table and stops near 500 levels, and the later
        stages sooner. The position is the bracket, key or header that passes 32 levels; a
        --set nested as deep is a V004.
        Fix: remove the nesting; docs/spec.md lists every key."""),
}


def rule(code: str, name: str, severity: Severity = "error", enforced_by: str = "vime",
         needs_arch: bool = False):
    def register(func: Callable[[Spec], Iterable[Finding]]):
        if code in RULES or code in STAGE_CODES:
            raise ValueError(f"rule code {code} registered twice")
        RULES[code] = Rule(code, name, severity, enforced_by, needs_arch, func)
        return func

    return register


_INDEX = re.compile(r"\[(\d+)\]")


def key_path(dotted_path: str) -> Path:
    parts: list[str | int] = []
    for piece in dotted_path.split("."):
        name = _INDEX.split(piece)
        parts.append(name[0])
        parts.extend(int(i) for i in name[1::2])
    return tuple(p for p in parts if p != "")


def run(spec: Spec, positions: Positions) -> list[Diagnostic]:
    diagnostics = []
    for code, registered in sorted(RULES.items()):
        if registered.needs_arch and spec.arch is None:
            continue
        for finding in registered.func(spec) or ():
            path = key_path(finding.path)
            diagnostics.append(Diagnostic(
                finding.severity or registered.severity, code, path, finding.message,
                positions.locate(path), finding.help,
                tuple((key_path(r), positions.locate(key_path(r))) for r in finding.related
                      if positions.written(key_path(r))),
            ))
    return diagnostics


def explain(code: str) -> str | None:
    code = code.upper()
    if code in RULES:
        registered = RULES[code]
        return (f"{code} {registered.name} ({registered.severity}; enforced at run time by "
                f"{registered.enforced_by})\n\n{registered.explanation}\n")
    if code in STAGE_CODES:
        name, text = STAGE_CODES[code]
        return f"{code} {name} (error; reported by vime)\n\n{inspect.cleandoc(text)}\n"
    return None
