"""Wording and numbers: what a new user reads first says the right thing, in English
(articles, plurals), with the numbers the checks themselves use."""

from __future__ import annotations

import json
import shlex

import pytest
from specsupport import ROOT

from vime import pipeline
from vime.cli import main
from vime.launch import follow
from vime.launch.jobdir import JobFolder
from vime.parse import Source
from vime.words import a, count_unit, plural

SEED = ROOT / "specs" / "qwen3_30b.toml"
TINY = ROOT / "specs" / "tiny_cpu.toml"


@pytest.mark.parametrize(("word", "expected"), [
    ("integer", "an integer"), ("object", "an object"), ("array", "an array"),
    ("string", "a string"), ("number", "a number"), ("boolean", "a boolean"),
    ("A100-40GB", "an A100-40GB"), ("A100-80GB", "an A100-80GB"), ("H100", "an H100"),
    ("H200", "an H200"), ("B200", "a B200"), ("[experiment]", "an [experiment]"),
    ("[model]", "a [model]"), ("[inference]", "an [inference]"), ("user", "a user")])
def test_articles(word, expected):
    assert a(word) == expected


def test_plurals_and_counts():
    assert [plural(1, "GPU"), plural(8, "GPU"), plural(1, "node"), plural(2, "node"),
            plural(0, "engine"), plural(1, "step")] == [
        "1 GPU", "8 GPUs", "1 node", "2 nodes", "0 engines", "1 step"]
    assert [count_unit(3.05e10), count_unit(3.35e9), count_unit(2.0e6), count_unit(127_900)] == [
        "30.5 B", "3.35 B", "2.00 M", "127.9 K"]


def _plan(spec, *sets: str, capsys) -> tuple[int, str]:
    argv = ["plan", str(spec)]
    for s in sets:
        argv += ["--set", s]
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_schema_and_memory_messages_use_an(capsys, tmp_path):
    _, out = _plan(SEED, "rollout.batch_size={}", capsys=capsys)
    assert "write an integer here" in out
    # without CPU Adam: with the chunked loss head the seed fits 40 GB
    _, out = _plan(SEED, 'cluster.gpu="A100-40GB"', "train.optimizer.cpu_offload=false",
                   capsys=capsys)
    assert "but an A100-40GB has" in out and " a A100" not in out
    spec = tmp_path / "no_experiment.toml"
    spec.write_text("\n".join(line for line in SEED.read_text().splitlines()
                              if not line.startswith(("[experiment]", "name =", "output_dir",
                                                      "seed ="))))
    assert "add an [experiment] section" in _plan(spec, capsys=capsys)[1]


def test_plan_of_one_gpu_is_singular(capsys):
    out = _plan(TINY, capsys=capsys)[1]
    assert "1 node × 1 GPU = 1 GPU;" in out
    assert "rollout: 1 engine of 1 GPU\n" in out and "node 0;" in out and "2 steps" in out
    assert "(s)" not in out and "1 GPUs" not in out


def test_batch_counts_of_one_are_singular(capsys):
    out = _plan(SEED, "rollout.batch_size=1", "rollout.n_samples_per_prompt=1",
                "train.global_batch_size=1", "train.dynamic_batch=false", "train.parallel.tp=8",
                "rollout.num_rollout=1", capsys=capsys)[1]
    assert "  1 prompt × 1 sample = 1 sample per rollout = 1 step × global batch 1\n" in out
    assert "  1 sample per dp rank per step = 1 micro-batch of 1\n" in out
    assert "  1 rollout → 1 optimizer step\n" in out and "each engine 1 sample)" in out


@pytest.mark.parametrize(("gpus", "says"), [
    (129, "128 GPUs hold 1 expert, the others 0"), (24, "8 GPUs hold 6 experts, the others 5"),
    (127, "1 GPU holds 2 experts, the others 1")])
def test_v303_counts_gpus_and_experts_in_english(gpus, says):
    nodes = -(-(gpus + 8) // 8)  # the engine's GPUs and the seed's 8 for the actor
    result = pipeline.run(Source(str(SEED), SEED.read_text()), [
        f"cluster.nodes={nodes}", f"inference.num_gpus={gpus}",
        f"inference.gpus_per_engine={gpus}"], SEED.parent)
    (message,) = [d.message for d in result.diagnostics if d.code == "V303"]
    assert message.endswith(says), message


def test_torch_backends_plan_no_vllm_memory_and_no_h100(capsys):
    out = _plan(TINY, capsys=capsys)[1]
    assert "H100" not in out and "79.6 GiB" not in out
    assert "kv cache" not in out.lower() and "cuda graphs" not in out and "vLLM" not in out
    assert "127.9 K parameters" in out and "0.00 B" not in out
    assert "memory (torch backends: fp32" in out and "2.0 MiB" in out
    result = pipeline.run(Source(str(TINY), TINY.read_text()), spec_dir=TINY.parent)
    assert result.plan.memory is None  # Megatron's and vLLM's model does not apply


def test_host_memory_in_the_plan_is_what_v804_compares(capsys):
    out = _plan(SEED, capsys=capsys)[1]
    assert "host per node: 572.5 GiB + Ray's object store (30% of the node): nodes of ≥ 817.8" in out
    code, out = _plan(SEED, "cluster.host_memory_gib=512", capsys=capsys)
    assert code == 1 and "each node needs 726.1 GiB of host memory (CPU Adam 455.5 + " in out
    assert "Ray object store 153.6) but has 512.0 GiB" in out
    _, out = _plan(SEED, "cluster.host_memory_gib=1800", capsys=capsys)
    assert "host per node: 1112.5 of 1800.0 GiB, Ray's object store included" in out
    assert "Ray object store 540.0" in out


def _messages(spec, *sets: str) -> dict[str, tuple[str, str]]:
    result = pipeline.run(Source(str(spec), spec.read_text()), list(sets), spec_dir=spec.parent)
    return {(d.code, d.key): (d.message, d.help) for d in result.diagnostics}


def test_v701_says_where_a_relative_path_resolves():
    found = _messages(SEED, "cluster.nodes=2", "train.parallel.cp=2",
                      'experiment.output_dir="runs"', 'data.prompt_data="data/x.jsonl"')
    message = found[("V701", "experiment.output_dir")][0]
    assert "`vime submit` makes it absolute from the folder vime runs in" in message
    assert "from the spec's folder" in found[("V701", "data.prompt_data")][0]
    assert "own working directory" not in str(found)


def test_v704_and_v507_name_the_key_or_say_there_is_none():
    found = _messages(SEED, 'cluster.slurm.extra_args=["--qos=high","--output=x.log"]',
                      'inference.extra_args=["--max-model-len=3","--pipeline-parallel-size=2"]')
    assert found[("V704", "cluster.slurm.extra_args[0]")][1] == \
        "remove it and set cluster.slurm.qos instead"
    assert "no spec key sets it" in found[("V704", "cluster.slurm.extra_args[1]")][1]
    assert found[("V507", "inference.extra_args[0]")][1] == \
        "remove it and set rollout.max_prompt_len and max_response_len instead"
    assert "no spec key sets it" in found[("V507", "inference.extra_args[1]")][1]
    assert "matching" not in str(found)


def _job(tmp_path, nodes: int) -> JobFolder:
    folder = JobFolder(tmp_path / "local-1")
    folder.path.mkdir()
    folder.write({"job.json": json.dumps({
        "job_id": "local-1", "nodes": nodes, "gpus_per_node": 1, "launcher": "local",
        "experiment": "tiny-cpu", "spec": "specs/tiny_cpu.toml", "spec_sha256": "0" * 64}),
        "outcome.json": json.dumps({"state": "succeeded", "attempt": 0})})
    return folder


def test_logs_of_a_node_the_job_does_not_have(tmp_path):
    folder = _job(tmp_path, nodes=1)
    with pytest.raises(follow.FollowError, match="has only node 0; there is no node 1"):
        follow.logs(folder, 1, follow=False)
    (tmp_path / "three").mkdir()
    with pytest.raises(follow.FollowError, match="has nodes 0 to 2; there is no node 3"):
        follow.logs(_job(tmp_path / "three", nodes=3), 3, follow=False)


def test_an_ended_local_job_is_not_told_to_follow(tmp_path, monkeypatch, capsys):
    from vime.launch import submit

    folder = _job(tmp_path, nodes=1)
    monkeypatch.setattr(submit, "submit_local", lambda prepared, *hooks: (folder, 0))
    assert main(["submit", "--local", str(TINY), "--set",
                 f'experiment.output_dir="{tmp_path}"']) == 0
    out = capsys.readouterr().out
    assert "job local-1 succeeded" in out and "follow" not in out


def test_convert_dry_run_prints_a_command_that_works_after_it(capsys, tmp_path):
    assert main(["convert", str(SEED), "--dry-run", "-o", str(tmp_path / "out")]) == 0
    argv = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
    arch = json.loads(argv[argv.index("--arch") + 1])  # inline, not a file gone by now
    assert arch["num_experts"] == 128 and arch["num_hidden_layers"] == 48


def test_resolved_toml_names_a_schema_an_editor_can_open(tmp_path, capsys):
    out = tmp_path / "build"
    assert main(["compile", str(TINY), "-o", str(out)]) == 0
    first = (out / "resolved.toml").read_text().splitlines()[0]
    assert first.startswith("#:schema ") and "://" not in first
    assert (out / first.removeprefix("#:schema ")).resolve().is_file()
