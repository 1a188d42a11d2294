"""Stage 3, resolve: raw dict -> Spec. Fills defaults from the schema, reads the model's
architecture, derives every value the user may leave out, and records where each came from.

This is the only stage that derives values; check (stage 4) only reports on them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import typing
from pathlib import Path as FsPath

from vime import run_checkpoint, schema
from vime.diagnostics import dotted
from vime.layout import Layout
from vime.overrides import Positions
from vime.parse import Path
from vime.resolve.model import PRESETS, Arch, ArchError, arch_from_config
from vime.resolve.spec import (
    SECTIONS,
    Derived,
    HfFolder,
    ModelConfig,
    Origin,
    PromptFile,
    PromptSample,
    ResumeCheckpoint,
    RunFolders,
    SavedLayout,
    Spec,
    spec_key,
)

# Memory per card in GiB. H100/H800 (81559 MiB) and H200 (143771 MiB, read on an H200 on
# 2026-11-29) are what the driver reports; the others are the nominal sizes until measured.
# `cluster.gpu_memory_gib` overrides.
GPU_MEMORY_GIB = {
    "H100": 79.6, "H800": 79.6, "H20": 96, "H200": 139.8, "A100-80GB": 80, "A100-40GB": 40,
    "A800": 80, "B200": 180, "GB200": 186, "L40S": 48,
}

# How nvidia-smi and people write the same cards: "h100", "NVIDIA A100-SXM4-80GB" (with the
# space as - or _), "A100-80G": case and the form factor do not make a known card unknown.
_FORM_FACTORS = re.compile(r"-(SXM\d?|PCIE)(?=-|$)")


def gpu_name(written: str) -> str | None:
    """The card table's name for a cluster.gpu as written, or None when it is not known."""
    name = written.strip().upper().replace("_", "-").replace(" ", "-")
    name = _FORM_FACTORS.sub("", name.removeprefix("NVIDIA-"))
    name = re.sub(r"-(\d+)G?$", r"-\1GB", name)  # A100-80, A100-80G -> A100-80GB
    if name in GPU_MEMORY_GIB:
        return name
    sized = re.fullmatch(r"(.+)-(\d+)GB", name)  # H100-80GB is the table's H100, H100-94GB not
    if sized and sized[1] in GPU_MEMORY_GIB and abs(GPU_MEMORY_GIB[sized[1]] - int(sized[2])) < 2:
        return sized[1]
    return None


# Written beside a torch_dist checkpoint by runtime/megatron/convert.py (its LAYOUT_FILE;
# tests/test_saved_layout.py keeps the two names equal): the tp/pp/ep/etp it was saved with.
LAYOUT_FILE = "vime_layout.json"
LAYOUT_SIZES = ("tp", "pp", "ep", "etp")


@dataclasses.dataclass(frozen=True)
class ArchResolution:
    arch: Arch | None
    origin: Origin | None
    problem: str | None  # why no architecture could be read, or why config.json is bad
    problem_key: str = "model.hf_checkpoint"
    config: dict | None = None  # config.json or the preset as read, before [model.arch]


def _with_defaults(raw: dict, positions: Positions) -> tuple[dict, dict[str, Origin]]:
    """Every schema leaf gets the user's value or its schema default; origins say which."""
    filled: dict = {}
    origins: dict[str, Origin] = {}
    for path, sub in schema.leaves():
        table_in, table_out = raw, filled
        for part in path[:-1]:
            table_in = table_in.get(part, {}) if isinstance(table_in, dict) else {}
            table_out = table_out.setdefault(part, {})
        key = path[-1]
        if key in table_in:
            table_out[key] = table_in[key]
            origins[dotted(path)] = Origin(positions.origin_kind(path), "",
                                           positions.locate(path))
        else:
            table_out[key] = sub.get("default")
            if "default" in sub:
                origins[dotted(path)] = Origin("default", repr(sub["default"]))
    # the keys written in each [[eval.datasets]] table, which schema.leaves() does not list
    datasets = raw.get("eval", {}).get("datasets") if isinstance(raw.get("eval"), dict) else None
    for index, dataset in enumerate(datasets if isinstance(datasets, list) else []):
        for key in dataset if isinstance(dataset, dict) else ():
            path = ("eval", "datasets", index, key)
            origins[dotted(path)] = Origin(positions.origin_kind(path), "", positions.locate(path))
    return filled, origins


def read_arch(model: dict, spec_dir: FsPath) -> ArchResolution:
    """config.json when readable, else the preset; [model.arch] keys override either."""
    overrides = model.get("arch") or {}
    config: dict | None = None
    origin = None
    config_path = _local_path(model["hf_checkpoint"], spec_dir) / "config.json"
    try:
        config = json.loads(config_path.read_text())
        if not isinstance(config, dict):
            return ArchResolution(None, None, f"{config_path} is not a JSON object")
        origin = Origin("config.json", str(config_path))
    except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError):
        config = None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return ArchResolution(None, None, f"{config_path} cannot be read: {err}")
    if config is None and model.get("preset"):
        config = dict(PRESETS[model["preset"]])
        origin = Origin("preset", model["preset"])
    if config is None and overrides:
        config = {}
        origin = Origin("arch", "[model.arch]")
    if config is None:
        return ArchResolution(
            None, None, f"no architecture: {config_path} is not readable here and no "
            "model.preset or [model.arch] is set")
    try:
        arch = arch_from_config({**config, **overrides})
    except ArchError as err:
        where = "model.arch" if err.key in overrides or origin.kind == "arch" else "model.hf_checkpoint"
        return ArchResolution(None, origin, f"{origin.describe()}: {err}", where, config)
    return ArchResolution(arch, origin, None, config=config)


def _local_path(value: str, spec_dir: FsPath) -> FsPath:
    """A path of the spec on this machine: relative ones are taken from the spec's folder."""
    path = FsPath(value).expanduser()
    return path if path.is_absolute() else spec_dir / path


def read_saved_layout(model: dict, spec_dir: FsPath) -> SavedLayout | None:
    """vime_layout.json of model.torch_dist_checkpoint, when that folder is on this machine."""
    if not model.get("torch_dist_checkpoint"):
        return None
    folder = _local_path(model["torch_dist_checkpoint"], spec_dir)
    if not folder.exists():
        return None  # on the cluster only, or not converted yet: nothing to check here
    layout_path = folder / LAYOUT_FILE
    try:
        saved = json.loads(layout_path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return SavedLayout(str(folder), None, f"has no {LAYOUT_FILE}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return SavedLayout(str(folder), None, f"{layout_path} cannot be read: {err}")
    sizes = {k: saved.get(k) for k in LAYOUT_SIZES} if isinstance(saved, dict) else {}
    if not sizes or any(type(v) is not int or v < 1 for v in sizes.values()):
        return SavedLayout(str(folder), None, f"{layout_path} does not give the positive "
                           f"integers {', '.join(LAYOUT_SIZES)}")
    return SavedLayout(str(folder), sizes)


def _as_runtime_finds(value: str, spec_dir: FsPath, cwd: FsPath) -> FsPath:
    """A spec's path as the runtime finds it (runtime/core/slices.py, _path): a relative one
    from the spec's folder, else from the working folder."""
    path = FsPath(os.path.expanduser(value))
    if not path.is_absolute():
        path = spec_dir / path if (spec_dir / path).exists() or not (
            cwd / path).exists() else cwd / path
    return FsPath(os.path.normpath(path))


PROMPT_SAMPLE_RECORDS = 20  # how many records of each prompt file resolve reads


def prompt_value_problem(value, chat_template: bool) -> str | None:
    """What is wrong with a record's prompt for the driver (runtime/rl/data.py, render): a
    string, or with data.apply_chat_template a list of {"role", "content"} messages."""
    if isinstance(value, str):
        return None
    if isinstance(value, list):
        if not chat_template:
            return "a list of chat messages, which needs data.apply_chat_template = true"
        for number, message in enumerate(value, 1):
            if not isinstance(message, dict):
                return (f"a list whose item {number} is {_shown(message)}, not a chat message "
                        '({"role": ..., "content": ...})')
            for field_name in ("role", "content"):
                if field_name not in message:
                    return f"a list whose message {number} has no {field_name!r}"
        return None
    return f"{_shown(value)}, not a string or a list of chat messages"


def _shown(value) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def read_prompt_sample(path: FsPath, input_key: str, label_key: str,
                       chat_template: bool) -> PromptSample | None:
    """The first records of a prompt file (JSON lines, as runtime/rl/data.py reads them)
    against its input and label keys and the prompts' form; None when the file is not
    readable here."""
    wanted = (input_key, label_key)
    records = 0
    first_keys: tuple[str, ...] = ()
    prompt_at: tuple[int, str] | None = None
    try:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    return PromptSample(str(path), records, number, f"not JSON: {err}")
                if not isinstance(row, dict):
                    return PromptSample(str(path), records, number, "not a JSON object")
                records += 1
                first_keys = first_keys or tuple(row)
                missing = tuple(dict.fromkeys(k for k in wanted if k not in row))
                if missing:
                    return PromptSample(str(path), records, number, None, tuple(row), missing)
                if prompt_at is None:
                    problem = prompt_value_problem(row[input_key], chat_template)
                    prompt_at = (number, problem) if problem else None
                if records == PROMPT_SAMPLE_RECORDS:
                    break
    except (OSError, UnicodeDecodeError):
        return None  # on the cluster only, or unreadable: the job's preflight says so
    return PromptSample(str(path), records, keys=first_keys,
                        prompt_line=prompt_at[0] if prompt_at else None,
                        prompt_problem=prompt_at[1] if prompt_at else None)


def read_prompt_files(values: dict, spec_dir: FsPath, cwd: FsPath) -> tuple[PromptFile, ...]:
    """data.prompt_data and each [[eval.datasets]] table's prompt_data on this machine, found
    as the runtime finds them, with their first records when they are readable here."""
    data = values["data"]
    named = [("data.prompt_data", data["prompt_data"], data["input_key"], data["label_key"])]
    named += [(f"eval.datasets[{index}].prompt_data", dataset["prompt_data"],
               dataset["input_key"], dataset["label_key"])
              for index, dataset in enumerate(values["eval"]["datasets"] or [])]
    files = []
    for key, value, input_key, label_key in named:
        path = _as_runtime_finds(value, spec_dir, cwd)
        try:
            exists = path.exists()
        except OSError:
            exists = False
        files.append(PromptFile(key, str(path), exists,
                                not FsPath(os.path.expanduser(value)).is_absolute(),
                                read_prompt_sample(path, input_key, label_key,
                                                   bool(data["apply_chat_template"]))))
    return tuple(files)


def read_hf_folder(model: dict, spec_dir: FsPath, cwd: FsPath) -> HfFolder:
    """model.hf_checkpoint on this machine, found as the runtime finds it."""
    relative = not FsPath(os.path.expanduser(model["hf_checkpoint"])).is_absolute()
    path = _as_runtime_finds(model["hf_checkpoint"], spec_dir, cwd)
    try:
        exists = path.exists()
        tokenizer = exists and any((path / name).is_file()
                                   for name in ("tokenizer.json", "tokenizer_config.json"))
    except OSError:
        exists = tokenizer = False
    return HfFolder(str(path), exists, relative, tokenizer)


def resume_folder(values: dict, spec_dir: FsPath, cwd: FsPath) -> tuple[FsPath, str]:
    """The folder a submit of this spec resumes from, and the key that names it: model.load,
    else model.save, else <output_dir>/<experiment.name>/checkpoints, with relative paths
    taken as `vime submit` takes them (vime/launch/paths.py: model paths from the spec's
    folder unless found only in the working one, output_dir from the working folder;
    tests/test_resume_checkpoint.py keeps the two the same)."""
    model, experiment = values["model"], values["experiment"]
    for key in ("load", "save"):
        if model.get(key):
            path = FsPath(os.path.expanduser(model[key]))
            if not path.is_absolute():
                path = spec_dir / path if (spec_dir / path).exists() or not (
                    cwd / path).exists() else cwd / path
            return FsPath(os.path.normpath(path)), f"model.{key}"
    output_dir = FsPath(os.path.normpath(cwd / os.path.expanduser(experiment["output_dir"])))
    return output_dir / experiment["name"] / "checkpoints", "experiment.output_dir"


def run_folders(values: dict, spec_dir: FsPath, cwd: FsPath) -> RunFolders:
    """Where a run writes: experiment.output_dir from the folder vime runs in (as `vime submit`
    makes the experiment folder), model.save as the runtime finds it (from the spec's folder
    unless found only in the working one)."""
    experiment = values["experiment"]
    folder = FsPath(os.path.normpath(cwd / os.path.expanduser(experiment["output_dir"])))
    folder = folder / experiment["name"]
    save = values["model"].get("save")
    if save:
        return RunFolders(str(folder), str(_as_runtime_finds(save, spec_dir, cwd)), "model.save")
    return RunFolders(str(folder), str(folder / "checkpoints"), "experiment.output_dir")


def read_resume_checkpoint(values: dict, spec_dir: FsPath) -> ResumeCheckpoint | None:
    """The checkpoint a submit would resume from and its vime_checkpoint.json, when the
    folder is on this machine and the checkpoint has one (V708, V709 compare it)."""
    folder, key = resume_folder(values, spec_dir, FsPath.cwd())
    found = run_checkpoint.latest(folder)
    if found is None:
        return None
    saved, problem = run_checkpoint.read_record(found)
    if saved is None and problem is None:
        return None  # written before checkpoints had a record: loads as before, unchecked
    return ResumeCheckpoint(str(found), key, saved, problem)


def _derive(values: dict, origins: dict[str, Origin]) -> Derived:
    cluster, train, inference, rollout = (values[k] for k in ("cluster", "train", "inference",
                                                               "rollout"))
    world = cluster["nodes"] * cluster["gpus_per_node"]

    def derive(section: dict, key: str, path: str, value: int, why: str) -> None:
        if section[key] is None:
            section[key] = value
            origins[path] = Origin("derived", why)

    if train["colocate"]:
        derive(train, "num_gpus", "train.num_gpus", world, "colocated: every GPU")
        derive(inference, "num_gpus", "inference.num_gpus", world, "colocated: every GPU")
    else:
        if train["num_gpus"] is None and inference["num_gpus"] is not None:
            derive(train, "num_gpus", "train.num_gpus", world - inference["num_gpus"],
                   "the GPUs the rollout does not use")
        derive(train, "num_gpus", "train.num_gpus", 0, "missing: must be set when not colocated")
        derive(inference, "num_gpus", "inference.num_gpus", world - train["num_gpus"],
               f"the GPUs after the actor's {train['num_gpus']}")
    derive(rollout, "over_sampling_batch_size", "rollout.over_sampling_batch_size",
           rollout["batch_size"], "rollout.batch_size")
    derive(rollout, "overlong_buffer_len", "rollout.overlong_buffer_len",
           max(rollout["max_response_len"] // 5, 1),
           f"max_response_len ÷ 5 = {rollout['max_response_len']} ÷ 5 (DAPO's 4096 of 20480)")
    _eval_defaults(values, origins)
    samples = rollout["batch_size"] * rollout["n_samples_per_prompt"]
    derive(train, "global_batch_size", "train.global_batch_size",
           max(samples // train["steps_per_rollout"], 1),
           f"batch_size × n_samples_per_prompt ÷ steps_per_rollout = {rollout['batch_size']} × "
           f"{rollout['n_samples_per_prompt']} ÷ {train['steps_per_rollout']}")

    steps = rollout["num_rollout"] * train["steps_per_rollout"]
    derive(train["optimizer"], "lr_decay_iters", "train.optimizer.lr_decay_iters", max(steps, 1),
           f"the run's optimizer steps: num_rollout × steps_per_rollout = "
           f"{rollout['num_rollout']} × {train['steps_per_rollout']}")

    par = train["parallel"]
    actor = train["num_gpus"]
    vllm_dp = inference["data_parallel_size"]
    vllm_tp = max(inference["gpus_per_engine"] // vllm_dp, 1)
    known = gpu_name(cluster["gpu"])
    if known is not None:
        cluster["gpu"] = known
    gpu_memory = cluster["gpu_memory_gib"] or GPU_MEMORY_GIB.get(known)
    return Derived(
        world_size=world,
        layout=Layout(actor, tp=par["tp"], cp=par["cp"], pp=par["pp"], ep=par["ep"],
                      etp=par["etp"]),
        vllm_tp=vllm_tp,
        vllm_ep=vllm_tp * vllm_dp if inference["expert_parallel"] else 1,
        num_engines=max(inference["num_gpus"], 0) // inference["gpus_per_engine"],
        samples_per_rollout=samples,
        gpu_memory_gib=float(gpu_memory) if gpu_memory else None,
    )


# [[eval.datasets]] keys that default to the rollout's or the data's value
EVAL_INHERITED = {"input_key": "data.input_key", "label_key": "data.label_key",
                  "max_response_len": "rollout.max_response_len",
                  "temperature": "rollout.temperature", "top_p": "rollout.top_p",
                  "reward": "rollout.reward"}


def _eval_defaults(values: dict, origins: dict[str, Origin]) -> None:
    """Each [[eval.datasets]] table gets its schema defaults and the rollout's or data's value
    for the keys it leaves out; origins name which."""
    item = schema.node(("eval", "datasets", 0)) or {}
    filled = []
    for index, dataset in enumerate(values["eval"]["datasets"] or []):
        dataset = dict(dataset)
        for key, sub in item.get("properties", {}).items():
            path = f"eval.datasets[{index}].{key}"
            if key in dataset:
                continue
            if key in EVAL_INHERITED:
                section, name = EVAL_INHERITED[key].split(".")
                dataset[key] = values[section][name]
                origins[path] = Origin("derived", EVAL_INHERITED[key])
            elif "default" in sub:
                dataset[key] = sub["default"]
                origins[path] = Origin("default", repr(sub["default"]))
        filled.append(dataset)
    values["eval"]["datasets"] = filled


def _build(cls: type, values: dict):
    """Construct a frozen dataclass tree from a dict with the same shape."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        value = values.get(spec_key(f))
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            value = _build(hint, value or {})
        elif isinstance(value, list) and typing.get_origin(hint) is tuple \
                and dataclasses.is_dataclass(typing.get_args(hint)[0]):
            value = tuple(_build(typing.get_args(hint)[0], v) for v in value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def resolve(raw: dict, positions: Positions, spec_dir: FsPath, resume: bool = True) -> Spec:
    """resume=False: judged as a fresh start (`vime submit --fresh`), the folder a resume
    would read is not looked at."""
    values, origins = _with_defaults(raw, positions)
    # [model.arch] and [cluster.env] are open tables: keep them as written
    values["model"]["arch"] = dict(raw.get("model", {}).get("arch", {}))
    values["cluster"]["env"] = dict(raw.get("cluster", {}).get("env", {}))
    resolution = read_arch(values["model"], spec_dir)
    saved_layout = read_saved_layout(values["model"], spec_dir)
    resume_checkpoint = read_resume_checkpoint(values, spec_dir) if resume else None
    derived = _derive(values, origins)
    sections = {name: _build(cls, values[name]) for name, cls in SECTIONS.items()}
    if resolution.origin is not None:
        origins["model.arch"] = resolution.origin
    if resolution.arch is not None and "max_position_embeddings" not in {
            **(resolution.config or {}), **values["model"]["arch"]}:
        origins["model.arch.max_position_embeddings"] = Origin(
            "default", f"{resolution.arch.max_position_embeddings}: neither "
            f"{resolution.origin.describe()} nor [model.arch] gives max_position_embeddings")
    problem = (resolution.problem_key, resolution.problem) if resolution.problem else None
    invocation = (positions.spans.source.name,
                  *(arg for o in sorted(positions.overrides.values(), key=lambda o: o.index)
                    for arg in ("--set", o.argument)))
    model_config = (ModelConfig(resolution.config, resolution.origin)
                    if resolution.config is not None else None)
    return Spec(**sections, arch=resolution.arch, derived=derived, arch_problem=problem,
                model_config=model_config,
                hf_folder=read_hf_folder(values["model"], spec_dir, FsPath.cwd()),
                prompt_files=read_prompt_files(values, spec_dir, FsPath.cwd()),
                run_folders=run_folders(values, spec_dir, FsPath.cwd()),
                spec_dir=str(spec_dir),
                torch_dist_layout=saved_layout, resume_checkpoint=resume_checkpoint,
                invocation=invocation, origins=origins)


__all__ = ["resolve", "read_arch", "read_saved_layout", "ArchResolution", "GPU_MEMORY_GIB", "gpu_name",
           "LAYOUT_FILE", "LAYOUT_SIZES", "Path"]
