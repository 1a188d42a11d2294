"""`vime submit` writes the spec's relative paths absolute into the job folder; `vime compile`
keeps them as written (vime/launch/paths.py); the two write the same job.sbatch."""

from __future__ import annotations

import json
import os
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
from launchkit import ROOT, SMOKE, spec_sets, vime

from vime import pipeline
from vime.emit import build, plan_json
from vime.launch import submit
from vime.parse import Source

TINY = ROOT / "specs" / "tiny_cpu.toml"


def _submit_and_compile(spec: Path, launcher: str = "local", sets=()):
    """(the job folder's files, the build folder's files), spec named relative to the cwd."""
    name = os.path.relpath(spec)
    text = spec.read_text()
    result = pipeline.run(Source(name, text), list(sets), spec.resolve().parent)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics]
    obj = plan_json.plan_object(name, result.diagnostics, result.spec, result.plan)
    prepared = submit.prepare(result, name, text, obj, launcher)
    compiled = build.files(result.plan, name, text, obj, "build/x")
    assert result.spec.data.prompt_data == tomllib.loads(compiled["resolved.toml"])["data"][
        "prompt_data"]  # the input is not changed
    return prepared, compiled


def _args(text: str) -> dict[str, str]:
    tokens = shlex.split(text)
    return {t: tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t.startswith("--")}


def test_relative_paths_become_absolute_in_the_job_folder_only(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "specs" / "data").mkdir(parents=True)
    (project / "models" / "Qwen3-30B-A3B").mkdir(parents=True)
    (project / "specs" / "data" / "prompts.jsonl").write_text('{"prompt": "1+1", "label": "2"}\n')
    spec = project / "specs" / "run.toml"
    spec.write_text((ROOT / "specs" / "qwen3_30b.toml").read_text()
                    .replace('"/shared/vime-runs"', '"runs"')
                    .replace('"/root/Qwen3-30B-A3B"', '"../models/Qwen3-30B-A3B"')
                    .replace('"/root/Qwen3-30B-A3B_torch_dist"', '"../models/torch_dist"')
                    .replace('"/root/dapo-math-17k/dapo-math-17k.jsonl"', '"data/prompts.jsonl"'))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    prepared, compiled = _submit_and_compile(spec, sets=['model.save="ckpt"', 'model.load="~/ckpt"'])

    job = tomllib.loads(prepared.files["resolved.toml"])
    assert job["data"]["prompt_data"] == str(project / "specs" / "data" / "prompts.jsonl")
    assert job["model"]["hf_checkpoint"] == str(project / "models" / "Qwen3-30B-A3B")
    assert job["model"]["torch_dist_checkpoint"] == str(project / "models" / "torch_dist")
    assert job["model"]["save"] == str(project / "specs" / "ckpt")
    assert job["model"]["load"] == os.path.expanduser("~/ckpt")
    assert job["experiment"]["output_dir"] == str(elsewhere / "runs")
    assert prepared.experiment_dir == elsewhere / "runs" / "qwen3-30b-a3b-grpo"
    megatron, vllm = _args(prepared.files["megatron.args"]), _args(prepared.files["vllm.args"])
    assert (megatron["--load"], megatron["--save"]) == (job["model"]["load"], job["model"]["save"])
    assert vllm["--model"] == job["model"]["hf_checkpoint"]

    written = tomllib.loads(compiled["resolved.toml"])  # compile: as the user wrote them
    assert (written["data"]["prompt_data"], written["model"]["hf_checkpoint"],
            written["experiment"]["output_dir"]) == ("data/prompts.jsonl",
                                                     "../models/Qwen3-30B-A3B", "runs")
    assert _args(compiled["megatron.args"])["--save"] == "ckpt"


def test_a_model_id_stays_and_a_path_found_only_in_the_working_folder_is_taken_from_there(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.jsonl").write_text('{"prompt": "1+1", "label": "2"}\n')
    prepared, _ = _submit_and_compile(TINY, sets=['model.hf_checkpoint="Qwen/Qwen3-0.6B"',
                                                  'data.prompt_data="mine.jsonl"'])
    job = tomllib.loads(prepared.files["resolved.toml"])
    assert job["model"]["hf_checkpoint"] == "Qwen/Qwen3-0.6B"
    assert job["data"]["prompt_data"] == str(tmp_path / "mine.jsonl")


def test_the_job_finds_the_prompts_from_another_working_folder(tmp_path, monkeypatch):
    from runtime.core.slices import JobConfig

    monkeypatch.chdir(ROOT)
    prepared, compiled = _submit_and_compile(TINY)
    plan = json.loads(prepared.files["plan.json"])
    monkeypatch.chdir(tmp_path)  # a Slurm job runs in its experiment folder, on another node
    config = JobConfig.from_job(plan, prepared.files["resolved.toml"], tmp_path / "job")
    assert config.data.prompt_data == ROOT / "specs" / "data" / "tiny_arithmetic.jsonl"
    with pytest.raises(FileNotFoundError):  # what the job got before: the relative path
        JobConfig.from_job(plan, compiled["resolved.toml"], tmp_path / "job")


def test_the_build_folders_job_sbatch_is_the_script_vime_submit_submits(tmp_path):
    # the build folder's README.txt says so: both write the interpreter's path, not `python3`
    sets = spec_sets(tmp_path / "runs")
    compiled = vime("compile", str(SMOKE), *sets, "-o", str(tmp_path / "build"))
    assert compiled.returncode == 0, compiled.stderr
    dry = vime("submit", str(SMOKE), *sets, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    header, shown = dry.stdout.split("\n", 1)
    script = (tmp_path / "build" / "job.sbatch").read_text()
    assert shown.startswith(script + "\n"), shown
    assert "--output=%j/logs/batch.log" in header  # the job folder exists once the job id does
    assert f"experiment_dir=$({sys.executable} -m vime.launch.batch)" in script
    assert "#SBATCH --output" not in script  # a plain sbatch must find its log's folder
