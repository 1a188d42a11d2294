"""train.py's flags -> spec keys through table.FLAGS, with the report of what did not map.

`map_flags` takes the argv the reader found (or `--argv` gave) and returns the spec as a dict
of dotted keys, each with the flag and line it came from, and the findings: one per flag that
has no key, or a value the reader could not know.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from vime.importer import table
from vime.importer.shell import Unknown, Word, counted_as


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str  # error | warning | note
    message: str
    file: str = ""
    line: int = 0
    help: str = ""


@dataclass(frozen=True)
class Origin:
    flag: str  # the flag, or what the value came from
    file: str = ""
    line: int = 0


@dataclass
class Mapped:
    values: dict[str, object] = field(default_factory=dict)  # dotted key -> value
    origins: dict[str, Origin] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    given: set[str] = field(default_factory=set)  # flags given (their first name)
    unknown: set[str] = field(default_factory=set)  # flags given with a value only a run knows
    extra_args: list[str] = field(default_factory=list)
    arch: dict[str, tuple[object, Origin]] = field(default_factory=dict)
    cluster: dict[str, tuple[object, Origin]] = field(default_factory=dict)
    joint: dict[str, tuple[object, Origin]] = field(default_factory=dict)  # row.name -> value
    words: dict[str, tuple[str, ...]] = field(default_factory=dict)  # every flag -> its words
    flag_at: dict[str, Word] = field(default_factory=dict)  # every flag -> where it is written
    # --vllm-tensor-parallel-size: (the flag as written, its value, where), judged after every
    # flag against inference.gpus_per_engine (_engine_tp)
    vllm_tp: list[tuple[str, str, Word]] = field(default_factory=list)

    def set(self, dotted: str, value, origin: Origin) -> None:
        self.values[dotted] = value
        self.origins[dotted] = origin

    def report(self, code: str, message: str, word: Word | None = None, help: str = "",
               severity: str | None = None) -> None:
        self.findings.append(Finding(code, severity or table.CODES[code][1], message,
                                     word.file if word else "", word.line if word else 0, help))


@dataclass(frozen=True)
class Group:
    flag: str
    words: tuple[Word, ...]  # the flag's values
    at: Word  # the flag itself (file, line)


def group(argv: list[Word], mapped: Mapped) -> list[Group]:
    """Flags with the words after them that do not start with `--` (train.py's argparse reads
    the scripts' flags this way: no value there starts with `--`)."""
    groups: list[Group] = []
    for word in argv:
        text = word.value
        if isinstance(text, str) and text.startswith("--") and len(text) > 2:
            name, eq, value = text.partition("=")
            values = (Word(value, word.file, word.line),) if eq else ()
            groups.append(Group(name, values, word))
        elif groups:
            last = groups[-1]
            groups[-1] = Group(last.flag, (*last.words, word), last.at)
        elif isinstance(text, Unknown):
            mapped.report("V962", f"a word before the first flag is unknown: {text.why}", word)
        else:
            mapped.report("V966", f"{text!r} is not a flag (train.py takes no positional "
                          "arguments)", word, "remove it from the script")
    return groups


def _convert(row: table.Flag, flag: str, words: tuple[Word, ...]):
    """The spec value of a flag's words; raises ValueError with a message for bad ones."""
    texts = [w.value for w in words]
    kind = row.value
    if kind.startswith("set:"):
        if texts:
            raise ValueError(f"{flag} takes no value; it was given {' '.join(map(str, texts))!r}")
        return kind.removeprefix("set:")
    if kind in ("true", "false"):
        if texts:
            raise ValueError(f"{flag} is a switch; it was given {' '.join(map(str, texts))!r}")
        return kind == "true"
    if kind == "pairs":
        return _eval_pairs(flag, texts)
    if kind == "ints":
        if not texts:
            raise ValueError(f"{flag} needs one or more integers")
        try:
            return [int(t) for t in texts]
        except ValueError:
            raise ValueError(f"{flag} takes integers, not {' '.join(texts)!r}") from None
    if len(texts) != 1:
        split = len(texts) > 1 and len({(w.file, w.line) for w in words}) == 1
        raise ValueError(f"{flag} takes one value; it was given {len(texts)}: "
                         f"{' '.join(map(str, texts))!r}" + (
                             " (bash splits an array element with blanks in it where the "
                             "array is expanded unquoted: write \"${ARRAY[@]}\")" if split else ""))
    text = texts[0]
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{flag} takes an integer, not {text!r}") from None
    if kind == "ep_size":  # an expert-parallel size: EP is on when it spans several GPUs
        try:
            size = int(text)
        except ValueError:
            raise ValueError(f"{flag} takes an integer, not {text!r}") from None
        if size < 1:
            raise ValueError(f"{flag} {size}: an expert-parallel size is 1 or more")
        return size > 1
    if kind == "float":
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{flag} takes a number, not {text!r}") from None
        if not math.isfinite(value):
            raise ValueError(f"{flag} takes a finite number, not {text!r}")
        return value
    if kind == "choice":
        if text not in (row.choices or {}):
            raise ValueError(f"{flag} {text}: vime has "
                             f"{', '.join(sorted(set((row.choices or {}).values())))} only")
        return row.choices[text]
    if kind == "save_hf":  # the path; the interval is --save-interval's (importer._save_hf)
        return text
    if kind == "reward_name":
        from vime.rewards import BUILTIN_REWARDS

        if text not in BUILTIN_REWARDS:
            raise ValueError(f"{flag} {text}: vime's built-in rewards are "
                             f"{', '.join(sorted(BUILTIN_REWARDS))}; a reward of your own is "
                             "rollout.reward = \"module.path:function\"")
        return text
    if kind in ("reward", "function"):
        module, _, function = text.rpartition(".")
        if not module:
            raise ValueError(f"{flag} {text!r} is not module.function")
        return f"{module}:{function}"
    if kind == "json":
        try:
            value = json.loads(text)
        except ValueError:
            raise ValueError(f"{flag} takes JSON, not {text!r}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{flag} takes a JSON object, not {text!r}")
        return value
    if kind == "layer_freq":
        return _layer_freq(flag, text)
    return text


def _eval_pairs(flag: str, texts: list) -> list[tuple[str, str]]:
    """--eval-prompt-data NAME PATH [NAME PATH ...]: (name, path) pairs; a PATH alone is
    upstream's "aime" (slime/utils/arguments.py, _resolve_eval_datasets)."""
    if len(texts) == 1:
        return [("aime", texts[0])]
    if not texts or len(texts) % 2:
        raise ValueError(f"{flag} takes NAME PATH pairs; it was given {len(texts)} words: "
                         f"{' '.join(map(str, texts))!r}")
    pairs = [(texts[i], texts[i + 1]) for i in range(0, len(texts), 2)]
    for name, _path in pairs:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"{flag}: the dataset name {name!r} is not letters, digits, "
                             "'_', '.' and '-' (eval.datasets' name)")
    return pairs


def _layer_freq(flag: str, text: str):
    """--moe-layer-freq: an int N (every Nth layer is MoE) or a list of 0/1 per layer."""
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return ("step", int(text))
    match = re.fullmatch(r"\[\s*([01](\s*,\s*[01])*)?\s*\]", text)
    if match:
        flags = [int(v) for v in re.findall(r"[01]", text)]
        return ("list", flags)
    # ([0]*3+[1]*45): the form Megatron's docs show
    terms = re.findall(r"\[\s*([01])\s*\]\s*\*\s*(\d+)", text)
    if terms and re.fullmatch(r"\(?\s*(\[\s*[01]\s*\]\s*\*\s*\d+\s*\+?\s*)+\)?", text):
        flags = [int(v) for v, n in terms for _ in range(min(int(n), 1_000_000))]
        return ("list", flags)
    raise ValueError(f"{flag} {text!r} is neither an integer nor a list of 0 and 1")


def _did_you_mean(flag: str) -> str:
    from vime.flags import catalog

    known = set(table.TABLE_BY_NAME) | set(catalog("megatron").options)
    for options in upstream_options().values():
        known.update(options)
    close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.75)
    return f"did you mean {close[0]}?" if close else "check the flag's spelling"


def upstream_options() -> dict[str, tuple[str, ...]]:
    """The parser ("vime", "slime") -> the option strings of its train.py's own flags."""
    return _upstream_options()


@functools.cache
def _upstream_options() -> dict[str, tuple[str, ...]]:
    path = Path(__file__).resolve().parent.parent / "data" / "upstream-flags.json"
    parsers = json.loads(path.read_text())["parsers"]
    return {name: tuple(parser["options"]) for name, parser in parsers.items()}


def _upstream_has(flag: str) -> list[str]:
    return [name for name, options in upstream_options().items() if flag in options]


def map_flags(argv: list[Word]) -> Mapped:
    """Every flag of argv, through the table or a catalogue, into keys and findings."""
    mapped = Mapped()
    seen: dict[str, Group] = {}
    for item in group(argv, mapped):
        row = table.TABLE_BY_NAME.get(item.flag)
        canonical = row.name if row else item.flag
        if canonical in seen and row is not None and row.kind not in ("not_yet", "none", "derived"):
            unit = counted_as(item.at.file)
            mapped.report("V971", f"{item.flag} is given twice ({unit} {seen[canonical].at.line} "
                          f"and {unit} {item.at.line}); the last is taken", item.at)
        seen[canonical] = item
        mapped.words[item.flag] = tuple(w.value if isinstance(w.value, str) else "?"
                                        for w in item.words)
        mapped.flag_at[item.flag] = item.at
        unknown = next((w.value for w in item.words if isinstance(w.value, Unknown)), None)
        if row is None:
            _unlisted(mapped, item, unknown)
            continue
        mapped.given.add(row.name)
        origin = Origin(item.flag, item.at.file, item.at.line)
        if row.kind in ("none", "not_yet", "derived"):
            _explained(mapped, row, item, unknown)
            continue
        if unknown is not None:
            mapped.unknown.add(row.name)
            severity = "warning" if row.kind == "arch" else None
            mapped.report("V962", f"{item.flag}: {unknown.why}", item.at,
                          "vime reads the architecture from config.json or model.preset"
                          if row.kind == "arch" else "", severity)
            continue
        try:
            value = _convert(row, item.flag, item.words)
        except ValueError as err:
            if row.beyond:
                mapped.report("V964", f"{err} (planned: {row.beyond})", item.at, row.why)
            else:
                mapped.report("V963", str(err), item.at, "correct the value in the script")
            continue
        if row.kind == "arch":
            mapped.arch[row.key] = (value, origin)
        elif row.kind == "cluster":
            mapped.cluster[row.name] = (value, origin)
        elif row.kind == "joint":  # a switch; its --no- spelling is false
            mapped.joint[row.name] = (not item.flag.startswith("--no-"), origin)
        elif row.value == "json":
            _eplb_config(mapped, value, origin, item)
        else:
            if row.source == "sglang":
                mapped.report("V967", f"{item.flag} {' '.join(str(w.value) for w in item.words)}"
                              f" becomes {row.key} (vLLM)", item.at, row.why)
            mapped.set(row.key, value, origin)
    _dispatcher(mapped)
    _router(mapped)
    _engine_tp(mapped)
    return mapped


def _vime_sets(mapped: Mapped, item: Group, native: str, words: list[str]) -> bool:
    """A --vllm-X whose vLLM flag vime sets from the spec (V507 refuses it in
    inference.extra_args): a note when the script's value is vime's, else an error naming the
    key; never written to extra_args. False for any other flag."""
    from vime.check.engine_flags import VIME_VLLM_FLAGS
    from vime.check.rollout import _vime_flag_of

    arg = native if not words else f"{native}={words[0]}"
    option = native if native in VIME_VLLM_FLAGS else _vime_flag_of(arg)
    if option not in VIME_VLLM_FLAGS:
        return False
    key = VIME_VLLM_FLAGS[option]
    shown = f"{item.flag} {' '.join(words)}".strip()
    if key is None:
        mapped.report("V963", f"{shown}: vime's engines have no pipeline stages", item.at,
                      "remove it from the script")
    elif option in ("--tensor-parallel-size", "-tp"):
        mapped.vllm_tp.append((shown, words[0] if words else "", item.at))
    else:
        mapped.report("V965", f"{shown}: vime sets vLLM's {option} from {key}", item.at)
    return True


def _engine_tp(mapped: Mapped) -> None:
    """--vllm-tensor-parallel-size against the engines' TP that vime derives:
    inference.gpus_per_engine ÷ data_parallel_size (upstream's --rollout-num-gpus-per-engine
    and --vllm-data-parallel-size, 1 each without them)."""
    per_engine = mapped.values.get("inference.gpus_per_engine", 1)
    dp = mapped.values.get("inference.data_parallel_size", 1)
    for shown, value, at in mapped.vllm_tp:
        tp = per_engine // dp if isinstance(per_engine, int) and isinstance(dp, int) and dp \
            else None
        if value.isdigit() and tp is not None and int(value) == tp:
            mapped.report("V965", f"{shown}: vime's engines run TP = gpus_per_engine ÷ "
                          f"data_parallel_size = {per_engine} ÷ {dp} = {tp}, as this says", at)
        else:
            mapped.report("V963", f"{shown}: vime's engines run TP = gpus_per_engine ÷ "
                          f"data_parallel_size = {per_engine} ÷ {dp}" + (
                              f" = {tp}" if tp is not None else ""), at,
                          "set --rollout-num-gpus-per-engine (inference.gpus_per_engine) to "
                          "the engine's TP × DP")


def _router(mapped: Mapped) -> None:
    """The router's softmax: --moe-router-pre-softmax is norm_topk_prob = false (its table
    row), its absence in a Qwen3-MoE's model args true (Megatron's top-k softmax, which
    vime's resolve would otherwise read as HF's default, false); with sigmoid scores it
    changes nothing (megatron-core renormalises the top-k sigmoid scores,
    moe_utils.py topk_routing_with_score_function)."""
    sigmoid = mapped.words.get("--moe-router-score-function") == ("sigmoid",)
    if "--moe-router-pre-softmax" in mapped.flag_at and sigmoid:
        mapped.report("V965", "--moe-router-pre-softmax: with sigmoid scores megatron-core "
                      "renormalises the top-k weights either way",
                      mapped.flag_at["--moe-router-pre-softmax"])
    elif "num_experts" in mapped.arch and "norm_topk_prob" not in mapped.arch and not sigmoid:
        mapped.arch["norm_topk_prob"] = (True, Origin("no --moe-router-pre-softmax: the "
                                                      "softmax over the top-k"))


def _dispatcher(mapped: Mapped) -> None:
    """--moe-enable-deepep and --moe-flex-dispatcher-backend choose the flex dispatcher's
    kernels: Megatron refuses DeepEP without --moe-token-dispatcher-type flex
    (TransformerConfig.__post_init__), and reads a backend only with flex."""
    if mapped.words.get("--moe-token-dispatcher-type") == ("allgather",):
        mapped.report("V965", "--moe-token-dispatcher-type allgather: vime's alltoall sends "
                      "the same tokens to the same experts; megatron-core refuses allgather "
                      "with the variable sequence lengths vime trains with",
                      mapped.flag_at["--moe-token-dispatcher-type"])
    backend = mapped.origins.get("train.moe_flex_backend")
    if backend is None or mapped.values.get("train.moe_token_dispatcher") == "flex":
        return
    at = mapped.flag_at[backend.flag]
    dispatcher = mapped.words.get("--moe-token-dispatcher-type")
    shown = (f"--moe-token-dispatcher-type {' '.join(dispatcher)}" if dispatcher else
             "no --moe-token-dispatcher-type (Megatron's allgather)")
    if backend.flag == "--moe-enable-deepep":
        mapped.report("V963", f"--moe-enable-deepep with {shown}: Megatron stops at start, "
                      "\"DeepEP backend is only supported with flex token dispatcher.\"", at,
                      "add --moe-token-dispatcher-type flex to the script (train."
                      "moe_token_dispatcher = \"flex\"), or remove --moe-enable-deepep")
    else:
        mapped.report("V965", f"{backend.flag} {mapped.values['train.moe_flex_backend']} with "
                      f"{shown}: the backend is read only by the flex dispatcher", at)
    del mapped.values["train.moe_flex_backend"], mapped.origins["train.moe_flex_backend"]


def _explained(mapped: Mapped, row: table.Flag, item: Group, unknown) -> None:
    shown = " ".join(str(w.value) if isinstance(w.value, str) else "?" for w in item.words)
    flag_text = f"{item.flag} {shown}".strip()
    if row.kind == "derived":
        expected = _expected(row, shown)
        if row.expect and unknown is None and not expected and row.beyond:
            mapped.report("V964", f"{flag_text}: not yet in vime (planned: {row.beyond}); vime "
                          f"uses {row.name} {row.expect[0]}", item.at, row.why)
        elif row.expect and unknown is None and not expected:
            mapped.report("V963", f"{flag_text}: vime uses {row.name} {row.expect[0]}", item.at,
                          row.why, row.mismatch)
        else:
            mapped.report("V965", f"{flag_text}: {row.why}", item.at)
    elif row.kind == "not_yet":
        mapped.report("V964", f"{flag_text}: not yet in vime (planned: {row.key})", item.at,
                      row.why, row.severity)
    else:
        mapped.report("V963", f"{flag_text}: no equivalent in vime", item.at, row.why,
                      row.severity)


def _expected(row: table.Flag, shown: str) -> bool:
    """The value is one vime uses: the same text, or the same number (0.00 is 0)."""
    if shown in row.expect:
        return True
    try:
        value = float(shown)
    except ValueError:
        return False
    for expect in row.expect:
        try:
            if float(expect) == value:
                return True
        except ValueError:
            continue
    return False


def _unlisted(mapped: Mapped, item: Group, unknown) -> None:
    from vime.flags import catalog

    flag = item.flag
    parsers = _upstream_has(flag)
    if parsers:
        mapped.report("V963", f"{flag}: a train.py flag ({' and '.join(parsers)}) vime has no "
                      "key for", item.at, "if this flag matters to the run, the spec cannot "
                      "express it yet")
        return
    if flag.startswith("--router-"):
        mapped.report("V963", f"{flag}: a flag of upstream vime's vllm-router; vime sends "
                      "requests to its engines itself", item.at, "nothing to do",
                      "warning")
        return
    if flag.startswith("--vllm-"):
        native = "--" + flag[len("--vllm-"):]
        if catalog("vllm").newest(native) is None:
            mapped.report("V966", f"{flag}: vLLM has no {native}", item.at, _did_you_mean(flag))
            return
        if unknown is not None:
            mapped.report("V962", f"{flag}: {unknown.why}", item.at)
            return
        words = [str(w.value) for w in item.words]
        if _vime_sets(mapped, item, native, words):
            return
        if not words:
            mapped.extra_args.append(native)
        elif len(words) == 1:
            mapped.extra_args.append(f"{native}={words[0]}")
        else:  # nargs="+" flags: vLLM reads the words after the flag
            mapped.extra_args.extend([native, *words])
        mapped.report("V970", f"{flag} becomes inference.extra_args {native}", item.at)
        mapped.origins.setdefault("inference.extra_args", Origin(flag, item.at.file, item.at.line))
        return
    if flag.startswith("--sglang-"):
        mapped.report("V967", f"{flag}: vime's engines are vLLM, and this SGLang flag has no "
                      "vLLM key in vime", item.at, "find vLLM's flag for it and add it to "
                      "inference.extra_args", "error")
        return
    if catalog("megatron").newest(flag) is not None:
        mapped.report("V963", f"{flag}: a Megatron flag vime does not take", item.at,
                      "vime builds Megatron's arguments from the spec's keys (megatron.args "
                      "shows them); if this flag matters to the run, the spec cannot express "
                      "it yet")
        return
    mapped.report("V966", f"{flag}: no parser vime knows has this flag", item.at,
                  _did_you_mean(flag))


def _eplb_config(mapped: Mapped, config: dict, origin: Origin, item: Group) -> None:
    keys = {"num_redundant_experts": "inference.eplb.num_redundant_experts",
            "window_size": "inference.eplb.window_size",
            "step_interval": "inference.eplb.step_interval"}
    for name, value in config.items():
        if name in keys and isinstance(value, int) and not isinstance(value, bool):
            mapped.set(keys[name], value, origin)
        else:
            mapped.report("V963", f"{item.flag}: {name} = {value!r} has no key in "
                          "[inference.eplb]", item.at, "vime sets num_redundant_experts, "
                          "window_size and step_interval")


MAX_POSITIONS = "model.arch.max_position_embeddings"


def max_positions(mapped: Mapped, config: dict | None) -> None:
    """Where the imported spec's max_position_embeddings comes from, said in the report:
    --max-position-embeddings, else the checkpoint's config.json (readable here), else the
    preset, else --seq-length (the longest sequence the script trains, written to
    [model.arch]); when nothing gives it, a warning that `vime plan` takes vime's default
    (V104). Call after the model's keys are written (vime/importer/__init__.py's _model)."""
    values = mapped.values
    written = values.get(MAX_POSITIONS)
    if written is not None:
        origin = mapped.origins[MAX_POSITIONS]
        if origin.flag.startswith("--"):
            mapped.findings.append(Finding("V965", "note", f"{origin.flag}: "
                                           f"max_position_embeddings = {written}",
                                           origin.file, origin.line))
        return
    if not any(key.startswith("model.arch.") for key in values) and "model.preset" not in \
            values and config is None:
        return  # no architecture at all: `vime plan` says so (V101)
    flag = mapped.flag_at.get("--max-position-embeddings")
    given = mapped.words.get("--max-position-embeddings")
    if flag is not None and "max_position_embeddings" not in mapped.arch:
        return  # given with a value the reader could not know or convert: reported already
    if "max_position_embeddings" in mapped.arch:  # given and agreeing: config.json or preset
        value, origin = mapped.arch["max_position_embeddings"]
        if any(f.code == "V968" and "max_position_embeddings" in f.message
               for f in mapped.findings):
            return  # contradicts config.json: said
        mapped.findings.append(Finding("V965", "note", f"--max-position-embeddings "
                                       f"{' '.join(given or ())}: max_position_embeddings = "
                                       f"{value}", origin.file, origin.line))
        return
    if config is not None:
        found = config.get("max_position_embeddings")
        if isinstance(found, int) and not isinstance(found, bool):
            mapped.findings.append(Finding(
                "V965", "note", f"max_position_embeddings = {found} from the checkpoint's "
                "config.json (the model args have no --max-position-embeddings)"))
            return
    elif "model.preset" in values:
        from vime.resolve.model import PRESETS

        found = PRESETS.get(str(values["model.preset"]), {}).get("max_position_embeddings")
        if found is not None:
            mapped.findings.append(Finding(
                "V965", "note", f"max_position_embeddings = {found} from the preset "
                f"{values['model.preset']} (the model args have no --max-position-embeddings)"))
            return
    else:
        words = mapped.words.get("--seq-length", ())
        at = mapped.flag_at.get("--seq-length")
        if at is not None and len(words) == 1 and words[0].isdigit() and int(words[0]) > 0:
            length = int(words[0])
            mapped.set(MAX_POSITIONS, length, Origin(f"--seq-length {length}", at.file, at.line))
            mapped.findings.append(Finding(
                "V965", "note", f"--seq-length {length}: max_position_embeddings = {length}, "
                "the longest sequence the script trains (the model args have no "
                "--max-position-embeddings and config.json is not readable here)",
                at.file, at.line, "write the checkpoint's own max_position_embeddings in "
                "[model.arch] if its context is longer"))
            return
    mapped.findings.append(Finding(
        "V963", "warning", "nothing gives max_position_embeddings: not the model args "
        "(--max-position-embeddings), --seq-length or the checkpoint's config.json (not "
        "readable here); `vime plan` takes vime's default, 2048 (V104)", "", 0,
        "write [model.arch] max_position_embeddings = the checkpoint's context length"))
