"""V730-V733: model.hf_checkpoint and the prompt files on the machine vime runs on.

resolve looks the folder up as the runtime will (Spec.hf_folder); the rule reports what plan
and compile can know, and `vime submit --local` makes a missing folder an error (at_submit):
a job run here reads this machine's folder, a Slurm job its nodes'."""

from __future__ import annotations

import difflib
import re

from vime.check.registry import Finding, key_path, rule
from vime.diagnostics import Diagnostic
from vime.resolve.spec import Spec

# "Qwen/Qwen3-30B-A3B": a Hugging Face model id, which reads as a relative path
_MODEL_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
KEY = "model.hf_checkpoint"


def _download_help(value: str) -> str:
    if _MODEL_ID.fullmatch(value):
        return (f"the runtime loads the tokenizer and weights from a folder, not a model id: "
                f"`huggingface-cli download {value} --local-dir /shared/models/"
                f"{value.split('/')[1]}`, then {KEY} = \"/shared/models/{value.split('/')[1]}\"")
    return (f"point {KEY} at the folder with config.json, tokenizer.json and the safetensors "
            "(an absolute path on a file system the nodes mount)")


@rule("V730", "hf-checkpoint-found", severity="warning", enforced_by="vime")
def hf_checkpoint_found(spec: Spec):
    """model.hf_checkpoint names a folder that is not where the runtime will look for it.

    The driver loads the tokenizer from model.hf_checkpoint when the job starts, after the
    queue wait and Ray's start-up (runtime/node/driver.py: "model.hf_checkpoint = '...' has no
    tokenizer (tokenizer.json)"), and vLLM and Megatron load the weights from it. A relative
    path is read from the spec's folder, else from the folder vime runs in (as
    runtime/core/slices.py reads it); a Hugging Face model id such as "Qwen/Qwen3-8B" reads as
    such a path, and the runtime does not download it. Not checked with model.random_init,
    which needs no weights.
    `vime plan`, `compile` and `submit` warn about a relative path found in neither folder,
    and about an absolute path that is not on this machine (the job's nodes must have it: a
    cluster's file system may not be mounted where vime runs, hence a warning). With
    `vime submit --local`, where the job reads this machine's files, a folder that is missing
    or has no tokenizer is an error.
    Fix: download the checkpoint into a folder (`huggingface-cli download ORG/NAME
    --local-dir FOLDER`) and set model.hf_checkpoint to that folder's absolute path."""
    found = spec.hf_folder
    if found is None or spec.model.random_init or found.exists:
        return
    value = spec.model.hf_checkpoint
    if found.relative:
        yield Finding(KEY, f"{KEY} = {value!r} is a folder neither beside the spec nor in the "
                      "folder vime runs in, where the runtime reads a relative path from",
                      help=_download_help(value))
    else:
        yield Finding(KEY, f"{KEY} = {value!r} is not on this machine: the job's nodes must "
                      "have it, or the driver stops after the queue wait",
                      help=f"check it on a node (`srun -N1 ls {value}`), or "
                      + _download_help(value))


def at_submit(spec: Spec, launcher: str, default_driver: bool) -> list[Diagnostic]:
    """V730 for `vime submit --local` (with the default driver, which loads the tokenizer):
    a folder missing here or without a tokenizer is an error. To Slurm or a Ray cluster the
    rule's warnings stand."""
    found = spec.hf_folder
    if found is None or spec.model.random_init or not default_driver or launcher != "local":
        return []
    value = spec.model.hf_checkpoint
    if not found.exists:
        problem = f"is not a folder on this machine ({found.path})"
    elif not found.tokenizer:
        problem = (f"has no tokenizer.json or tokenizer_config.json ({found.path}): the "
                   "driver stops at start")
    else:
        return []
    return [Diagnostic("error", "V730", tuple(KEY.split(".")),
                       f"{KEY} = {value!r} {problem}; `vime submit --local` runs the job "
                       "on this machine", spec.origin(KEY).location,
                       help=_download_help(value))]


@rule("V732", "prompt-file-found", severity="warning", enforced_by="vime")
def prompt_file_found(spec: Spec):
    """data.prompt_data or an [[eval.datasets]] table's prompt_data names a file that is not
    where the driver will look for it.

    The driver reads the prompt files when the job starts: the head node's check before Ray
    (runtime/node/preflight.py) stops the job after the queue wait with "data.prompt_data:
    prompts.jsonl: no such file (looked in ... and ...)". A relative path is read from the
    spec's folder, else from the folder vime runs in (runtime/core/slices.py, _path).
    `vime plan`, `compile` and `submit` warn about a relative path found in neither folder,
    and about an absolute path that is not on this machine (the job's nodes must have it: a
    cluster's file system may not be mounted where vime runs, hence a warning). With
    `vime submit --local`, where the job reads this machine's files, a missing file is an
    error.
    Fix: point the key at the JSON-lines file, by an absolute path on a file system the
    nodes mount or by a path relative to the spec's folder."""
    for found in spec.prompt_files:
        if found.exists:
            continue
        value = _written(spec, found.key)
        if found.relative:
            yield Finding(found.key, f"{found.key} = {value!r} is a file neither beside the "
                          "spec nor in the folder vime runs in, where the driver reads a "
                          "relative path from",
                          help=f"the spec's folder would hold it as {found.path}; or give "
                          "the file's absolute path")
        else:
            yield Finding(found.key, f"{found.key} = {value!r} is not on this machine: the "
                          "job's nodes must have it, or the driver stops after the queue wait",
                          help=f"check it on a node (`srun -N1 ls {value}`), or point "
                          f"{found.key} at the JSON-lines file on a file system the nodes "
                          "mount")


def _written(spec: Spec, key: str) -> str:
    """A prompt file key's value as written in the spec."""
    if key == "data.prompt_data":
        return spec.data.prompt_data
    index = int(key.split("[", 1)[1].split("]", 1)[0])
    return spec.eval.datasets[index].prompt_data


def prompt_files_at_submit(spec: Spec, launcher: str, default_driver: bool) -> list[Diagnostic]:
    """V732 for `vime submit --local` (with the default driver, which reads the prompts): a
    prompt file missing here is an error. To Slurm or a Ray cluster the rule's warnings
    stand."""
    if launcher != "local" or not default_driver:
        return []
    return [Diagnostic("error", "V732", key_path(found.key),
                       f"{found.key} = {_written(spec, found.key)!r} is not a file on this "
                       f"machine ({found.path}); `vime submit --local` runs the job on this "
                       "machine", spec.origin(found.key).location,
                       help=f"point {found.key} at the JSON-lines file, by an absolute path or "
                       "one relative to the spec's folder")
            for found in spec.prompt_files if not found.exists]


# the names datasets give the prompt and the answer, most usual first
_USUAL_NAMES = {
    "input_key": ("prompt", "problem", "question", "query", "input", "instruction"),
    "label_key": ("label", "answer", "solution", "ground_truth", "reference", "target"),
}


@rule("V731", "prompt-records-have-keys", enforced_by="vime")
def prompt_records_have_keys(spec: Spec):
    """The first records of a prompt file (data.prompt_data, an [[eval.datasets]] table's
    prompt_data) lack its input or label key, or are not JSON objects.

    The driver reads every record of the prompt file when the job starts, after the queue wait
    and Ray's start-up (runtime/rl/data.py), and stops at the first one without the prompt or
    the label: "prompts.jsonl:1: no key 'prompt' (data.input_key / data.label_key); it has
    ['label', 'problem']"; an evaluation dataset's file is read the same way once the actors
    are up, with its own input_key and label_key (data.input_key and data.label_key unless
    the table sets them). Datasets name these columns differently (DAPO-Math-17k "prompt" and
    "label", DeepScaleR "problem" and "answer"). When a file is readable where vime runs,
    vime reads its first 20 records (one JSON object per line) and checks each has both keys;
    a file on the cluster only is checked by the job itself before Ray starts.
    Fix: set the input and label keys to the record's names (the help line lists them and the
    closest), or point the prompt_data key at a file in that format."""
    for found in spec.prompt_files:
        yield from _records_have_keys(spec, found)


def _key_names(spec: Spec, file_key: str) -> dict[str, str]:
    """The input and label keys of a prompt file: key path -> the record's name they give."""
    if file_key == "data.prompt_data":
        return {"data.input_key": spec.data.input_key, "data.label_key": spec.data.label_key}
    table = file_key.rsplit(".", 1)[0]
    dataset = spec.eval.datasets[int(table.split("[", 1)[1].split("]", 1)[0])]
    return {f"{table}.input_key": dataset.input_key, f"{table}.label_key": dataset.label_key}


def _records_have_keys(spec: Spec, found):
    sample = found.sample
    if sample is None or (sample.problem is None and not sample.missing):
        return
    where = f"{sample.path}:{sample.line}"
    if sample.problem:
        yield Finding(found.key, f"{where}: {sample.problem}; the driver reads one JSON "
                      "object per line", help="write the prompt file as JSON lines: "
                      '{"prompt": "...", "label": "..."} on each line')
        return
    names = _key_names(spec, found.key)
    for key, value in names.items():
        if value not in sample.missing:
            continue
        others = [k for k in sample.keys if k not in names.values()]
        usual = [k for k in _USUAL_NAMES[key.rsplit(".", 1)[1]] if k in others]
        close = usual or difflib.get_close_matches(value, others, n=1, cutoff=0.6)
        keys = ", ".join(sample.keys) or "none"
        fix = (f'did you mean {key} = "{close[0]}"? the record\'s keys are {keys}' if close
               else f"the record's keys are {keys}")
        yield Finding(key, f"{key} = {value!r}, but record {sample.records} of "
                      f"{found.key} ({where}) has no such key", help=fix,
                      related=(found.key,))


@rule("V733", "prompt-records-usable", enforced_by="vime")
def prompt_records_usable(spec: Spec):
    """A prompt file (data.prompt_data, an [[eval.datasets]] table's prompt_data) has no
    records, or a record's prompt is not one the driver can render.

    The driver renders each record's prompt when the job starts (runtime/rl/data.py, render),
    after the queue wait, Ray's start-up and the actors' (an evaluation file after the
    engines'): a prompt is a string, or with data.apply_chat_template a list of
    {"role": ..., "content": ...} chat messages. A null, a number or an object stops the job
    there ("a prompt given as chat messages needs data.apply_chat_template = true", or a
    TypeError of the tokenizer's), and a file with no records stops it with "no prompt of at
    most rollout.max_prompt_len tokens". When the file is readable where vime runs, vime
    checks its first 20 records.
    Fix: write each record's prompt as a string (or as chat messages with
    data.apply_chat_template = true), and point the key at a file with records."""
    for found in spec.prompt_files:
        sample = found.sample
        if sample is None or sample.problem or sample.missing:
            continue  # unreadable here, or V731's
        if sample.records == 0:
            yield Finding(found.key, f"{found.key}: {sample.path} has no records (no line "
                          "holds a JSON object); the driver stops at start with \"no prompt "
                          "of at most rollout.max_prompt_len tokens\"",
                          help="point it at the JSON-lines file of the data set: "
                          '{"prompt": "...", "label": "..."} on each line')
        elif sample.prompt_problem:
            input_key, name = next(iter(_key_names(spec, found.key).items()))
            chat = "apply_chat_template" in sample.prompt_problem
            yield Finding(found.key, f"{sample.path}:{sample.prompt_line}: the prompt "
                          f"({input_key} {name!r}) is {sample.prompt_problem}",
                          help="set data.apply_chat_template = true (the tokenizer's chat "
                          "template renders the messages), or write the prompt as a string"
                          if chat else "write each record's prompt as a string (or as a list "
                          'of {"role": ..., "content": ...} messages with '
                          "data.apply_chat_template = true)",
                          related=(input_key,))
