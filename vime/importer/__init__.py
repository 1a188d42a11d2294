"""`vime import`: an upstream vime or slime launch script (or a train.py flag list) -> a spec.

    read (shell.py, never runs anything) -> argv -> map (mapping.py through table.py)
    -> keys + findings -> complete (cluster, model, algorithm, eval, dynamic sampling,
    offload, upstream defaults) -> TOML (toml_out.py)

Called by vime/cli.py's `import` verb; imports nothing heavier than the flag catalogues.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from vime.importer import table
from vime.importer.family import FAMILY_FLAGS, QWEN3, Family, family_arch, model_family
from vime.importer.mapping import Finding, Mapped, Origin, map_flags, max_positions
from vime.importer.shell import ARGV, Reading, Unknown, Word, read_script
from vime.support import MODEL_TYPES, PLANNED_ONLY

REQUIRED = ("cluster.nodes", "cluster.gpus_per_node", "model.hf_checkpoint", "data.prompt_data",
            "rollout.num_rollout", "rollout.batch_size", "rollout.n_samples_per_prompt")
# [model.arch] keys that pick a preset (the rest may differ and are written as overrides)
PRESET_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "num_experts", "moe_intermediate_size", "vocab_size")


@dataclass
class ImportResult:
    values: dict[str, object]  # dotted key -> value
    origins: dict[str, Origin]
    findings: list[Finding]
    source: str  # what was imported (a script path, or "--argv")
    sourced: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """The spec means what the script meant: no error among the findings."""
        return not any(f.severity == "error" for f in self.findings)


def import_script(path: Path, text: str, environ: dict[str, str],
                  repo_root: Path | None = None) -> ImportResult:
    """Read a launch script (never running it) and map its train.py flags to spec keys;
    `repo_root` is the user's checkout, where a sourced file the script names by its path on
    the cluster is found."""
    reading = read_script(path, text, environ, repo_root)
    findings = [Finding(n.code, n.severity or table.CODES[n.code][1], n.message, n.file, n.line,
                        "" if n.severity == "note" else _note_help(n.code))
                for n in reading.notes]
    if reading.argv is None:
        findings.append(Finding("V973", "error", f"{path} runs no train.py", str(path), 1,
                                "import the flags with --argv"))
        return ImportResult({}, {}, findings, str(path), reading.sourced)
    result = import_words(reading.argv, _experiment_name(path.name), str(path), environ, reading)
    if reading.entry == "train_async.py" and reading.entry_line is not None:
        findings += _train_async(result, reading.argv, *reading.entry_line)
    result.findings[:0] = findings
    return result


def _train_async(result: ImportResult, argv: list[Word], file: str, line: int) -> list[Finding]:
    """train_async.py is one-step asynchrony (rollout k+1 generated while the actor trains on
    rollout k, weights pushed between generations): rollout.async = "one_step". Upstream's
    examples/fully_async rollout function keeps generating across weight updates (a buffer),
    which vime does not run: V964 says the spec is one-step."""
    result.values["rollout.async"] = "one_step"
    result.origins["rollout.async"] = Origin("train_async.py", file, line)
    function = next((w.value for w in argv if isinstance(w.value, str)
                     and "fully_async" in w.value), None)
    if function is None:
        return []
    return [Finding(
        "V964", "warning", f"{function}: upstream's fully-async rollout buffer (generation "
        "going on across weight updates, samples of several versions) is not yet in vime "
        "(planned: rollout.async = \"buffer\"); the spec runs one-step asynchrony, each rollout "
        "generated while the actor trains on the one before it", file, line,
        "drop --rollout-function-path: rollout.async = \"one_step\" overlaps generation and "
        "training without it")]


def import_argv(argv: list[str], name: str = "imported") -> ImportResult:
    """Map a plain train.py flag list (what train.py received) to spec keys."""
    words = [Word(arg, ARGV, index + 1) for index, arg in enumerate(argv)]
    return import_words(words, name, ARGV, {}, None)


def import_words(words: list[Word], name: str, source: str, environ: dict[str, str],
                 reading: Reading | None) -> ImportResult:
    mapped = map_flags(words)
    mapped.set("experiment.name", name, Origin(f"the name of {source}" if source != ARGV
                                               else "vime import's default name"))
    _cluster(mapped, reading)
    _model(mapped)
    max_positions(mapped, _config_json(mapped.values.get("model.hf_checkpoint")))
    _engine_quantization(mapped)
    _algorithm(mapped)
    _eval(mapped)
    _dynamic_sampling(mapped)
    _offload(mapped)
    _save_hf(mapped)
    if mapped.extra_args:
        mapped.values["inference.extra_args"] = list(mapped.extra_args)
    for dotted, (default, flag, whose) in table.UPSTREAM_DEFAULTS.items():
        if dotted not in mapped.values and flag not in mapped.given:
            if dotted == "inference.gpu_memory_utilization" and \
                    "--sglang-mem-fraction-static" in mapped.given:
                continue
            mapped.set(dotted, default, Origin(f"{whose} default without {flag}"))
    for dotted in REQUIRED:
        if dotted not in mapped.values:
            if dotted.startswith("cluster.") and any(f.code == "V969" for f in mapped.findings):
                continue  # said already, with the variable to pass
            mapped.report("V972", f"{dotted}: the script gives no value", None,
                          f"write {dotted} in the spec")
    return ImportResult(mapped.values, mapped.origins, mapped.findings, source,
                        reading.sourced if reading else [])


def _note_help(code: str) -> str:
    return {"V960": "pass what it decides with --env NAME=VALUE if a flag reads it",
            "V961": "", "V974": "name the checkout that holds it with --repo-root DIR, or put the "
            "models file beside the script"}.get(code, "")


def _experiment_name(filename: str) -> str:
    stem = re.sub(r"\.(sh|bash)$", "", filename)
    stem = re.sub(r"^run[-_]", "", stem).lower()
    stem = re.sub(r"[^a-z0-9._-]+", "-", stem).strip("-._")
    return (stem or "imported")[:64]


def _cluster(mapped: Mapped, reading: Reading | None) -> None:
    flags = mapped.cluster
    unknown = sorted(mapped.unknown & {row.name for row in table.FLAGS if row.kind == "cluster"})
    if unknown:
        mapped.report("V969", f"the cluster's size depends on {', '.join(unknown)}, whose "
                      "values the reader cannot know", None, "pass the variables the V962 "
                      "errors name with --env, e.g. --env ACTOR_NUM_NODES=2 --env "
                      "ACTOR_NUM_GPUS_PER_NODE=8")
        return
    nodes, nodes_from = flags.get("--actor-num-nodes", (1, Origin("train.py's default")))
    per_node, per_node_from = flags.get("--actor-num-gpus-per-node",
                                        (8, Origin("train.py's default")))
    colocate = "--colocate" in flags
    colocate_from = flags["--colocate"][1] if colocate else Origin("no --colocate")
    if "--num-gpus-per-node" in flags and flags["--num-gpus-per-node"][0] != per_node:
        value, origin = flags["--num-gpus-per-node"]
        mapped.findings.append(Finding("V963", "warning", f"--num-gpus-per-node {value}: vime "
                                       f"has one cluster.gpus_per_node ({per_node})",
                                       origin.file, origin.line,
                                       "every node gives vime the same number of GPUs"))
    if nodes < 1 or per_node < 1:
        mapped.report("V969", f"--actor-num-nodes {nodes} × --actor-num-gpus-per-node "
                      f"{per_node} is no GPU", None, "give positive counts")
        return
    mapped.set("cluster.gpus_per_node", per_node, per_node_from)
    mapped.set("train.colocate", colocate, colocate_from)
    if colocate:
        mapped.set("cluster.nodes", nodes, nodes_from)
        if "--rollout-num-gpus" in flags:
            value, origin = flags["--rollout-num-gpus"]
            mapped.findings.append(Finding("V965", "note", f"--rollout-num-gpus {value}: with "
                                           "--colocate the engines share every actor GPU",
                                           origin.file, origin.line))
        return
    actor = nodes * per_node
    mapped.set("train.num_gpus", actor, Origin("--actor-num-nodes × --actor-num-gpus-per-node",
                                               nodes_from.file, nodes_from.line))
    if "--rollout-num-gpus" not in flags:
        mapped.report("V972", "without --colocate the rollout needs GPUs of its own: the "
                      "script has no --rollout-num-gpus", None, "set inference.num_gpus")
        mapped.set("cluster.nodes", nodes, nodes_from)
        return
    rollout, rollout_from = flags["--rollout-num-gpus"]
    mapped.set("inference.num_gpus", rollout, rollout_from)
    head = reading.head_gpus if reading is not None else None
    if nodes == 1 and head is not None and head.count >= actor + rollout:
        # one node whose Ray head holds the actor's and the engines' GPUs
        mapped.set("cluster.gpus_per_node", head.count,
                   Origin(f"ray start --head --num-gpus {head.count}", head.file, head.line))
        mapped.set("cluster.nodes", 1, nodes_from)
        return
    total_nodes = math.ceil((actor + rollout) / per_node)
    mapped.set("cluster.nodes", total_nodes,
               Origin(f"(actor {actor} + rollout {rollout} GPUs) ÷ {per_node} per node"))


def _model(mapped: Mapped) -> None:
    family = model_family(mapped.words)
    config = _config_json(mapped.values.get("model.hf_checkpoint"))
    if family != QWEN3:
        _other_family(mapped, family, config)
        if not family.model_types:
            return  # no [model.arch]: a Qwen3 written for it would plan another model
    arch = {key: value for key, (value, _origin) in mapped.arch.items()}
    if not arch:
        return
    origins = {key: origin for key, (_value, origin) in mapped.arch.items()}
    freq = arch.pop("mlp_only_layers", None)
    if freq is not None:
        kind, value = freq
        if kind == "step":
            arch["decoder_sparse_step"] = value
            origins["decoder_sparse_step"] = origins["mlp_only_layers"]
        else:
            layers = arch.get("num_hidden_layers")
            if layers is not None and len(value) != layers:
                origin = origins["mlp_only_layers"]
                mapped.findings.append(Finding("V963", "error", f"--moe-layer-freq lists "
                                               f"{len(value)} layers; --num-layers is {layers}",
                                               origin.file, origin.line, "one 0 or 1 per layer"))
            else:
                arch["mlp_only_layers"] = [i for i, moe in enumerate(value) if not moe]
    if "tie_word_embeddings" not in arch:
        arch["tie_word_embeddings"] = True  # Megatron ties them without the untie flag
        origins["tie_word_embeddings"] = Origin("no --untie-embeddings-and-output-weights")
    if family == QWEN3:
        arch["model_type"] = "qwen3_moe" if arch.get("num_experts") else "qwen3"
        origins["model_type"] = Origin("--num-experts" if arch.get("num_experts")
                                       else "no --num-experts")
    else:
        _family_keys(mapped, family, arch, origins)
    if config is not None:
        for key, value in sorted(arch.items()):
            if key == "model_type" or key == "head_dim" and arch.get("kv_lora_rank"):
                continue  # latent attention's head is its qk dims (vime/resolve/model.py)
            found = config.get(key, _config_default(key, config))
            origin = origins[key]
            if found is not None and not _same(found, value):
                mapped.findings.append(Finding(
                    "V968", "error", f"{origin.flag} says {key} = {value!r}; the checkpoint's "
                    f"config.json has {found!r}", origin.file, origin.line,
                    "check that the sourced models file is this checkpoint's"))
            else:
                _agrees(mapped, origin, key, value, "the checkpoint's config.json")
        return
    from vime.resolve.model import PRESETS

    for name, preset in PRESETS.items():
        if preset["model_type"] not in family.model_types:
            continue
        if all(_same(_preset_value(preset, k), arch[k]) for k in PRESET_KEYS if k in arch) and \
                all(k in arch for k in ("num_hidden_layers", "hidden_size")):
            mapped.set("model.preset", name, Origin("the model args (" + ", ".join(
                origins[k].flag for k in PRESET_KEYS if k in arch) + ")"))
            if preset["model_type"] in PLANNED_ONLY:
                _in_preset(mapped, family, name)
            _rope_in_preset(mapped, preset, name)
            for key, value in sorted(arch.items()):
                if key in preset and not _same(preset[key], value) or \
                        key not in preset and key not in ("mlp_only_layers",
                                                          "decoder_sparse_step") and value:
                    mapped.set(f"model.arch.{key}", value, origins[key])
                elif key != "model_type":
                    _agrees(mapped, origins[key], key, value, f"the preset {name}")
            return
    for key, value in sorted(arch.items()):
        mapped.set(f"model.arch.{key}", value, origins[key])


def _preset_value(preset: dict, key: str):
    """A PRESET_KEYS value of a preset, under the names its config.json gives it (GPT-OSS's
    num_local_experts, DeepSeek-V3's n_routed_experts; an expert as wide as
    intermediate_size without moe_intermediate_size)."""
    if key == "num_experts":
        return preset.get("num_experts", preset.get("num_local_experts",
                                                    preset.get("n_routed_experts", 0)))
    if key == "moe_intermediate_size" and _preset_value(preset, "num_experts"):
        return preset.get(key, preset.get("intermediate_size", 0))
    return preset.get(key, 0)


def _in_preset(mapped: Mapped, family: Family, name: str) -> None:
    """The errors of the flags that show a family the preset `name` holds (attention sinks,
    sliding windows, YaRN, gated attention, ...), as notes: the preset's config.json keys
    describe them, and `vime plan` names what the runtime does not run (V102)."""
    shows = {text.split()[0] for text in family.flags}
    mapped.findings[:] = [
        Finding("V965", "note", f"{f.message.split(':', 1)[0]}: a setting of "
                f"{family.name.split(' (')[0]}, held by the preset {name}", f.file, f.line)
        if f.severity == "error" and f.code in ("V963", "V964", "V966")
        and f.message.split(":", 1)[0].split(" ", 1)[0] in shows else f
        for f in mapped.findings]


# Megatron's rotary-scaling flags and the config.json rope_scaling key each gives, with
# transformers' default where the config leaves the key out
ROPE_FLAGS = {"--rotary-scaling-factor": ("factor", None), "--mscale": ("mscale", 1.0),
              "--mscale-all-dim": ("mscale_all_dim", 0.0), "--yarn-beta-fast": ("beta_fast", 32.0),
              "--yarn-beta-slow": ("beta_slow", 1.0),
              "--yarn-original-max-position-embeddings": ("original_max_position_embeddings",
                                                          None)}


def _rope_in_preset(mapped: Mapped, preset: dict, name: str) -> None:
    """The rotary-scaling flags (V964 until here) against the preset `name` the model args
    match: a note where the preset's rope_scaling holds the same value (DeepSeek-R1's and
    Kimi-K2's YaRN), or where the preset has none and --rotary-scaling-factor is 1
    (Moonlight's); V968 where they differ."""
    scaling = preset.get("rope_scaling") or {}
    factor = mapped.words.get("--rotary-scaling-factor", ())
    unscaled = not scaling and len(factor) == 1 and _is_one(factor[0])
    found = []
    for f in mapped.findings:
        flag = f.message.split(":", 1)[0].split(" ", 1)[0]
        if f.code != "V964" or f.severity != "error" or flag not in ROPE_FLAGS:
            found.append(f)
            continue
        key, default = ROPE_FLAGS[flag]
        words = mapped.words.get(flag, ())
        expected = scaling.get(key, default)
        shown = " ".join((flag, *words))
        if unscaled:
            found.append(Finding("V965", "note", f"{shown}: no rotary scaling (a factor of 1), "
                                 f"as in the preset {name}", f.file, f.line))
        elif scaling and expected is not None and len(words) == 1 \
                and _is_number(words[0], expected):
            found.append(Finding("V965", "note", f"{shown}: rope_scaling.{key} = {expected}, as "
                                 f"in the preset {name}", f.file, f.line))
        else:
            has = f"rope_scaling.{key} = {expected!r}" if scaling else "no rope_scaling"
            found.append(Finding("V968", "error", f"{shown}: the preset {name}, which the other "
                                 f"model args match, has {has}", f.file, f.line,
                                 "check that the sourced models file is this checkpoint's, or "
                                 "write [model.arch] rope_scaling in the imported spec"))
    mapped.findings[:] = found


def _is_number(text: str, number) -> bool:
    try:
        return math.isclose(float(text), float(number), rel_tol=1e-9)
    except (TypeError, ValueError):
        return False


def _is_one(text: str) -> bool:
    return _is_number(text, 1.0)


def _other_family(mapped: Mapped, family: Family, config: dict | None) -> None:
    """The model args are not a Qwen3's: V975 when vime does not build the family they show
    (with the flags that show it), V968 when config.json names another; a family vime builds
    has its flags' errors (a Qwen3 has no such setting) made notes."""
    first = next((mapped.flag_at[text.split()[0]] for text in family.flags
                  if text.split()[0] in mapped.flag_at), None)
    at = {"file": first.file, "line": first.line} if first else {}
    shown = f"the model args show {family.name}: {', '.join(family.flags)}"
    found = config.get("model_type") if config is not None else None
    if not family.model_types:
        shows = {text.split()[0] for text in family.flags}
        mapped.findings[:] = [_shows_family(f, family, shows) for f in mapped.findings]
        mapped.findings.append(Finding(
            "V975", "error", f"{shown}; vime builds {', '.join(sorted(MODEL_TYPES))} only, and "
            "this is none of them", help="train this model with upstream: the spec cannot "
            "describe it (vime plan reports V102 for its config.json)", **at))
    elif config is not None and found not in family.model_types:
        mapped.findings.append(Finding(
            "V968", "error", f"{shown}; the checkpoint's config.json has model_type "
            f"{found!r}", help="check that the sourced models file is this checkpoint's", **at))
    else:
        mapped.findings[:] = [_family_setting(f, family) for f in mapped.findings]


def _shows_family(finding: Finding, family: Family, shows: set[str]) -> Finding:
    """A flag's error that is one of those V975 names (a setting of the family vime does not
    build), as a note: the V975 error says what vime lacks, once."""
    flag = finding.message.split(":", 1)[0].split(" ", 1)[0]
    if finding.severity != "error" or flag not in shows or \
            finding.code not in ("V963", "V964", "V966"):
        return finding
    return Finding("V965", "note", f"{finding.message.split(':', 1)[0]}: a setting of "
                   f"{family.name.split(' (')[0]}, which vime does not build (V975)",
                   finding.file, finding.line)


def _family_setting(finding: Finding, family: Family) -> Finding:
    """A flag's error that is a setting of the family vime builds, as a note."""
    flag = finding.message.split(":", 1)[0].split(" ", 1)[0]
    if finding.severity != "error" or flag not in FAMILY_FLAGS or finding.code not in \
            ("V963", "V966"):
        return finding
    built = "which vime plans and its runtime does not run (V102)" if \
        family.model_types[0] in PLANNED_ONLY else "which vime builds"
    return Finding("V965", "note", f"{finding.message.split(':', 1)[0]}: a setting of "
                   f"{family.name.split(' (')[0]}, {built}", finding.file, finding.line)


def _family_keys(mapped: Mapped, family: Family, arch: dict, origins: dict) -> None:
    """model_type and the [model.arch] keys of a DeepSeek-V3 or GLM-4.5 from its flags."""
    arch["model_type"] = family.model_types[0]
    origins["model_type"] = Origin(f"the model args ({', '.join(family.flags[:3])})")
    keys = family_arch(mapped.words, arch.get("moe_intermediate_size"))
    for key, value in keys.values.items():
        at = mapped.flag_at[keys.flags[key]]
        arch[key], origins[key] = value, Origin(keys.flags[key], at.file, at.line)
    for flag, why in keys.problems:
        at = mapped.flag_at[flag]
        mapped.findings.append(Finding("V963", "error", f"{flag}: {why}", at.file, at.line,
                                       "correct the value in the script"))


def _agrees(mapped: Mapped, origin: Origin, key: str, value, what: str) -> None:
    if origin.flag.startswith("--"):
        mapped.findings.append(Finding("V965", "note", f"{origin.flag}: {key} = {value!r}, as in "
                                       f"{what}", origin.file, origin.line))


def _config_default(key: str, config: dict):
    if key == "tie_word_embeddings":
        return config.get("tie_word_embeddings", False)
    if key == "head_dim" and config.get("hidden_size") and config.get("num_attention_heads"):
        return config["hidden_size"] // config["num_attention_heads"]
    return None


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


# the suffix a quantized release adds to its checkpoint folder's name (Qwen3-30B-A3B-INT4,
# Qwen3-4B-FP8) -> the engines' inference.quantization
_QUANTIZED_NAME = re.compile(r"[-_.](FP8|INT4|W4A16)$", re.IGNORECASE)


def _engine_quantization(mapped: Mapped) -> None:
    """inference.quantization from the name of the checkpoint the engines load, where its
    config.json is not readable here (a readable one's quantization_config says it)."""
    path = mapped.values.get("model.hf_checkpoint")
    if not isinstance(path, str) or _config_json(path) is not None:
        return
    found = _QUANTIZED_NAME.search(Path(path.rstrip("/")).name)
    if found is None:
        return
    kind = "fp8" if found.group(1).upper() == "FP8" else "int4"
    origin = mapped.origins.get("model.hf_checkpoint")
    mapped.set("inference.quantization", kind,
               Origin(f"the checkpoint's name ({Path(path.rstrip('/')).name})",
                      origin.file if origin else "", origin.line if origin else 0))


def _config_json(hf_checkpoint) -> dict | None:
    if not isinstance(hf_checkpoint, str):
        return None
    try:
        config = json.loads((Path(hf_checkpoint) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _algorithm(mapped: Mapped) -> None:
    values, given = mapped.values, mapped.given
    if "--use-kl-loss" not in given and values.get("algorithm.kl_loss_coef"):
        mapped.set("algorithm.kl_loss_coef", 0.0, Origin("no --use-kl-loss (the coefficient "
                                                         "is not used)"))
    if "--use-kl-loss" in given and "--kl-loss-type" not in given:
        mapped.set("algorithm.kl_estimator", "k1", Origin("train.py's default --kl-loss-type k1"))
    if "--eps-clip-high" not in given:
        mapped.set("algorithm.eps_clip_high", values.get("algorithm.eps_clip", 0.2),
                   Origin("no --eps-clip-high: the same as --eps-clip"))


# slime's and upstream vime's built-in dynamic-sampling filters: function -> the
# dynamic_sampling_max_attempts that does what it does (None: vime's default)
BUILTIN_FILTERS = {"check_reward_nonzero_std": None,
                   "check_reward_nonzero_std_with_fallback": 1}
BUILTIN_FILTER_MODULES = ("slime.rollout.filter_hub.dynamic_sampling_filters",
                          "vime.rollout.filter_hub.dynamic_sampling_filters")
OFFLOAD_FLAGS = ("--offload", "--offload-train", "--offload-rollout")


def _eval(mapped: Mapped) -> None:
    """[eval] and one [[eval.datasets]] table per --eval-prompt-data NAME PATH pair, each
    with the --eval-* settings upstream applies to every dataset."""
    values, origins = mapped.values, mapped.origins
    each = {dotted.removeprefix("eval.datasets."): (values.pop(dotted), origins.pop(dotted))
            for dotted in [d for d in values if d.startswith("eval.datasets.")]}
    pairs = values.pop("eval.datasets", None)
    if pairs is None:
        for _value, origin in each.values():
            mapped.findings.append(Finding("V965", "note", f"{origin.flag}: the script has no "
                                           "--eval-prompt-data, so nothing is evaluated with it",
                                           origin.file, origin.line))
        return
    pairs_from = origins.pop("eval.datasets")
    values["eval.datasets"] = [{"name": name, "prompt_data": path,
                                **{key: value for key, (value, _o) in each.items()}}
                               for name, path in pairs]
    origins["eval.datasets.name"] = origins["eval.datasets.prompt_data"] = pairs_from
    for key, (_value, origin) in each.items():
        origins[f"eval.datasets.{key}"] = origin
    if "eval.interval" not in values:
        if "--eval-interval" in mapped.given:
            return  # its value did not map: reported, and vime's defaults stay
        for key in ("at_start", "at_end"):
            mapped.set(f"eval.{key}", False, Origin("no --eval-interval: upstream evaluates "
                                                    "only with it"))
        mapped.findings.append(Finding("V965", "note", "--eval-prompt-data without "
                                       "--eval-interval: upstream never evaluates; the "
                                       "datasets are written with eval.at_start and "
                                       "eval.at_end false", pairs_from.file, pairs_from.line))
        return
    interval, interval_from = values["eval.interval"], origins["eval.interval"]
    if "eval.at_start" not in values:
        mapped.set("eval.at_start", True, Origin("no --skip-eval-before-train"))
    num_rollout = values.get("rollout.num_rollout")
    if isinstance(num_rollout, int) and isinstance(interval, int) and interval > 0:
        divides = num_rollout % interval == 0
        mapped.set("eval.at_end", divides,
                   Origin(f"--num-rollout {num_rollout} {'is' if divides else 'is not'} a "
                          f"multiple of --eval-interval {interval}", interval_from.file,
                          interval_from.line))


def _dynamic_sampling(mapped: Mapped) -> None:
    """--dynamic-sampling-filter-path: upstream's built-in filter is vime's dynamic sampling;
    another filter is kept, with the error that vime calls it differently."""
    values, origins = mapped.values, mapped.origins
    name = values.get("rollout.dynamic_sampling_filter")
    if not isinstance(name, str):
        return
    origin = origins["rollout.dynamic_sampling_filter"]
    module, _, function = name.partition(":")
    mapped.set("rollout.dynamic_sampling", True, origin)
    if module in BUILTIN_FILTER_MODULES and function in BUILTIN_FILTERS:
        del values["rollout.dynamic_sampling_filter"], origins["rollout.dynamic_sampling_filter"]
        attempts = BUILTIN_FILTERS[function]
        if attempts is not None:
            mapped.set("rollout.dynamic_sampling_max_attempts", attempts, origin)
        bound = ("after rollout.dynamic_sampling_max_attempts attempts (4 by default) filtered "
                 "groups complete the batch, where upstream samples until it is full"
                 if attempts is None else "after one attempt filtered groups complete the batch")
        mapped.findings.append(Finding("V965", "note", f"{origin.flag} {function}: vime's "
                                       f"dynamic sampling keeps the groups whose rewards differ; "
                                       f"{bound}", origin.file, origin.line))
        return
    mapped.findings.append(Finding(
        "V963", "error", f"{origin.flag} {module}.{function}: upstream calls a filter as "
        f"{function}(args, samples) and reads .keep of its result; vime calls "
        f"{function}(rewards=[...], responses=[...], prompt=..., label=...) and reads a bool "
        "(runtime/rl/sampling.py)", origin.file, origin.line,
        "wrap it in a function of vime's arguments and set rollout.dynamic_sampling_filter = "
        "\"module:wrapper\""))


def _offload(mapped: Mapped) -> None:
    """--offload, --offload-train, --offload-rollout -> train.offload. A colocated upstream run
    offloads both unless told otherwise (slime/utils/arguments.py); vime's modes move both or
    neither, and its auto keeps them resident when they fit."""
    given = {flag: mapped.joint[flag] for flag in OFFLOAD_FLAGS if flag in mapped.joint}
    colocate = mapped.values.get("train.colocate")
    if not colocate:
        for _value, origin in given.values():
            mapped.findings.append(Finding("V965", "note", f"{origin.flag}: without --colocate "
                                           "the actor and the engines have GPUs of their own; "
                                           "vime offloads nothing", origin.file, origin.line))
        return
    if not given:
        mapped.findings.append(Finding(
            "V965", "note", "--colocate without --offload: upstream offloads the actor and "
            "sleeps the engines between phases; vime's train.offload = \"auto\" keeps both "
            "resident when `vime plan` finds they fit on a GPU together", "", 0,
            "train.offload = \"always\" takes turns as upstream does"))
        return
    train = given.get("--offload-train", (True, None))[0]
    rollout = given.get("--offload-rollout", (True, None))[0]
    if "--offload" in given:  # applied after the others (slime/utils/arguments.py)
        train = rollout = True
    first = min((origin for _value, origin in given.values()), key=lambda o: (o.file, o.line))
    shown = " ".join(origin.flag for _value, origin in given.values())
    if train == rollout:
        mapped.set("train.offload", "always" if train else "never",
                   Origin(shown, first.file, first.line))
        return
    mapped.findings.append(Finding(
        "V963", "warning", f"{shown}: the actor {'offloads' if train else 'stays'} and the "
        f"engines {'sleep' if rollout else 'stay awake'}; vime's train.offload moves both or "
        "neither, and its \"auto\" keeps both resident when they fit", first.file, first.line,
        "train.offload = \"always\" or \"never\" if auto's choice is not what you want"))


def _save_hf(mapped: Mapped) -> None:
    """--save-hf PATH: train.py writes an HF folder with every checkpoint, so the interval is
    --save-interval's; without it train.py saves neither (and neither does the spec)."""
    path = mapped.values.get("checkpoint.save_hf_interval")
    if not isinstance(path, str):
        return
    origin = mapped.origins["checkpoint.save_hf_interval"]
    interval = mapped.values.get("checkpoint.save_interval")
    if isinstance(interval, int):
        mapped.set("checkpoint.save_hf_interval", interval,
                   Origin(f"--save-hf with --save-interval {interval}", origin.file, origin.line))
        return
    del mapped.values["checkpoint.save_hf_interval"], mapped.origins["checkpoint.save_hf_interval"]
    mapped.report("V963", f"--save-hf {path}: without --save-interval train.py saves no "
                  "checkpoint and so no HF folder", Word(path, origin.file, origin.line),
                  "give --save-interval, or set checkpoint.save_hf_interval in the spec",
                  "warning")


__all__ = ["ImportResult", "import_argv", "import_script", "Unknown"]
