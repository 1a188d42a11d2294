"""Stage 2, validate: the raw dict against the JSON schema, every error, with did-you-mean.

Unknown keys are reported and dropped, so the later stages still run and the user sees
every semantic problem too; any other schema error stops the pipeline after this stage
(the typed Spec cannot be built from a value of the wrong type).
"""

from __future__ import annotations

import copy
import difflib

import jsonschema

from vime import schema
from vime.aliases import alias
from vime.diagnostics import Diagnostic, dotted
from vime.overrides import Positions
from vime.parse import Path
from vime.words import a

# Keys people bring from other tools that vime leaves out on purpose, with what to write instead.
# rollout.extra_args is as close to train.extra_args (Megatron's flags) by spelling as to
# inference.extra_args, where the vLLM flags people put beside the rollout settings go.
_LEFT_OUT: dict[Path, dict[str, str]] = {
    ("rollout",): {"extra_args": "did you mean inference.extra_args? it belongs in [inference]"},
}


def _suggest(path: Path, key: str) -> str | None:
    known = alias(key)
    if known is not None:
        tool, target = known
        table, _, name = target.rpartition(".")
        return (f"did you mean {target}? {key} is {tool}'s name for it: write {name} = ... "
                f"under [{table}]")
    left_out = _LEFT_OUT.get(tuple(path), {})
    close = difflib.get_close_matches(key, left_out, n=1, cutoff=0.6)
    if close or (left_out and key.endswith("args")):
        return left_out[close[0] if close else next(iter(left_out))]
    siblings = list((schema.node(path) or {}).get("properties", {}))
    close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.6)
    if close:
        return f"did you mean {dotted((*path, close[0]))}?"
    everywhere = [p for p, _ in schema.leaves()] + list(schema.tables())
    scored = [(difflib.SequenceMatcher(None, key, str(p[-1])).ratio(), -len(p), p)
              for p in everywhere]
    score, _, best = max(scored)
    if score >= 0.6:
        return f"did you mean {dotted(best)}? it belongs in [{dotted(best[:-1])}]"
    if siblings:
        return f"the keys of [{dotted(path)}] are: {', '.join(siblings)}" if path else (
            f"the sections are: {', '.join(siblings)}")
    return None


def _plain(value) -> str:
    """A name with case and - or _ aside ("transformer-engine", "Local")."""
    return str(value).lower().replace("-", "_")


def _key_taking(path: Path, value: str) -> tuple[Path, str] | None:
    """Another key whose names include `value` (as written, case and - or _ aside), and the
    name as that key spells it: a key of the same table first, else the one key of the
    schema that has it."""

    def named(leaves) -> list[tuple[Path, str]]:
        return [(p, c) for p, sub in leaves if p != path
                for c in sub.get("enum", ()) if _plain(c) == _plain(value)]

    siblings = named(((*path[:-1], k), sub) for k, sub in
                     (schema.node(path[:-1]) or {}).get("properties", {}).items())
    if siblings:
        return siblings[0]
    anywhere = named(schema.leaves())
    return anywhere[0] if len(anywhere) == 1 else None


def _describe(path: Path, error: jsonschema.ValidationError) -> tuple[str, str | None]:
    sub = error.schema if isinstance(error.schema, dict) else {}
    value = error.instance
    if error.validator == "enum":
        choices = error.validator_value
        message = f"{value!r} is not one of {', '.join(map(repr, choices))}"
        elsewhere = _key_taking(path, value) if isinstance(value, str) else None
        if elsewhere is not None:
            key, name = dotted(elsewhere[0]), dotted(path)
            takes = ", ".join(f'"{c}"' for c in choices)
            return message, (f'"{value}" is a value of {key}, not of {name}: write '
                             f'{key} = "{elsewhere[1]}" ({name} takes {takes})')
        plain = {_plain(c): c for c in choices}
        close = (difflib.get_close_matches(_plain(value), plain, n=1, cutoff=0.6)
                 if isinstance(value, str) else [])
        return message, f'did you mean "{plain[close[0]]}"?' if close else None
    if error.validator == "type":
        expected = error.validator_value
        return f"{value!r} is not of type {expected}", f"write {a(str(expected))} here" + (
            f" (default {sub['default']!r})" if "default" in sub else "")
    if error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        bounds = {k: sub[k] for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
                  if k in sub}
        words = {"minimum": "≥", "exclusiveMinimum": ">", "maximum": "≤", "exclusiveMaximum": "<"}
        rng = " and ".join(f"{words[k]} {v}" for k, v in bounds.items())
        return f"{value!r} is out of range: it must be {rng}", None
    if error.validator == "pattern":
        return (f"{value!r} contains characters that are not allowed here",
                f"it must match {error.validator_value}")
    if error.validator in ("minItems", "uniqueItems", "minLength", "maxLength"):
        return error.message, None
    return error.message, None


# JSON Schema counts 1.0 as an integer; TOML keeps them apart and so must vime (a float tp
# would reach Megatron's argparse as "1.0").
_TYPES = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool))
_Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=_TYPES)


def validate(raw: dict, positions: Positions) -> tuple[dict, list[Diagnostic], bool]:
    """Returns (raw without unknown keys, diagnostics, whether later stages may run)."""
    validator = _Validator(schema.load())
    diagnostics: list[Diagnostic] = []
    cleaned = copy.deepcopy(raw)
    can_continue = True
    for error in validator.iter_errors(raw):
        path: Path = tuple(error.absolute_path)
        if error.validator == "additionalProperties":
            known = set((error.schema or {}).get("properties", {}))
            for key in sorted(set(error.instance) - known):
                key_path = (*path, key)
                diagnostics.append(Diagnostic(
                    "error", "V002", key_path, f"unknown key {dotted(key_path)}",
                    positions.locate(key_path), help=_suggest(path, key)))
                table = cleaned
                for part in path:
                    table = table[part]
                table.pop(key, None)
        elif error.validator == "required":
            missing = error.message.split("'")[1]
            key_path = (*path, missing)
            sub = schema.node(key_path) or {}
            diagnostics.append(Diagnostic(
                "error", "V005", key_path, f"required key {dotted(key_path)} is missing",
                positions.locate(path),
                help=f"add {missing} = ... under [{dotted(path)}]: {sub.get('description', '')}"
                if path else f"add {a(f'[{missing}]')} section: {sub.get('description', '')}"))
            can_continue = False
        elif error.validator == "propertyNames":
            diagnostics.append(Diagnostic(
                "error", "V003", path, f"{dotted(path)}: {error.message}",
                positions.locate(path), help="environment variable names are letters, digits and _"))
            can_continue = False
        else:
            message, help_text = _describe(path, error)
            diagnostics.append(Diagnostic(
                "error", "V003", path, f"{dotted(path)}: {message}", positions.locate(path),
                help=help_text))
            can_continue = False
    return cleaned, diagnostics, can_continue
