"""V734-V736: what the job reads from the prompt files and the checkpoint's tokenizer files,
read where vime runs when they are there: the records' metadata keys and labels, and the chat
template that data.apply_chat_template needs. A file on the cluster only is left to the job."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from vime.check.registry import Finding, rule
from vime.resolve import PROMPT_SAMPLE_RECORDS
from vime.resolve.spec import PromptFile, Spec
from vime.rewards import BUILTIN_REWARDS


@functools.lru_cache(maxsize=16)
def _first_records(path: str, mtime_ns: int) -> tuple[tuple[int, dict], ...]:
    """(line, record) of a JSON-lines file's first PROMPT_SAMPLE_RECORDS objects; stops at the
    first line that is not a JSON object (V731 reports it)."""
    found = []
    try:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    break
                if not isinstance(row, dict):
                    break
                found.append((number, row))
                if len(found) == PROMPT_SAMPLE_RECORDS:
                    break
    except (OSError, UnicodeDecodeError):
        return ()
    return tuple(found)


def records(found: PromptFile) -> tuple[tuple[int, dict], ...]:
    """The first records of a prompt file readable here whose sample V731 and V733 accept."""
    sample = found.sample
    if sample is None or sample.problem or sample.missing or not sample.records:
        return ()
    try:
        mtime = Path(found.path).stat().st_mtime_ns
    except OSError:
        return ()
    return _first_records(found.path, mtime)


@rule("V734", "metadata-keys-in-records", enforced_by="vime")
def metadata_keys_in_records(spec: Spec):
    """data.metadata_keys names a key that the records of data.prompt_data lack.

    The driver reads every record of the prompt file when the job starts (runtime/rl/data.py,
    read_prompts), after the queue wait and Ray's start-up, and hands each record's
    data.metadata_keys to the rollout function (ctx.metadata) and to the reward
    (metadata=); a record without one of them stops the job there: "prompts.jsonl:1: no key
    'tools' (data.input_key / data.label_key / data.metadata_keys); it has ['label',
    'prompt']". A rollout function that reads ctx.metadata["tools"] is written against one
    data set's columns, and another data set (or the same one exported again) names them
    differently; verl users meet it as "KeyError: 'reward_model'" when the reward reads a
    field the raw data set lacks (https://github.com/verl-project/verl/issues/758), and an
    evaluation reward that read a missing 'question' key zeroed every score
    (https://github.com/AI-Hypercomputer/maxtext/pull/4140: "KeyError('question')", the
    eval's mean_reward 0.0). vime reads the record keys the driver will ask for; the help
    line names the ones the record has. When the file is readable where vime runs, vime
    reads its first 20 records and checks each has every metadata key.
    Fix: set data.metadata_keys to the record's names (the help line lists them), or add
    the key to every record."""
    wanted = spec.data.metadata_keys or ()
    if not wanted or not spec.prompt_files:
        return
    found = spec.prompt_files[0]
    for line, record in records(found):
        missing = [k for k in wanted if k not in record]
        if missing:
            keys = ", ".join(record) or "none"
            yield Finding("data.metadata_keys",
                          f"data.metadata_keys names {', '.join(map(repr, missing))}, but the "
                          f"record at {found.path}:{line} has no such key: the driver stops "
                          "at start", help=f"the record's keys are {keys}",
                          related=("data.prompt_data",))
            return


# the files transformers reads a chat template from (tokenizer_config.json's "chat_template",
# or beside it: transformers 5 writes chat_template.jinja; processors chat_template.json)
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def _has_template(folder: Path) -> bool | None:
    """Whether a tokenizer folder has a chat template; None when it cannot be told here
    (no tokenizer_config.json readable)."""
    if any((folder / name).is_file() for name in TEMPLATE_FILES) or \
            (folder / "additional_chat_templates").is_dir():
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return isinstance(config, dict) and bool(config.get("chat_template"))


@rule("V735", "chat-template-found", enforced_by="transformers")
def chat_template_found(spec: Spec):
    """data.apply_chat_template = true, but the checkpoint's tokenizer has no chat template.

    With data.apply_chat_template the driver renders every prompt through the tokenizer's
    chat template (runtime/rl/data.py, render: tokenizer.apply_chat_template) when the job
    starts. A base model's tokenizer often has none (Qwen2.5-1.5B, Llama-2 base,
    Qwen3-30B-A3B-Base has one; many fine-tunes lose it when saved by an old transformers),
    and transformers stops the driver after the queue wait with "ValueError: Cannot use chat
    template functions because tokenizer.chat_template is not set and no template argument
    was passed!" (https://github.com/unslothai/unsloth/issues/2096,
    https://github.com/huggingface/open-r1/issues/85). transformers reads the template from
    tokenizer_config.json's "chat_template" or from chat_template.jinja beside it; vime
    looks for both when model.hf_checkpoint is a folder on this machine.
    Fix: data.apply_chat_template = false (each prompt is then tokenized as it is written:
    write the prompt format into the records), or copy the chat template of the model's
    instruct release into the folder (its chat_template.jinja, or tokenizer_config.json's
    "chat_template")."""
    folder = spec.hf_folder
    if not spec.data.apply_chat_template or folder is None or not folder.exists \
            or not folder.tokenizer:
        return
    if _has_template(Path(folder.path)) is False:
        yield Finding("data.apply_chat_template",
                      f"data.apply_chat_template = true, but the tokenizer in {folder.path} has "
                      "no chat template (no \"chat_template\" in tokenizer_config.json, no "
                      "chat_template.jinja): transformers stops the driver at the first prompt",
                      help="data.apply_chat_template = false and the prompt format written "
                      "into the records, or the instruct release's chat_template.jinja copied "
                      "into the folder", related=("model.hf_checkpoint",))


def _label_missing(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _reward_of(spec: Spec, file_key: str) -> tuple[str, str, str]:
    """(reward, its key, the label key's path) of the file named by file_key."""
    if file_key == "data.prompt_data":
        return spec.rollout.reward, "rollout.reward", "data.label_key"
    table = file_key.rsplit(".", 1)[0]
    dataset = spec.eval.datasets[int(table.split("[", 1)[1].split("]", 1)[0])]
    return dataset.reward, f"{table}.reward", f"{table}.label_key"


@rule("V736", "labels-for-the-reward", enforced_by="vime")
def labels_for_the_reward(spec: Spec):
    """Records of a prompt file have an empty label, and a built-in reward scores them against it.

    The built-in rewards (deepscaler, dapo, math; runtime/rl/rewards.py) compare the
    response's final answer with the record's label (data.label_key, or the evaluation
    dataset's): a null or empty label matches no answer, so every sample of that prompt gets
    the same reward, every GRPO advantage of its group is 0, and the prompt teaches nothing
    (in an evaluation dataset it scores as a failure). A file whose sampled labels are all
    empty makes a run that learns nothing and reports a reward of 0 from the first rollout;
    users of the other frameworks find it hours in, from a flat reward curve: the raw gsm8k
    parquet has no ground truth where verl's reward reads it
    (https://github.com/verl-project/verl/issues/758), and a reward that could not find its
    answer field scored every sample 0 (https://github.com/AI-Hypercomputer/maxtext/pull/4140,
    "mean_reward=0.0"). When the file is readable where vime runs, vime reads its first 20 records: every label empty is an error, some a
    warning with the share. A custom reward (module:function or a server) may not need
    labels and is not checked.
    Fix: point the label key at the record's answer (data.label_key, or the [[eval.datasets]]
    table's label_key), or fill in the labels."""
    for found in spec.prompt_files:
        reward, reward_key, label_key = _reward_of(spec, found.key)
        if reward not in BUILTIN_REWARDS:
            continue
        sampled = records(found)
        name = spec.data.label_key if label_key == "data.label_key" else \
            spec.eval.datasets[int(label_key.split("[", 1)[1].split("]", 1)[0])].label_key
        empty = [line for line, record in sampled if _label_missing(record.get(name))]
        if not empty:
            continue
        share = f"{len(empty)} of the first {len(sampled)} records ({found.path}:{empty[0]} first)"
        if len(empty) == len(sampled):
            yield Finding(label_key, f"{label_key} = {name!r} is empty or null in {share}: "
                          f"the {reward} reward scores every sample 0, every advantage is 0 "
                          "and the run learns nothing", related=(found.key, reward_key),
                          help="point the label key at the field that holds the answer, or "
                          "fill in the labels")
        else:
            yield Finding(label_key, f"{label_key} = {name!r} is empty or null in {share}: "
                          f"the {reward} reward cannot score those prompts, whose groups "
                          "teach nothing", related=(found.key, reward_key), severity="warning",
                          help="fill in those labels or drop the records")
