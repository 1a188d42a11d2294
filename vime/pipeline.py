"""parse -> validate -> resolve -> check -> plan, for every verb. Never raises on bad input:
every problem comes back as a diagnostic."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path as FsPath

from vime import check
from vime.diagnostics import Diagnostic, finalize, has_errors
from vime.overrides import Override, Positions, apply, parse_override
from vime.parse import ParseError, Source, decode, parse
from vime.plan import Plan, plan
from vime.resolve import resolve
from vime.resolve.spec import Spec
from vime.validate import validate


@dataclass
class Result:
    source: Source
    diagnostics: list[Diagnostic] = field(default_factory=list)
    spec: Spec | None = None
    plan: Plan | None = None  # None whenever there is an error
    # the plan of a spec whose only errors are that vime's runtime cannot run its model
    # (PLANNING_ONLY): `vime plan` shows it, marked as planning only; nothing compiles it
    sketch: Plan | None = None

    @property
    def ok(self) -> bool:
        return not has_errors(self.diagnostics)


# Errors that leave the plan meaningful: the layout, groups and memory of an architecture the
# runtime does not run (V102), or of engines whose weights it does not quantize yet (V124), are
# still right for megatron-core and vLLM themselves.
PLANNING_ONLY = frozenset({"V102", "V124"})


# Errors in the inputs of the memory model: the schema (an unknown key may be a misspelt
# memory key), the model, the layouts, the batch, the engines and the GPU budget.
_MEMORY_INPUTS = ("V0", "V1", "V2", "V3", "V4", "V5", "V6")


def without_consequences_of_wrong_inputs(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """Drop the memory and KV-room verdicts (V8xx) when an input they are computed from is
    already an error: they would be numbers of a spec that cannot run, and their fixes
    (less memory) are not the fix."""
    if any(d.severity == "error" and d.code.startswith(_MEMORY_INPUTS) for d in diagnostics):
        return [d for d in diagnostics if not d.is_consequence]
    return diagnostics


def _planning_only(diagnostics: list[Diagnostic]) -> bool:
    """Only planning-only errors, and memory errors (V8xx) beside them: the memory model is
    Qwen3's, so an architecture the runtime cannot run has no memory verdict to trust."""
    errors = {d.code for d in diagnostics if d.severity == "error"}
    return bool(errors & PLANNING_ONLY) and all(
        code in PLANNING_ONLY or code.startswith("V8") for code in errors)


def run_file(name: str, data: bytes, sets: list[str] = (), spec_dir: FsPath | None = None,
             strict: bool = False, resume: bool = True) -> Result:
    """`run` on a file's bytes: a file that is not UTF-8 is a V006 diagnostic, not a crash."""
    try:
        source = decode(name, data)
    except ParseError as err:
        source = Source(name, data.decode("utf-8", errors="replace"))
        return Result(source, finalize([err.diagnostic], strict))
    return run(source, sets, spec_dir, strict, resume)


def run(source: Source, sets: list[str] = (), spec_dir: FsPath | None = None,
        strict: bool = False, resume: bool = True) -> Result:
    """resume=False: the spec is judged as a fresh start (`vime submit --fresh`), without the
    checkpoint its run folder holds (V708, V709)."""
    result = Result(source)
    diagnostics: list[Diagnostic] = []
    overrides: list[Override] = []
    for index, argument in enumerate(sets, 1):
        parsed = parse_override(index, argument)
        (diagnostics.append if isinstance(parsed, Diagnostic) else overrides.append)(parsed)
    try:
        raw, spans = parse(source)
    except ParseError as err:
        result.diagnostics = finalize([*diagnostics, err.diagnostic], strict)
        return result
    if not raw:  # an empty file: the V005s below say what is missing, this how to start
        diagnostics.append(Diagnostic(
            "error", "V005", (), "the spec is empty", spans.locate(()),
            help="start from an example spec and edit it: copy specs/tiny_cpu.toml (the whole "
            "loop on a laptop's CPU) or specs/qwen3_30b.toml (one node of 8 GPUs) from the "
            "vime repository"))
    raw, problems = apply(raw, overrides)
    diagnostics += problems
    positions = Positions(spans, overrides)
    raw, schema_diagnostics, can_continue = validate(raw, positions)
    diagnostics += schema_diagnostics
    if can_continue and not problems:
        spec = resolve(raw, positions, spec_dir or FsPath.cwd(), resume)
        result.spec = spec
        diagnostics = without_consequences_of_wrong_inputs(
            [*diagnostics, *check.run(spec, positions)])
        if not has_errors(diagnostics) and spec.arch is not None:
            result.plan = plan(spec)
        elif spec.arch is not None and _planning_only(diagnostics):
            result.sketch = plan(spec)
    result.diagnostics = finalize(diagnostics, strict)
    if not result.ok:
        result.plan = None
    return result
