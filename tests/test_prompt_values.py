"""Prompt files at plan time beyond their keys: an eval dataset's file is read like
data.prompt_data (V731 for its keys), and a file with no records or a prompt that is null, a
number or chat messages without data.apply_chat_template is V733, at the file's key and line."""

from __future__ import annotations

import json

from specsupport import ROOT, run_text

TINY = ROOT / "specs" / "tiny_cpu.toml"
GOOD = json.dumps({"prompt": "What is 1 + 1?", "label": "2"})


def _plan(tmp_path, train: list[str], held_out: list[str] | None = None, *sets: str):
    (tmp_path / "train.jsonl").write_text("".join(line + "\n" for line in train))
    (tmp_path / "held.jsonl").write_text("".join(line + "\n" for line in held_out or [GOOD]))
    text = TINY.read_text().replace('prompt_data = "data/tiny_arithmetic.jsonl"  # relative',
                                    'prompt_data = "train.jsonl"  # relative', 1)
    text = text.replace('prompt_data = "data/tiny_arithmetic.jsonl"', 'prompt_data = "held.jsonl"')
    return run_text(text, list(sets), spec_dir=tmp_path)


def _found(result, code):
    return [d for d in result.diagnostics if d.code == code]


def test_an_eval_file_with_other_keys_is_v731_at_the_datasets_keys(tmp_path):
    record = json.dumps({"problem": "1+1?", "answer": "2"})
    result = _plan(tmp_path, [GOOD], [record])
    found = {d.key: d for d in _found(result, "V731")}
    assert set(found) == {"eval.datasets[0].input_key", "eval.datasets[0].label_key"}
    assert found["eval.datasets[0].input_key"].message == (
        f"eval.datasets[0].input_key = 'prompt', but record 1 of eval.datasets[0].prompt_data "
        f"({tmp_path / 'held.jsonl'}:1) has no such key")
    assert found["eval.datasets[0].input_key"].help.startswith(
        'did you mean eval.datasets[0].input_key = "problem"?')
    assert found["eval.datasets[0].input_key"].location.line == 95  # its [[eval.datasets]]
    assert not result.ok


def test_an_eval_file_that_is_not_json_lines_is_pointed_at(tmp_path):
    [diag] = _found(_plan(tmp_path, [GOOD], ["prompt,label"]), "V731")
    assert diag.key == "eval.datasets[0].prompt_data" and diag.location.line == 97
    assert f"{tmp_path / 'held.jsonl'}:1: not JSON: " in diag.message


def test_files_without_records_are_v733(tmp_path):
    for train, held, key, line in (([], None, "data.prompt_data", 47),
                                   ([GOOD], ["", "  "], "eval.datasets[0].prompt_data", 97)):
        [diag] = _found(_plan(tmp_path, train, held), "V733")
        assert diag.key == key and diag.location.line == line
        assert diag.severity == "error" and "has no records" in diag.message


def test_a_null_or_numeric_prompt_is_v733_with_its_line(tmp_path):
    for value, said in ((None, "null"), (7, "7"), ({"text": "hi"}, '{"text": "hi"}')):
        record = json.dumps({"prompt": value, "label": "2"})
        [diag] = _found(_plan(tmp_path, [GOOD, GOOD, record]), "V733")
        assert diag.key == "data.prompt_data"
        assert diag.message == (
            f"{tmp_path / 'train.jsonl'}:3: the prompt (data.input_key 'prompt') is {said}, "
            "not a string or a list of chat messages")
    record = json.dumps({"prompt": None, "label": "2"})
    [diag] = _found(_plan(tmp_path, [GOOD], [GOOD, record]), "V733")
    assert diag.key == "eval.datasets[0].prompt_data" and ":2: the prompt" in diag.message


def test_chat_messages_need_the_chat_template(tmp_path):
    record = json.dumps({"prompt": [{"role": "user", "content": "1+1?"}], "label": "2"})
    [diag] = _found(_plan(tmp_path, [record], None, "data.apply_chat_template=false"), "V733")
    assert "data.apply_chat_template = true" in diag.help
    assert not _found(_plan(tmp_path, [record], None, "data.apply_chat_template=true"), "V733")
    bad = json.dumps({"prompt": [{"role": "user"}], "label": "2"})
    [diag] = _found(_plan(tmp_path, [bad], None, "data.apply_chat_template=true"), "V733")
    assert "message 1 has no 'content'" in diag.message


def test_good_files_are_clean(tmp_path):
    result = _plan(tmp_path, [GOOD] * 3, [GOOD])
    assert not _found(result, "V731") and not _found(result, "V733")
