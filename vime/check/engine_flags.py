"""V511-V517: inference.extra_args against vLLM's own flag catalog (vime/data/vllm-flags-*.json).

The catalogs hold the flags of every vLLM version vime generated one from (vime/flags/
generate.py: 0.26.0, 0.32.0 and 0.33.0 of the supported 0.26 to 0.33). A flag is unknown
(V511, an error) only when none of them has it; a flag some of them lack is a warning that
names the versions and their spelling. Values are judged against the union over versions, so
a value any cataloged version takes passes. Versions 0.27 to 0.31 have no catalog: a flag that
was added after 0.26 and removed before 0.32 would be reported unknown (none is known; vLLM
deprecates a flag for a release before removing it, and the catalogs' deprecations show it).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass

from vime import flags
from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec

# Flags vime derives from the plan (vime/emit/vllm.py); setting them again in extra_args would
# contradict it. Each maps to the spec key(s) it comes from, or None where none does.
VIME_VLLM_FLAGS: dict[str, str | None] = {
    "--model": "model.hf_checkpoint",
    "--tensor-parallel-size": "inference.gpus_per_engine and data_parallel_size",
    "-tp": "inference.gpus_per_engine and data_parallel_size",
    "--data-parallel-size": "inference.data_parallel_size",
    "-dp": "inference.data_parallel_size",
    "--enable-expert-parallel": "inference.expert_parallel",
    "-ep": "inference.expert_parallel",
    "--enable-eplb": "inference.eplb.enabled", "--eplb-config": "[inference.eplb]",
    "--gpu-memory-utilization": "inference.gpu_memory_utilization",
    "--max-model-len": "rollout.max_prompt_len and max_response_len",
    "--cudagraph-capture-sizes": "inference.cudagraph_capture_sizes",
    "--moe-backend": "inference.moe_backend",
    "--enable-sleep-mode": "train.colocate",
    "--enable-return-routed-experts": "train.routing_replay",
    "--pipeline-parallel-size": None, "-pp": None,
}

# The flags users of slime (SGLang's engine) and of SGLang itself write, with vLLM's own;
# difflib finds none of these (--enable-ep-moe is closest to --enable-eplb by spelling).
SGLANG_FLAGS = {
    "--enable-ep-moe": "--enable-expert-parallel",
    "--ep-size": "--enable-expert-parallel",
    "--tp-size": "--tensor-parallel-size",
    "--dp-size": "--data-parallel-size",
    "--mem-fraction-static": "--gpu-memory-utilization",
    "--context-length": "--max-model-len",
    "--max-running-requests": "--max-num-seqs",
    "--chunked-prefill-size": "--max-num-batched-tokens",
    "--disable-radix-cache": "--no-enable-prefix-caching",
    "--disable-cuda-graph": "--enforce-eager",
}

# vLLM's config/vllm.py _verify_aux_output_compatibility (0.32, 0.33): the KV connectors it
# refuses with --enable-return-routed-experts, directly or inside a MultiConnector; 0.26's
# __post_init__ refuses every KV connector. tests/oracle/test_vllm_flags.py reads them there.
ROUTED_EXPERTS_REFUSED_CONNECTORS = ("NixlConnector", "NixlPullConnector", "NixlPushConnector",
                                     "MoRIIOConnector", "MooncakeConnector")
CP_MESSAGE = ("--enable-return-routed-experts is incompatible with context parallelism "
              "(DCP/PCP > 1).")
ANY_CONNECTOR_MESSAGE = ("--enable-return-routed-experts is incompatible with KV connectors "
                         "(PD disaggregation, KV cache offload).")


@dataclass(frozen=True)
class Parsed:
    index: int
    arg: flags.Arg
    resolved: flags.Resolved
    entries: dict[str, dict]  # version -> the catalog's action, where the flag is one

    @property
    def dest(self) -> str | None:
        return next(iter(self.entries.values()))["dest"] if self.entries else None

    @property
    def is_false(self) -> bool:
        """A boolean flag's false form (--no-x, --disable-x)."""
        return any(self.resolved.option in e.get("false", ()) for e in self.entries.values())


@functools.cache
def parse(extra_args: tuple[str, ...]) -> tuple[Parsed, ...]:
    if not extra_args:  # the catalogs are read only for flags to judge
        return ()
    cat = flags.catalog("vllm")
    out = []
    for index, text in enumerate(extra_args):
        arg = flags.split(text)
        resolved = flags.resolve(cat, arg.name)
        entries = cat.entries(resolved.option) if resolved.option else {}
        out.append(Parsed(index, arg, resolved, entries))
    return tuple(out)


def _where(p: Parsed) -> str:
    return f"inference.extra_args[{p.index}]"


def _vime_key(option: str) -> str | None:
    key = VIME_VLLM_FLAGS.get(option, "")
    return key or None


def suggestion(name: str) -> str:
    cat = flags.catalog("vllm")
    if name in SGLANG_FLAGS:
        target = SGLANG_FLAGS[name]
        key = _vime_key(target)
        return (f"{name} is SGLang's flag; vLLM's is {target}"
                + (f", which vime sets from {key}: set that key instead" if key else ""))
    negative = name.startswith(("--no-", "--disable-"))
    options = [o for o in cat.options if negative or not o.startswith(("--no-", "--disable-"))]
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    if close:
        key = _vime_key(close[0])
        return f"did you mean {close[0]}?" + (f" (vime sets it from {key})" if key else "")
    return (f"`vllm serve --help` lists vLLM's flags; vime checked those of vLLM "
            f"{flags.versions_text(cat.versions)}")


@rule("V511", "unknown-vllm-flag", enforced_by="vllm")
def unknown_vllm_flag(spec: Spec):
    """inference.extra_args has a flag that vLLM's engine-argument parser does not know.

    vLLM's parser (EngineArgs.add_cli_args) stops the engine with "unrecognized arguments"
    (or "ambiguous option" for a prefix of several flags) after the queue wait. vime checks
    each flag against the catalogs generated from vLLM's own parser (vime/data/vllm-flags-*.json:
    0.26.0, 0.32.0, 0.33.0): a flag none of them has is an error with the closest flag (and
    vLLM's name for SGLang's flags: --enable-ep-moe is --enable-expert-parallel); a flag only
    some versions have is a warning naming the others' spelling (0.33 added --disable-x for
    the false form of --enable-x; 0.26 and 0.32 know only --no-enable-x); an abbreviation,
    which argparse takes while it is unique, is a warning (a later flag can make it ambiguous).
    Underscores count as dashes, as in vLLM.
    Fix: the flag as vLLM spells it (the help line), or remove it."""
    if not spec.inference.extra_args:
        return
    cat = flags.catalog("vllm")
    for p in parse(spec.inference.extra_args):
        name = p.arg.name
        if p.resolved.ambiguous:
            yield Finding(_where(p), f"{name} is ambiguous: vLLM's parser could take it for "
                          f"{', '.join(p.resolved.ambiguous[:6])}",
                          help="write the whole flag")
        elif p.resolved.option is None:
            yield Finding(_where(p), f"vLLM has no flag {name} (none in vLLM "
                          f"{flags.versions_text(cat.versions)})", help=suggestion(name))
        elif p.resolved.abbreviation:
            yield Finding(_where(p), f"{name} is an abbreviation of {p.resolved.option}",
                          help=f"write {p.resolved.option}: vLLM's parser takes a prefix only "
                          f"while no other flag starts with it", severity="warning")
        elif missing := [v for v in cat.versions if v not in p.entries]:
            spelled = sorted({o for v in missing for e in cat.by_version[v].values()
                              if e["dest"] == p.dest for o in e["options"]
                              if (o in e.get("false", ())) == p.is_false})
            common = [o for o in spelled if all(o in cat.by_version[v] for v in cat.versions)]
            yield Finding(_where(p), f"{name} is not a flag of vLLM "
                          f"{flags.versions_text(missing)} (it is of "
                          f"{flags.versions_text(sorted(p.entries, key=cat.versions.index))})",
                          help=(f"{common[0]}, which every version takes" if common else
                                f"there it is {spelled[0]}" if spelled else
                                "remove it if the cluster runs those versions"),
                          severity="warning")


_NUMBER = {"int": r"[+-]?\d+", "float": r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|nan)",
           "human_int": r"\d+(\.\d+)?[kKmMgGtT]?|[+-]?\d+",
           "human_int_or_auto": r"\d+(\.\d+)?[kKmMgGtT]?|[+-]?\d+|auto|AUTO|Auto"}
_WORDS = {"int": "an integer", "float": "a number", "human_int": "an integer (1k, 2M allowed)",
          "human_int_or_auto": "an integer or auto", "json": "JSON"}


def _type_error(kind: str, value: str) -> str | None:
    optional = kind.startswith("optional ")
    kind = kind.removeprefix("optional ")
    if optional and value in ("", "None"):
        return None
    if kind in _NUMBER:
        return None if re.fullmatch(_NUMBER[kind], value) else _WORDS[kind]
    if kind == "json" or (kind == "json_or_str" and re.match(r"(?s)^\s*{.*}\s*$", value)):
        try:
            json.loads(value)
        except ValueError:
            return "JSON"
    return None


@rule("V512", "vllm-flag-bad-value", enforced_by="vllm")
def vllm_flag_bad_value(spec: Spec):
    """A value in inference.extra_args that vLLM does not take for its flag.

    vLLM's parser refuses a value outside a flag's choices ("invalid choice: 'FP8'") or not
    of its type ("invalid int value"), and its config classes refuse values of a Literal field
    the parser lets through (e.g. "Invalid kv_cache_dtype: 'FP8'. Valid values are: [...]"
    in 0.33, whose parser has no choices for it). The choices, types and Literal values are
    in vime's catalogs (vime/data/vllm-flags-*.json, read from vLLM's parser and EngineArgs'
    field annotations); a value any cataloged version takes passes. Where the field also
    admits other strings (0.33's kv_cache_dtype and tokenizer_mode: plugins may register
    more), another value is a warning, unless it differs from a known one only in case.
    Fix: one of the values the message lists (they are case-sensitive)."""
    if not spec.inference.extra_args:
        return
    for p in parse(spec.inference.extra_args):
        value = p.arg.value
        if not p.entries or value is None or p.arg.key is not None:
            continue
        takes = [e for e in p.entries.values() if e.get("value", True)]
        if not takes:
            continue
        # per version: (values, open) where the parser or the config field names values
        allowed = [(e["choices"], False) if "choices" in e else
                   (e["valid"], bool(e.get("valid_open"))) if "valid" in e else None
                   for e in takes]
        if None not in allowed:
            union = {str(c) for values, _ in allowed for c in values}
            if value not in union:
                newest = [str(c) for c in allowed[-1][0]]
                close = sorted(c for c in union if c.lower() == value.lower())
                opened = any(o for _, o in allowed)
                yield Finding(_where(p), f"{p.arg.name}={value} is not a value vLLM takes "
                              f"for {p.arg.name}: {', '.join(newest)}",
                              help=f"{p.arg.name}={close[0]} (the values are case-sensitive)"
                              if close else "one of the values above" +
                              (", or one a vLLM plugin registers" if opened else ""),
                              severity="warning" if opened and not close else None)
                continue
        errors = {_type_error(e.get("type") or "str", value) for e in takes}
        if None not in errors:
            yield Finding(_where(p), f"{p.arg.name}={value}: vLLM expects "
                          f"{sorted(errors)[0]} for {p.arg.name}",
                          help=f"{p.arg.name}=<{sorted(errors)[0]}>")


@rule("V513", "vllm-flag-value-form", enforced_by="vllm")
def vllm_flag_value_form(spec: Spec):
    """A flag in inference.extra_args given a value it does not take, or none where it needs one.

    Each element of extra_args is one argv word, so a value goes after `=`
    (--max-num-seqs=256); a lone --max-num-seqs makes vLLM's parser stop with "expected one
    argument". A switch (--enforce-eager, --enable-chunked-prefill) takes no value:
    --enforce-eager=true stops it with "ignored explicit argument 'true'"; its false form is
    --no-enforce-eager. `--flag.key=value` only sets a key of a JSON flag.
    Fix: --flag=value for a flag with a value, the switch alone (or its --no- form) for one
    without."""
    if not spec.inference.extra_args:
        return
    for p in parse(spec.inference.extra_args):
        if not p.entries:
            continue
        entry = p.entries[max(p.entries, key=flags._version_key)]
        name = p.arg.name
        if entry.get("value", True) is False:
            if p.arg.value is not None or p.arg.key is not None:
                false = [o for o in entry.get("false", ()) if o.startswith("--no-")] or \
                    list(entry.get("false", ()))
                yield Finding(_where(p), f"{name} is a switch and takes no value "
                              f"(vLLM: ignored explicit argument {p.arg.value!r})",
                              help=f"{p.resolved.option} alone" +
                              (f", or {false[0]} for false" if false and not p.is_false else ""))
        elif p.arg.key is not None:
            if "json" not in (entry.get("type") or ""):
                yield Finding(_where(p), f"{name} is not a JSON flag, so {p.arg.shown} "
                              "sets nothing vLLM knows", help=f"{name}=VALUE")
            elif p.arg.value is None:
                yield Finding(_where(p), f"{p.arg.shown} needs a value after =",
                              help=f"{p.arg.shown}=VALUE")
        elif p.arg.value is None and entry.get("nargs") not in ("?", "*"):
            yield Finding(_where(p), f"{name} needs a value: vLLM's parser stops with "
                          "'expected one argument' (each element of extra_args is one word)",
                          help=f"{name}=VALUE")


@rule("V514", "vllm-flag-twice", severity="warning", enforced_by="vime")
def vllm_flag_twice(spec: Spec):
    """inference.extra_args sets the same vLLM flag twice.

    vLLM's parser takes the last one (a switch and its --no- form, underscore and dash
    spellings and abbreviations are the same flag), so the first is silently ignored; for
    `--json-flag.key=value` forms the same key twice is the same (vLLM logs "Found duplicate
    keys").
    Fix: keep one of them."""
    if not spec.inference.extra_args:
        return
    seen: dict[tuple[str, str | None], Parsed] = {}
    for p in parse(spec.inference.extra_args):
        if p.dest is None:
            continue
        slot = (p.dest, p.arg.key)
        if slot in seen:
            first = seen[slot]
            yield Finding(_where(p), f"{p.arg.shown} is set twice (extra_args[{first.index}] "
                          f"{first.arg.text} and extra_args[{p.index}] {p.arg.text}); vLLM "
                          "takes the last", help="remove one of them",
                          related=(_where(first),))
        seen[slot] = p


@rule("V515", "vllm-flag-deprecated", severity="warning", enforced_by="vllm")
def vllm_flag_deprecated(spec: Spec):
    """inference.extra_args uses a flag vLLM deprecates.

    It still parses, often with no effect, and a later vLLM removes it (then V511). The text
    is vLLM's own help, kept in vime's catalogs.
    Fix: what vLLM's text says (usually another flag, or nothing: remove it)."""
    if not spec.inference.extra_args:
        return
    for p in parse(spec.inference.extra_args):
        marks = {v: e["deprecated"] for v, e in p.entries.items() if e.get("deprecated")}
        if marks:
            text = next((t for t in reversed(marks.values()) if isinstance(t, str)), "")
            yield Finding(_where(p), f"vLLM {flags.versions_text(list(marks))} deprecates "
                          f"{p.arg.name}" + (f": {text}" if text else ""),
                          help="remove it, or use what vLLM's text names")


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@rule("V516", "routed-experts-vs-context-parallel", enforced_by="vllm")
def routed_experts_vs_context_parallel(spec: Spec):
    """Routing replay (R3) with vLLM's decode or prefill context parallelism.

    train.routing_replay makes vime start vLLM with --enable-return-routed-experts, and vLLM
    (config/vllm.py, _verify_aux_output_compatibility, 0.32 and 0.33) refuses it with
    --decode-context-parallel-size or --prefill-context-parallel-size above 1:
    "--enable-return-routed-experts is incompatible with context parallelism (DCP/PCP > 1)."
    Fix: remove the DCP/PCP flag from inference.extra_args, or routing_replay = false."""
    if not spec.train.routing_replay or not spec.inference.extra_args:
        return
    for p in parse(spec.inference.extra_args):
        size = _int(p.arg.value)
        if p.dest in ("decode_context_parallel_size", "prefill_context_parallel_size") \
                and size is not None and size > 1:
            yield Finding(_where(p), f"{p.arg.name}={size} with routing_replay: vLLM stops "
                          f"with \"{CP_MESSAGE}\"", help=f"remove {p.arg.name}, or "
                          "routing_replay = false", related=("train.routing_replay",))


def _connectors(config) -> list[str]:
    if not isinstance(config, dict) or not isinstance(config.get("kv_connector"), str):
        return []
    names = [config["kv_connector"]]
    if names[0] == "MultiConnector":
        extra = config.get("kv_connector_extra_config")
        children = extra.get("connectors", []) if isinstance(extra, dict) else []
        names += [c["kv_connector"] for c in children
                  if isinstance(c, dict) and isinstance(c.get("kv_connector"), str)]
    return names


@rule("V517", "routed-experts-vs-kv-connector", enforced_by="vllm")
def routed_experts_vs_kv_connector(spec: Spec):
    """Routing replay (R3) with a KV connector vLLM refuses it with.

    vLLM 0.32 and 0.33 (config/vllm.py, _verify_aux_output_compatibility) refuse
    --enable-return-routed-experts with the NixlConnector, NixlPullConnector,
    NixlPushConnector, MoRIIOConnector and MooncakeConnector, named in --kv-transfer-config
    or inside its MultiConnector: "--enable-return-routed-experts is incompatible with
    NixlConnector; PD auxiliary output is not supported." (the routes captured on the prefill
    instance do not reach the decode one). vLLM 0.26 refuses every KV connector: "...
    incompatible with KV connectors (PD disaggregation, KV cache offload)."; another
    connector is a warning for that version.
    Fix: remove --kv-transfer-config, or routing_replay = false."""
    if not spec.train.routing_replay or not spec.inference.extra_args:
        return
    config: dict = {}
    where: Parsed | None = None
    for p in parse(spec.inference.extra_args):
        if p.dest != "kv_transfer_config" or p.arg.value is None:
            continue
        where = p
        try:
            value = json.loads(p.arg.value)
        except ValueError:
            value = p.arg.value
        if p.arg.key is None:
            config = value if isinstance(value, dict) else {}
        else:
            node = config
            *parents, last = p.arg.key.split(".")
            for part in parents:
                node = node.setdefault(part, {}) if isinstance(node, dict) else {}
            if isinstance(node, dict):
                node[last] = value
    names = _connectors(config)
    if where is None or not names:
        return
    refused = [n for n in names if n in ROUTED_EXPERTS_REFUSED_CONNECTORS]
    if refused:
        yield Finding(_where(where), f"routing_replay with the {refused[0]}: vLLM stops with "
                      f"\"--enable-return-routed-experts is incompatible with {refused[0]}; "
                      "PD auxiliary output is not supported.\"",
                      help="remove --kv-transfer-config, or routing_replay = false",
                      related=("train.routing_replay",))
    else:
        yield Finding(_where(where), f"routing_replay with the {names[0]}: vLLM 0.26 stops "
                      f"with \"{ANY_CONNECTOR_MESSAGE}\" (0.32 and 0.33 take it)",
                      help="run vLLM >= 0.32, or remove --kv-transfer-config",
                      related=("train.routing_replay",), severity="warning")
