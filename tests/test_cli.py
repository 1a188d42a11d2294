from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from specsupport import ROOT, SPECS

from vime.cli import main

SPEC = str(ROOT / "specs" / "qwen3_30b.toml")


def test_plan_text_fits_100_columns(capsys):
    for spec in SPECS:
        assert main(["plan", str(spec)]) == 0
        out = capsys.readouterr().out
        assert " rollout: " in out and "batch" in out
        assert max(len(line) for line in out.splitlines()) <= 100, spec.name


@pytest.mark.parametrize(("value", "said"), [
    (None, "  layer spec: auto (Transformer Engine where it imports on the nodes, else local)\n"
           "              (from default: 'auto')"),
    ("local", "  layer spec: local (torch SDPA attention, grouped-GEMM experts) (from set "),
    ("transformer_engine", "  layer spec: Transformer Engine (TE attention, fused norms, "
                           "TEGroupedMLP) (from set "),
])
def test_plan_text_names_the_actors_layer_spec(capsys, value, said):
    sets = ["--set", f'train.transformer_impl="{value}"'] if value else []
    assert main(["plan", SPEC, *sets]) == 0
    assert said in capsys.readouterr().out


def test_plan_text_says_where_and_how_often_hf_folders_are_written(capsys, tmp_path):
    tiny = str(ROOT / "specs" / "tiny_cpu.toml")
    assert main(["plan", tiny, "--set", "checkpoint.save_hf_interval=15", "--set",
                 f'model.save="{tmp_path}"']) == 0
    assert (f"  HF model folder every 15 rollouts and after the last (3 folders): "
            f"{tmp_path}/hf/rollout_XXXXXX/\n") in capsys.readouterr().out
    assert main(["plan", tiny]) == 0
    assert "HF model folder" not in capsys.readouterr().out


def test_plan_json_has_the_contract_keys(capsys):
    assert main(["plan", SPEC, "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert {"spec", "ok", "diagnostics", "cluster", "model", "train", "rollout", "colocate",
            "batch", "memory"} <= set(obj)
    assert obj["train"]["groups"]["tp"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert obj["train"]["ranks"][5] == {"rank": 5, "node": 0, "gpu": 5, "tp": 1, "cp": 0, "dp": 1,
                                        "pp": 0, "ep": 5, "etp": 0, "edp": 0}
    assert obj["rollout"]["engines"][0]["experts_per_gpu"] == 16
    assert obj["batch"]["global_batch_size"] == 8
    assert obj["origins"]["train.num_gpus"].startswith("derived")


def test_errors_exit_1_with_rendered_diagnostics(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = main(["plan", "specs/qwen3_30b.toml", "--set", "train.parallel.tp=8", "--set", "train.parallel.cp=2"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(
        "error[V201]: train.parallel: 8 actor GPUs cannot hold whole model replicas of "
        "tp × cp × pp = 8 × 2 × 1 = 16 GPUs\n"
        " --> --set[1]:1:19\n"
        "  |\n"
        "1 | train.parallel.tp=8\n"
        "  |                   ^\n"
        "  = train.parallel.cp at --set[2]:1:19\n"
        "  = train.parallel.pp at specs/qwen3_30b.toml:55:1\n"
        "help: use 2 nodes (16 GPUs), or tp = 4, or cp = 1\n")
    # and V730's and V732's warnings: the seed's model folder and prompts are a cluster's
    assert err.rstrip().endswith("1 error, 2 warnings")


def test_concise_format_and_json_carry_the_same_diagnostic(capsys):
    main(["plan", SPEC, "--set", "train.tpp=1", "--format", "concise"])
    line = capsys.readouterr().err.splitlines()[0]
    assert line == ("--set[1]:1:11: error[V002] train.tpp: unknown key train.tpp "
                    "(help: did you mean train.parallel.tp? it belongs in [train.parallel])")
    main(["plan", SPEC, "--set", "train.tpp=1", "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert obj["ok"] is False and obj["diagnostics"][0]["code"] == "V002"
    assert (obj["diagnostics"][0]["line"], obj["diagnostics"][0]["col"]) == (1, 11)


def test_unknown_key_in_the_file_points_at_it_and_suggests(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text(Path(SPEC).read_text().replace("[train.parallel]\n", "[train.parallel]\ntensor_parallel = 2\n"))
    assert main(["plan", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "error[V002]: unknown key train.parallel.tensor_parallel" in err
    assert "help: did you mean train.parallel.sequence_parallel?" in err


def test_warnings_pass_unless_strict(capsys):
    sets = ["--set", 'cluster.ray.dashboard_host="0.0.0.0"']
    assert main(["plan", SPEC, *sets]) == 0
    assert "warning[V702]" in capsys.readouterr().err
    assert main(["plan", SPEC, *sets, "--strict"]) == 1


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main(["plan", str(tmp_path / "missing.toml")]) == 2
    with pytest.raises(SystemExit) as exit_:
        main(["plan"])
    assert exit_.value.code == 2
    assert main(["explain", "V999"]) == 2


def test_explain_every_code(capsys):
    assert main(["explain"]) == 0
    listing = capsys.readouterr().out
    assert "V201" in listing and "V001" in listing
    assert main(["explain", "v201"]) == 0
    text = capsys.readouterr().out
    assert "is not divisible by total_model_size" in text and "megatron" in text


def test_compile_writes_the_build_folder_atomically(tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["compile", SPEC, "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        ".vime-build", "README.txt", "job.sbatch", "megatron.args", "plan.json", "resolved.toml",
        "vllm.args"]
    first = (out / "plan.json").read_text()
    assert main(["compile", SPEC, "-o", str(out), "--set", "rollout.num_rollout=2"]) == 0
    assert (out / "plan.json").read_text() != first
    assert [p.name for p in tmp_path.iterdir()] == ["b"]  # no staging folders left behind


def test_compile_never_replaces_a_folder_it_did_not_write(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    assert main(["compile", SPEC, "-o", str(mine)]) == 2
    assert (mine / "notes.txt").read_text() == "precious"
    assert "was not written by vime compile" in capsys.readouterr().err


def test_compile_with_errors_writes_nothing(tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["compile", SPEC, "-o", str(out), "--set", "train.parallel.ep=3"]) == 1
    assert not out.exists()


@pytest.mark.parametrize("argv", [
    ["plan", SPEC, "--set", 'logging.wandb_project="x"', "--set", 'logging.tensorboard_dir="tb"'],
    ["import", str(ROOT / "tests" / "fixtures" / "scripts" / "vime" / "run-qwen3-30B-A3B.sh")],
], ids=["plan", "import"])
def test_plan_imports_no_heavy_library(argv):
    code = (
        "import sys; from vime.cli import main; rc = main(sys.argv[1:]); "
        "heavy = {'torch', 'ray', 'vllm', 'megatron', 'submitit', 'wandb', 'tensorboard', "
        "'transformer_engine'} & {m.split('.')[0] for m in sys.modules}; "
        "print(sorted(heavy)); sys.exit(rc or bool(heavy))"
    )
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("[]")


def test_console_script_runs():
    proc = subprocess.run([sys.executable, "-m", "vime", "plan", SPEC, "--json"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True


def _plan_lines(capsys, *sets: str) -> list[str]:
    assert main(["plan", SPEC, *(arg for item in sets for arg in ("--set", item))]) == 0
    return capsys.readouterr().out.splitlines()


def test_plan_text_summarises_beyond_16_nodes_and_engines(capsys):
    # 16 nodes and 16 engines are all shown; a 17th leaves out all but the first and the last
    # (the largest cluster in full is 23-43 MB); an engine on 9 nodes names a range
    batch = ["rollout.batch_size=64", "train.global_batch_size=128"]
    sixteen = _plan_lines(capsys, "cluster.nodes=16", *batch)
    assert [line for line in sixteen if line.startswith("node ")] == [
        f"node {n}" for n in range(16)]
    assert sum(line.startswith("  e") and ": TP 8 × DP 1" in line for line in sixteen) == 16
    assert not any("not shown" in line for line in sixteen)
    seventeen = _plan_lines(capsys, "cluster.nodes=17", "rollout.batch_size=68",
                            "train.global_batch_size=136")
    assert [line for line in seventeen if line.startswith(("node ", "… "))] == [
        "node 0", "node 1",
        "… nodes 2–15 not shown (14 nodes; `vime plan --json` lists every GPU)", "node 16"]
    engines = [line for line in seventeen if re.match(r"  (… )?e\d", line)]
    assert [line.split(":")[0] for line in engines] == [
        "  e0", "  e1", "  e2", "  e3", "  e4", "  e5",
        "  … e6–e15 not shown (10 engines like these, on nodes 6–15)", "  e16"]
    eight = _plan_lines(capsys, "cluster.nodes=16", *batch, "inference.gpus_per_engine=64",
                        "inference.data_parallel_size=8")
    assert any(", nodes 8,9,10,11,12,13,14,15; " in line for line in eight)
    nine = _plan_lines(capsys, "cluster.nodes=18", "rollout.batch_size=72",
                       "train.global_batch_size=144", "inference.gpus_per_engine=72",
                       "inference.data_parallel_size=9", "inference.eplb.enabled=true",
                       "inference.eplb.num_redundant_experts=16")
    assert any(line.startswith("  e1: ") and ", nodes 9–17; " in line for line in nine)
