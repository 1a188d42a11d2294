"""`vime import` of upstream's evaluation, dynamic-sampling and offload flags: [eval] with one
[[eval.datasets]] table per --eval-prompt-data pair, rollout.dynamic_sampling from slime's
filter, train.offload from --offload*; the written specs plan."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

from specsupport import ROOT

from vime.cli import main
from vime.importer import import_argv
from vime.importer.toml_out import render

SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"
NONZERO_STD = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"


def _import(capsys, script: Path, out: Path) -> tuple[int, str]:
    code = main(["import", str(script), "-o", str(out)])
    return code, capsys.readouterr().err


def _plan(capsys, spec: Path) -> tuple[dict, str]:
    code = main(["plan", str(spec), "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["ok"], [d["message"] for d in plan["diagnostics"]]
    main(["plan", str(spec)])
    return plan, capsys.readouterr().out


def _codes(result) -> dict[str, list[tuple[str, str]]]:
    found: dict[str, list[tuple[str, str]]] = {}
    for finding in result.findings:
        found.setdefault(finding.code, []).append((finding.severity, finding.message))
    return found


def test_upstream_30b_eval_flags_become_an_eval_section_that_plans(capsys, tmp_path):
    script = SCRIPTS / "vime" / "run-qwen3-30B-A3B.sh"
    out = tmp_path / "imported.toml"
    code, report = _import(capsys, script, out)
    assert code == 0, report
    assert "V964" not in report and "--eval-" not in report
    text = out.read_text()
    spec = tomllib.loads(text)
    # --eval-interval 20 with --num-rollout 3000: before rollout 0 (no
    # --skip-eval-before-train), every 20 rollouts, and the final weights
    assert {k: v for k, v in spec["eval"].items() if k != "datasets"} == \
        {"interval": 20, "at_start": True, "at_end": True}
    assert spec["eval"]["datasets"] == [{
        "name": "aime", "prompt_data": "/root/aime-2024/aime-2024.jsonl",
        "n_samples_per_prompt": 16, "max_response_len": 16384, "top_p": 1.0}]
    lines = text.splitlines()
    at = lines.index("[[eval.datasets]]")
    line = next(n for n, row in enumerate(script.read_text().splitlines(), 1)
                if "--eval-max-response-len" in row)
    assert f"# --eval-max-response-len (run-qwen3-30B-A3B.sh:{line})" in lines[at:]
    assert lines[at + 1].startswith("# --eval-prompt-data (run-qwen3-30B-A3B.sh:")
    plan, shown = _plan(capsys, out)
    assert not [d for d in plan["diagnostics"] if d["code"] == "V506"]
    # the engines hold the prompt and the longest response, the eval's 16k one
    assert "eval (every 20 rollouts, at start, at end); engines' max_model_len 17408" in shown
    assert "16 samples per prompt, ≤ 16384 tokens" in shown


def test_eval_datasets_and_when_follow_upstream():
    two = import_argv(["--eval-prompt-data", "aime", "/d/aime.jsonl", "gpqa", "/d/gpqa.jsonl",
                       "--eval-interval", "7", "--num-rollout", "20", "--eval-temperature",
                       "0.6", "--skip-eval-before-train"])
    datasets = two.values["eval.datasets"]
    assert [(d["name"], d["prompt_data"], d["temperature"]) for d in datasets] == \
        [("aime", "/d/aime.jsonl", 0.6), ("gpqa", "/d/gpqa.jsonl", 0.6)]
    assert (two.values["eval.at_start"], two.values["eval.at_end"]) == (False, False)
    written = tomllib.loads(render(two))
    assert [d["name"] for d in written["eval"]["datasets"]] == ["aime", "gpqa"]
    alone = import_argv(["--eval-prompt-data", "/d/aime.jsonl"])  # upstream names it aime
    assert alone.values["eval.datasets"] == [{"name": "aime", "prompt_data": "/d/aime.jsonl"}]
    assert (alone.values["eval.at_start"], alone.values["eval.at_end"]) == (False, False)
    assert "never evaluates" in _codes(alone)["V965"][0][1]
    odd = import_argv(["--eval-prompt-data", "aime", "/d/aime.jsonl", "gpqa"])
    assert _codes(odd)["V963"][0][0] == "error" and "NAME PATH pairs" in _codes(odd)["V963"][0][1]
    assert "eval.datasets" not in odd.values
    lone = import_argv(["--eval-max-response-len", "4096", "--eval-top-k", "20"])
    assert not [k for k in lone.values if k.startswith("eval")]
    assert "no --eval-prompt-data" in _codes(lone)["V965"][0][1]
    assert _codes(lone)["V963"][0][0] == "warning"  # --eval-top-k: evaluation only


def test_slime_dynamic_sampling_script_maps_and_plans(capsys, tmp_path):
    for part in ("run-qwen3-4B.sh", "models"):
        source = SCRIPTS / "slime" / part
        (shutil.copytree if source.is_dir() else shutil.copy)(source, tmp_path / part)
    script = tmp_path / "run-qwen3-4B.sh"
    text = script.read_text()
    submit = text.index("ray job submit")
    script.write_text(text[:submit] + f"ROLLOUT_ARGS+=(--dynamic-sampling-filter-path "
                      f"{NONZERO_STD} --over-sampling-batch-size 64)\n\n" + text[submit:])
    out = tmp_path / "imported.toml"
    assert main(["import", str(script), "-o", str(out), "--env", "NUM_GPUS=4"]) == 0
    report = capsys.readouterr().err
    assert "note[V965]: --dynamic-sampling-filter-path check_reward_nonzero_std" in report
    rollout = tomllib.loads(out.read_text())["rollout"]
    assert (rollout["dynamic_sampling"], rollout["over_sampling_batch_size"]) == (True, 64)
    assert "dynamic_sampling_filter" not in rollout
    _plan_json, shown = _plan(capsys, out)
    assert "dynamic sampling: groups of equal rewards dropped" in shown
    assert "refilled by 64 prompts per attempt" in shown


def test_dynamic_sampling_filters_vime_cannot_call_as_slime_does_are_errors():
    fallback = import_argv(["--dynamic-sampling-filter-path", NONZERO_STD + "_with_fallback"])
    assert fallback.values["rollout.dynamic_sampling"] is True
    assert fallback.values["rollout.dynamic_sampling_max_attempts"] == 1
    assert "rollout.dynamic_sampling_filter" not in fallback.values
    assert "V963" not in _codes(fallback)
    mine = import_argv(["--dynamic-sampling-filter-path", "my.filters.keep_hard"])
    assert mine.values["rollout.dynamic_sampling"] is True
    assert mine.values["rollout.dynamic_sampling_filter"] == "my.filters:keep_hard"
    (severity, message), = _codes(mine)["V963"]
    assert severity == "error" and "keep_hard(args, samples)" in message
    assert "rewards=" in message


def test_offload_flags_become_train_offload_only_when_the_script_asks():
    def offload(*flags: str):
        result = import_argv(["--colocate", *flags])
        return result.values.get("train.offload"), _codes(result)

    assert offload("--offload")[0] == "always"
    assert offload("--offload-train")[0] == "always"  # the engines sleep by default
    assert offload("--no-offload-train", "--no-offload-rollout")[0] == "never"
    assert offload("--no-offload-train", "--offload")[0] == "always"  # --offload wins
    mixed, codes = offload("--offload-train", "--no-offload-rollout")
    assert mixed is None and codes["V963"][0][0] == "warning"
    assert "moves both or neither" in codes["V963"][0][1]
    none, codes = offload()
    assert none is None and any("train.offload = \"auto\"" in m for _s, m in codes["V965"])
    apart = import_argv(["--offload", "--rollout-num-gpus", "8"])
    assert "train.offload" not in apart.values
    assert any("without --colocate" in m for _s, m in _codes(apart)["V965"])
