"""`vime import`: an upstream vime or slime launch script (or a train.py flag list) -> a spec.

    read (shell.py, never runs anything) -> argv -> map (mapping.py through table.py)
    -> keys + findings -> complete (cluster, model, upstream defaults) -> TOML (toml_out.py)

Called by vime/cli.py's `import` verb; imports nothing heavier than the flag catalogues.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from vime.importer import table
from vime.importer.mapping import Finding, Mapped, Origin, map_flags
from vime.importer.shell import Reading, Unknown, Word, read_script

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


def import_script(path: Path, text: str, environ: dict[str, str]) -> ImportResult:
    """Read a launch script (never running it) and map its train.py flags to spec keys."""
    reading = read_script(path, text, environ)
    findings = [Finding(n.code, table.CODES[n.code][1], n.message, n.file, n.line,
                        _note_help(n.code)) for n in reading.notes]
    if reading.argv is None:
        findings.append(Finding("V973", "error", f"{path} runs no train.py", str(path), 1,
                                "import the flags with --argv"))
        return ImportResult({}, {}, findings, str(path), reading.sourced)
    result = import_words(reading.argv, _experiment_name(path.name), str(path), environ, reading)
    result.findings[:0] = findings
    return result


def import_argv(argv: list[str], name: str = "imported") -> ImportResult:
    """Map a plain train.py flag list (what train.py received) to spec keys."""
    words = [Word(arg, "--argv", index + 1) for index, arg in enumerate(argv)]
    return import_words(words, name, "--argv", {}, None)


def import_words(words: list[Word], name: str, source: str, environ: dict[str, str],
                 reading: Reading | None) -> ImportResult:
    mapped = map_flags(words)
    mapped.set("experiment.name", name, Origin(f"the name of {source}" if source != "--argv"
                                               else "vime import's default name"))
    _cluster(mapped, reading)
    _model(mapped)
    _algorithm(mapped)
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
            "V961": "", "V974": "put the models file beside the script"}.get(code, "")


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
    total_nodes = math.ceil((actor + rollout) / per_node)
    mapped.set("cluster.nodes", total_nodes,
               Origin(f"(actor {actor} + rollout {rollout} GPUs) ÷ {per_node} per node"))


def _model(mapped: Mapped) -> None:
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
    arch["model_type"] = "qwen3_moe" if arch.get("num_experts") else "qwen3"
    origins["model_type"] = Origin("--num-experts" if arch.get("num_experts") else "no --num-experts")
    config = _config_json(mapped.values.get("model.hf_checkpoint"))
    if config is not None:
        for key, value in sorted(arch.items()):
            if key == "model_type":
                continue
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
        if all(_same(preset.get(k, 0), arch[k]) for k in PRESET_KEYS if k in arch) and \
                all(k in arch for k in ("num_hidden_layers", "hidden_size")):
            mapped.set("model.preset", name, Origin("the model args (" + ", ".join(
                origins[k].flag for k in PRESET_KEYS if k in arch) + ")"))
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
