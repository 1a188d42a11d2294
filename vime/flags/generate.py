"""Write the flag catalogs in vime/data/ from the libraries' own argument parsers.

    python -m vime.flags.generate vllm       # in a venv where `import vllm` works
    python -m vime.flags.generate megatron   # in a venv with megatron-core (0.19 ships
                                             # megatron.training.arguments)
    ... --check                              # compare with the stored file instead of writing

Each run writes one file, vime/data/<library>-flags-<version>.json, for the version that is
installed; `vime plan` reads them (vime/flags/__init__.py) without importing any library.
What each catalog holds and which versions are stored: docs/design.md, "Flag catalogs".
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"


def _type_name(fn) -> str | None:
    """argparse's type callable -> a short name vime can check a value against."""
    if fn is None or fn is str:
        return "str"
    if fn is int:
        return "int"
    if fn is float:
        return "float"
    name = getattr(fn, "__qualname__", type(fn).__name__)
    inner = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())
             if callable(c.cell_contents)]
    if name.startswith("optional_type.") and inner:
        base = _type_name(inner[0])
        return f"optional {base}" if base else None
    if name.startswith("parse_type.") and inner:
        return _type_name(inner[0])
    short = name.split(".")[-1]
    return {"human_readable_int": "human_int", "human_readable_int_or_auto": "human_int_or_auto",
            "loads": "json", "union_dict_and_str": "json_or_str", "parse_dataclass": "json",
            "moe_freq_type": "int_or_list", "tuple_type": "tuple"}.get(short, short)


def _literals(hint) -> tuple[list, bool] | None:
    """The values a Literal (possibly inside Optional/Union) names, and whether the union also
    admits any str (`CacheDType | str`: vLLM 0.33's kv_cache_dtype, where plugins may register
    more); None if no Literal."""
    if typing.get_origin(hint) is typing.Literal:
        return list(typing.get_args(hint)), False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        values, open_, other = [], False, False
        for arg in typing.get_args(hint):
            if arg is type(None):
                continue
            if arg is str:
                open_ = True
            elif (found := _literals(arg)) is not None:
                values += found[0]
                open_ |= found[1]
            else:
                other = True
        return (values, open_) if values and not other else None
    return None


def _deprecation(parser, action) -> str | bool:
    """vLLM's own words where its help says "deprecated", else True for the parser's mark."""
    text = " ".join((action.help or "").split())
    if "deprecated" in text.lower():
        return text[:300]
    return bool(getattr(action, "deprecated", False) or action in getattr(parser, "_deprecated", ()))


def actions(parser: argparse.ArgumentParser, hints: dict | None = None) -> list[dict]:
    """One entry per optional action of the parser (help and positionals left out)."""
    registered: dict[int, list[str]] = {}  # every option string the parser answers to
    for option, action in parser._option_string_actions.items():
        registered.setdefault(id(action), []).append(option)
    out = []
    for action in parser._actions:
        options = sorted(o for o in registered.get(id(action), ()) if o.startswith("--"))
        if not options or isinstance(action, argparse._HelpAction):
            continue
        entry: dict = {"options": options, "dest": action.dest}
        if action.nargs == 0:
            entry["value"] = False  # store_true / store_const / BooleanOptionalAction
            if isinstance(action, argparse.BooleanOptionalAction):
                # vLLM 0.33's EnableDisableAction: --disable-x (and the hidden --no-enable-x)
                negative = getattr(action, "negative_option_strings", None)
                if negative is None:
                    negative = {o for o in options if o.startswith("--no-")}
                entry["false"] = sorted(o for o in negative if o.startswith("--"))
        else:
            entry["type"] = _type_name(action.type)
            if action.nargs is not None:
                entry["nargs"] = action.nargs
        if action.choices is not None:
            entry["choices"] = [c if isinstance(c, (str, int, float, bool)) else str(c)
                                for c in action.choices]
        elif hints is not None and action.nargs != 0 and action.dest in hints:
            found = _literals(hints[action.dest])
            if found and all(isinstance(v, (str, int)) for v in found[0]):
                entry["valid"] = found[0]  # validated by vLLM's config after the parser
                if found[1]:
                    entry["valid_open"] = True  # ... which admits other strings too
        if deprecated := _deprecation(parser, action):
            entry["deprecated"] = deprecated
        out.append(entry)
    return sorted(out, key=lambda e: e["options"][0])


def vllm_catalog() -> dict:
    import vllm
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    if not platforms.current_platform.device_type:  # UnspecifiedPlatform: no GPU found
        platforms._current_platform = CpuPlatform()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    hints = {}
    for name, field in EngineArgs.__dataclass_fields__.items():
        hint = field.type
        if isinstance(hint, str):
            try:
                hint = typing.get_type_hints(EngineArgs)[name]
            except Exception:
                continue
        hints[name] = hint
    return {"library": "vllm", "version": vllm.__version__,
            "source": "vllm.engine.arg_utils.EngineArgs.add_cli_args(FlexibleArgumentParser())",
            "actions": actions(parser, hints)}


def megatron_catalog() -> dict:
    from megatron.core import package_info
    from megatron.training import arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    arguments.add_megatron_arguments(parser)
    return {"library": "megatron", "version": package_info.__version__.split("+")[0],
            "source": "megatron.training.arguments.add_megatron_arguments",
            "actions": actions(parser)}


def path_of(catalog: dict) -> Path:
    return DATA / f"{catalog['library']}-flags-{catalog['version']}.json"


def dumps(catalog: dict) -> str:
    """One action a line: small, diffable, and cheap for json.loads."""
    head = {k: v for k, v in catalog.items() if k != "actions"}
    lines = [json.dumps(head)[:-1] + ', "actions": [']
    body = [json.dumps(a, separators=(",", ":")) for a in catalog["actions"]]
    return "\n".join(lines + [",\n".join(body), "]}"]) + "\n"


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("vllm", "megatron"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    catalog = vllm_catalog() if argv[0] == "vllm" else megatron_catalog()
    target, text = path_of(catalog), dumps(catalog)
    if "--check" in argv:
        same = target.exists() and target.read_text() == text
        print(f"{target.name}: {'current' if same else 'differs or missing'}")
        return 0 if same else 1
    target.write_text(text)
    print(f"wrote {target} ({len(catalog['actions'])} flags, {len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
