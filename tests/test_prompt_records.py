"""V731: a readable prompt file whose first records lack data.input_key / data.label_key, or
are not JSON objects, is caught at plan time, where the driver found it after Ray's start-up."""

from __future__ import annotations

import json

from specsupport import ROOT, run_text

from vime.resolve import PROMPT_SAMPLE_RECORDS

TINY = ROOT / "specs" / "tiny_cpu.toml"


def _plan(tmp_path, lines: list[str], *sets: str):
    (tmp_path / "prompts.jsonl").write_text("".join(line + "\n" for line in lines))
    return run_text(TINY.read_text(), ['data.prompt_data="prompts.jsonl"', *sets],
                    spec_dir=tmp_path)


def _v731(result):
    return [d for d in result.diagnostics if d.code == "V731"]


def test_deepscaler_names_get_the_keys_the_records_have(tmp_path):
    record = json.dumps({"problem": "1+1?", "answer": "2", "id": 7})
    result = _plan(tmp_path, [record] * 3)
    found = {d.key: d for d in _v731(result)}
    assert set(found) == {"data.input_key", "data.label_key"} and not result.ok
    where = f"{tmp_path / 'prompts.jsonl'}:1"
    assert found["data.input_key"].message == (
        f"data.input_key = 'prompt', but record 1 of data.prompt_data ({where}) has no such key")
    assert found["data.input_key"].help == ('did you mean data.input_key = "problem"? the '
                                            "record's keys are problem, answer, id")
    assert found["data.label_key"].help.startswith('did you mean data.label_key = "answer"?')
    fixed = _plan(tmp_path, [record] * 3, 'data.input_key="problem"', 'data.label_key="answer"')
    assert not _v731(fixed) and fixed.ok


def test_a_record_further_down_is_found_within_the_records_read(tmp_path):
    good = json.dumps({"prompt": "1+1?", "label": "2"})
    bad = json.dumps({"prompt": "2+2?"})
    [diag] = _v731(_plan(tmp_path, [good, "", good, bad]))
    assert diag.key == "data.label_key" and "prompts.jsonl:4" in diag.message
    assert "record 3 of data.prompt_data" in diag.message
    # beyond the first records nothing is read: the job's own reading says the rest
    late = [good] * PROMPT_SAMPLE_RECORDS + [bad]
    assert not _v731(_plan(tmp_path, late))


def test_a_line_that_is_not_a_json_object_is_pointed_at(tmp_path):
    [diag] = _v731(_plan(tmp_path, [json.dumps({"prompt": "a", "label": "b"}), "prompt,label"]))
    assert diag.key == "data.prompt_data"
    assert f"{tmp_path / 'prompts.jsonl'}:2: not JSON: " in diag.message
    [diag] = _v731(_plan(tmp_path, ['["a", "b"]']))
    assert diag.message.endswith(":1: not a JSON object; the driver reads one JSON object per line")


def test_a_file_that_is_not_here_is_left_to_the_job(tmp_path):
    result = run_text(TINY.read_text(), [f'data.prompt_data="{tmp_path}/absent.jsonl"'],
                      spec_dir=TINY.parent)
    assert not _v731(result) and result.spec.prompt_sample is None
