"""V734-V737: what the job reads from the prompt files and the checkpoint's tokenizer files,
read where vime runs when they are there: the records' metadata keys, labels and prompt
lengths, and the chat template that data.apply_chat_template needs. A file on the cluster
only is left to the job."""

from __future__ import annotations

import functools
import json
import re
import unicodedata
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


# the names data sets give the answer inside a nested label (verl's reward_model.ground_truth)
_ANSWER_NAMES = ("ground_truth", "answer", "label", "solution", "target")


def label_problem(value) -> str | None:
    """Why a built-in reward cannot score against this label (it compares str(label) with the
    response's answer, runtime/rl/rewards.py answers_match), or None."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return "empty"
    if isinstance(value, dict | list):
        return "nested"
    return None


def _nested_help(records: list[dict], name: str) -> str:
    """The fix for labels that are objects: the answer's name inside them, where usual."""
    inner = next((r[name] for r in records if isinstance(r.get(name), dict)), None)
    found = [k for k in _ANSWER_NAMES if isinstance(inner, dict) and k in inner]
    if found:
        return (f"the answer is {name}.{found[0]}; vime reads a top-level field: write it as "
                f"one (`jq -c '.answer = .{name}.{found[0]}'`) and set the label key to it")
    return "point the label key at a field that holds the answer as text or a number"


def _reward_of(spec: Spec, file_key: str) -> tuple[str, str, str]:
    """(reward, its key, the label key's path) of the file named by file_key."""
    if file_key == "data.prompt_data":
        return spec.rollout.reward, "rollout.reward", "data.label_key"
    table = file_key.rsplit(".", 1)[0]
    dataset = spec.eval.datasets[int(table.split("[", 1)[1].split("]", 1)[0])]
    return dataset.reward, f"{table}.reward", f"{table}.label_key"


@rule("V736", "labels-for-the-reward", enforced_by="vime")
def labels_for_the_reward(spec: Spec):
    """Records of a prompt file have an empty or nested label, which a built-in reward cannot score.

    The built-in rewards (deepscaler, dapo, math; runtime/rl/rewards.py) compare the
    response's final answer with the record's label (data.label_key, or the evaluation
    dataset's) as text: a null or empty label matches no answer, and neither does a label
    that is a JSON object or list (verl's data sets keep the answer one level down, in
    reward_model.ground_truth, and the reward would compare the object's text), so every
    sample of that prompt gets the same reward, every GRPO advantage of its group is 0, and
    the prompt teaches nothing (in an evaluation dataset it scores as a failure). A file
    whose sampled labels are all unusable makes a run that learns nothing; users of the
    other frameworks find it hours in, from a flat reward curve: the raw gsm8k parquet has
    no ground truth where verl's reward reads it
    (https://github.com/verl-project/verl/issues/758), and a reward that could not find its
    answer field scored every sample 0 (https://github.com/AI-Hypercomputer/maxtext/pull/4140,
    "mean_reward=0.0"). When the file is readable where vime runs, vime reads its first 20
    records: every label unusable is an error, some a warning with the share. A custom
    reward (module:function or a server) may read labels of any shape and is not checked.
    Fix: point the label key at the record's answer (data.label_key, or the [[eval.datasets]]
    table's label_key), lifting a nested answer to a field of its own (the help line gives
    the jq command), or fill in the labels."""
    for found in spec.prompt_files:
        reward, reward_key, label_key = _reward_of(spec, found.key)
        if reward not in BUILTIN_REWARDS:
            continue
        sampled = records(found)
        name = spec.data.label_key if label_key == "data.label_key" else \
            spec.eval.datasets[int(label_key.split("[", 1)[1].split("]", 1)[0])].label_key
        problems = [(line, record, label_problem(record.get(name))) for line, record in sampled]
        bad = [(line, record, problem) for line, record, problem in problems if problem]
        if not bad:
            continue
        nested = [record for _, record, problem in bad if problem == "nested"]
        what = ("a JSON object or list, not an answer" if len(nested) == len(bad)
                else "empty or null" if not nested else "empty, null or not an answer")
        share = f"{len(bad)} of the first {len(sampled)} records ({found.path}:{bad[0][0]} first)"
        fix = _nested_help(nested, name) if nested else \
            "point the label key at the field that holds the answer, or fill in the labels"
        if len(bad) == len(sampled):
            yield Finding(label_key, f"{label_key} = {name!r} is {what} in {share}: the "
                          f"{reward} reward scores every sample the same, every advantage is 0 "
                          "and the run learns nothing", related=(found.key, reward_key),
                          help=fix)
        else:
            yield Finding(label_key, f"{label_key} = {name!r} is {what} in {share}: the "
                          f"{reward} reward cannot score those prompts, whose groups teach "
                          "nothing", related=(found.key, reward_key), severity="warning",
                          help=fix if nested else "fill in those labels or drop the records")


# special tokens written into a prompt (<|im_start|>, DeepSeek's <｜User｜>) are one token each
_SPECIAL = re.compile(r"<\|[^|>]*\|>|<｜[^｜>]*｜>")
# maximal runs of letters (any script) and of digits
_WORDS = re.compile(r"[^\W\d_]+|\d+")


def fewest_tokens(text: str) -> int:
    """A lower bound on the tokens of `text` under the byte-level BPE tokenizers of the models
    vime runs (Qwen3, DeepSeek-V3, GLM-4.5): their pre-tokenizer regex splits the text into
    pieces before BPE merges within a piece, and every run of letters and every run of digits
    starts a piece of its own (a run of digits may make several: Qwen splits each digit), so a
    text has at least as many tokens as such runs. Combining marks are dropped first (DeepSeek
    keeps them inside a word's piece), special tokens counted once. A BPE of 20,000 tokens
    trained on this repository's docs/*.md makes 1.55 tokens per run of them
    (tests/test_foresight.py checks the bound against such tokenizers): the bound is for
    certainty, not an estimate."""
    text = _SPECIAL.sub(" x ", text)
    text = "".join(ch for ch in text if not unicodedata.category(ch).startswith("M"))
    return len(_WORDS.findall(text))


def _prompt_text(value) -> str:
    """A record's prompt as text: a string, or the contents of chat messages."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for message in value:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):  # [{"type": "text", "text": ...}]
                parts += [p["text"] for p in content
                          if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return " ".join(parts)
    return ""


def _input_key(spec: Spec, file_key: str) -> tuple[str, str]:
    """(the input key's path, the record's name for the prompt) of the file named by file_key."""
    if file_key == "data.prompt_data":
        return "data.input_key", spec.data.input_key
    table = file_key.rsplit(".", 1)[0]
    dataset = spec.eval.datasets[int(table.split("[", 1)[1].split("]", 1)[0])]
    return f"{table}.input_key", dataset.input_key


@rule("V737", "prompts-fit-max-prompt-len", severity="warning", enforced_by="vime")
def prompts_fit_max_prompt_len(spec: Spec):
    """Prompts longer than rollout.max_prompt_len tokens, which the driver drops.

    The driver tokenizes every record's prompt when the job starts (runtime/rl/data.py,
    read_prompts) and drops the ones longer than rollout.max_prompt_len tokens, as slime
    does; a file with none left stops the job after the queue wait with "no prompt of at most
    rollout.max_prompt_len = 256 tokens (25 longer ones dropped)", and a large share dropped
    trains on what is left of the data set without saying so at plan time. verl stops on an
    overlong prompt by default (data.truncation = 'error': "users should increase the
    max_prompt_length", https://github.com/verl-project/verl/pull/506) and slime filters by
    token length (https://github.com/THUDM/slime/pull/404). vime loads no tokenizer at plan
    time (transformers and tokenizers belong to the runtime), so it counts a lower bound of
    each prompt's tokens: the runs of letters and of digits, each of which the byte-level BPE
    tokenizers of Qwen3, DeepSeek-V3 and GLM-4.5 make into one token or more (their
    pre-tokenizer splits the text there before merging; vime.check.data_files.fewest_tokens).
    The chat template adds tokens on top. Over the first 20 records of each prompt file
    readable here: when that is the whole file and every prompt is over, the driver stops
    for certain (an error); otherwise the share over is a warning.
    Fix: a larger rollout.max_prompt_len (the help line gives one above the longest prompt's
    bound, with room for the tokenizer's surplus and the template), or a prompt file of
    shorter prompts."""
    limit = spec.rollout.max_prompt_len
    for found in spec.prompt_files:
        sampled = records(found)
        if not sampled:
            continue
        input_key, name = _input_key(spec, found.key)
        bounds = [(line, fewest_tokens(_prompt_text(record.get(name)))) for line, record in sampled]
        over = [(line, bound) for line, bound in bounds if bound > limit]
        if not over:
            continue
        longest = max(bound for _, bound in bounds)
        suggested = -(-2 * longest // 256) * 256  # twice the bound, a multiple of 256
        whole_file = len(sampled) < PROMPT_SAMPLE_RECORDS
        line, bound = over[0]
        share = (f"{len(over)} of the {'' if whole_file else 'first '}{len(sampled)} records "
                 f"of {found.key}")
        text = (f"{share} have more than rollout.max_prompt_len = {limit} tokens (at least "
                f"{bound} at {found.path}:{line}): the driver drops them")
        if whole_file and len(over) == len(sampled):
            yield Finding("rollout.max_prompt_len", text + ", and with none left stops at start",
                          help=f"rollout.max_prompt_len = {suggested}", related=(found.key,),
                          severity="error")
        else:
            yield Finding("rollout.max_prompt_len", text,
                          help=f"rollout.max_prompt_len = {suggested} keeps them",
                          related=(found.key,))
