"""V708 / V709: the checkpoint a submit would resume from against the spec, read
from the vime_checkpoint.json the runtime writes into it."""

from __future__ import annotations

import json

import pytest
from specsupport import ROOT, run_spec

from vime.cli import main

TINY = ROOT / "specs" / "tiny_cpu.toml"  # torch backend, 2-layer all-MoE model, 1 GPU
MEGATRON = ROOT / "specs" / "qwen3_30b.toml"  # megatron, preset qwen3-30b-a3b, tp 4 ep 8, 8 GPUs

TINY_ARCH = {"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 64,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "vocab_size": 32, "tie_word_embeddings": False, "mlp_only_layers": [],
             "intermediate_size": 128, "num_experts": 4, "moe_intermediate_size": 64}
ONE_RANK = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": 1, "dp": 1, "edp": 1, "ranks": 1}


def _checkpoint(folder, rollout=9, backend="torch", arch=None, layout=None, record=True):
    """A run's checkpoint as runtime/rl/checkpoint.py leaves it (without the tensors)."""
    checkpoint = folder / f"rollout_{rollout:06d}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text(json.dumps(
        {"format": 1, "rollout": rollout, "next_rollout": rollout + 1}))
    (folder / "latest").write_text(checkpoint.name + "\n")
    if record:
        (checkpoint / "vime_checkpoint.json").write_text(json.dumps({
            "record": 1, "train_backend": backend,
            "format": "torch" if backend == "torch" else "torch_dist",
            "arch": TINY_ARCH if arch is None else arch,
            "layout": ONE_RANK if layout is None else layout}))
    return checkpoint


def _found(spec, tmp_path, *sets):
    result = run_spec(spec, [f"experiment.output_dir={json.dumps(str(tmp_path))}", *sets])
    return result, [d for d in result.diagnostics if d.code in ("V708", "V709")]


def test_a_changed_model_names_both_values_where_they_come_from_and_the_fixes(tmp_path):
    checkpoint = _checkpoint(tmp_path / "tiny-cpu" / "checkpoints")
    result, (diag,) = _found(TINY, tmp_path, "model.arch.num_hidden_layers=3",
                             "model.arch.hidden_size=96")
    assert (diag.code, diag.severity, diag.key) == ("V708", "error", "model.arch.num_hidden_layers")
    assert not result.ok and result.plan is None
    assert diag.message == (
        f"{checkpoint}, the checkpoint a submit resumes from, was written by another model: "
        "num_hidden_layers 2 in the checkpoint, 3 in this spec; hidden_size 64 in the "
        f"checkpoint, 96 in this spec (the checkpoint's from {checkpoint}/vime_checkpoint.json, "
        "this spec's from [model.arch]); loading it would fail on the first tensor of another "
        "shape, after the job has started")
    assert [".".join(path) for path, _ in diag.related] == ["model.arch.hidden_size",
                                                           "experiment.output_dir"]
    resume, _, start_over = diag.help.partition("; to start over instead, ")
    assert resume == "to resume it, set model.arch.num_hidden_layers = 2, model.arch.hidden_size = 64"
    assert start_over.startswith("`vime submit --fresh specs/tiny_cpu.toml --set ")
    assert start_over.endswith("(a new run beside this one; nothing is deleted) or another "
                               "experiment.output_dir")


def test_an_old_checkpoint_without_a_record_and_a_fresh_folder_are_not_checked(tmp_path):
    _checkpoint(tmp_path / "tiny-cpu" / "checkpoints", record=False)
    assert _found(TINY, tmp_path, "model.arch.num_hidden_layers=3")[1] == []
    assert _found(TINY, tmp_path / "empty", "model.arch.num_hidden_layers=3")[1] == []


def test_the_checkpoint_read_is_the_one_a_resume_loads(tmp_path):
    folder = tmp_path / "tiny-cpu" / "checkpoints"
    _checkpoint(folder, rollout=9, arch={**TINY_ARCH, "num_hidden_layers": 3})
    newest = _checkpoint(folder, rollout=19)  # `latest` names it
    assert _found(TINY, tmp_path)[1] == []
    (folder / "latest").write_text("rollout_000009\n")
    assert "num_hidden_layers 3 in the checkpoint" in _found(TINY, tmp_path)[1][0].message
    (folder / "latest").unlink()  # then the newest complete one
    assert _found(TINY, tmp_path)[1] == []
    (newest / "state.json").unlink()  # a save that did not finish is not a checkpoint
    assert _found(TINY, tmp_path)[1][0].code == "V708"


def test_the_folder_is_the_one_vime_submit_resumes_from(tmp_path, monkeypatch):
    from vime.launch import paths, resume, submit
    from vime.resolve import resume_folder

    spec_dir, cwd = tmp_path / "specs", tmp_path / "work"
    (spec_dir / "ckpt").mkdir(parents=True)
    (cwd / "only-here").mkdir(parents=True)
    monkeypatch.chdir(cwd)
    for model, key in (({}, "experiment.output_dir"), ({"load": "ckpt"}, "model.load"),
                       ({"save": "only-here"}, "model.save"),
                       ({"save": "new", "load": "~/x"}, "model.load"),
                       ({"save": str(tmp_path / "abs")}, "model.save")):
        values = {"model": model, "experiment": {"name": "tiny-cpu", "output_dir": "runs"}}
        folder, named_by = resume_folder(values, spec_dir, cwd)
        spec = run_spec(TINY, [f"model.{k}={json.dumps(v)}" for k, v in model.items()]
                        + ['experiment.output_dir="runs"']).spec
        submitted = paths.absolute(spec, spec_dir, cwd)
        experiment = submit.experiment_dir(submitted.experiment.output_dir, "tiny-cpu")
        assert (folder, named_by) == (resume.load_dir(submitted, experiment), key), model


def test_a_model_read_from_a_preset_points_at_the_preset(tmp_path):
    arch = {"num_hidden_layers": 48, "hidden_size": 2048, "num_experts": 64}
    layout = {"tp": 4, "pp": 1, "cp": 1, "ep": 8, "etp": 1, "dp": 2, "edp": 1, "ranks": 8}
    _checkpoint(tmp_path / "qwen3-30b-a3b-grpo" / "checkpoints", backend="megatron", arch=arch,
                layout=layout)
    (diag,) = _found(MEGATRON, tmp_path)[1]
    assert (diag.code, diag.key) == ("V708", "model.preset")
    assert ("num_experts 64 in the checkpoint, 128 in this spec (the checkpoint's from "
            in diag.message and "vime_checkpoint.json, this spec's from preset: qwen3-30b-a3b)"
            in diag.message)
    assert diag.help.startswith("to resume it, set model.arch.num_experts = 64;")


def test_widths_of_layers_neither_model_has_are_not_compared(tmp_path):
    # Qwen3-MoE keeps intermediate_size in config.json though every layer is MoE
    _checkpoint(tmp_path / "tiny-cpu" / "checkpoints", arch={**TINY_ARCH, "intermediate_size": 256})
    assert _found(TINY, tmp_path)[1] == []
    (diag,) = _found(TINY, tmp_path, "model.arch.mlp_only_layers=[0]")[1]
    assert diag.message.count(" in the checkpoint, ") == 2  # which layers, and the MLP width
    assert "mlp_only_layers [] in the checkpoint, [0] in this spec; intermediate_size 256" in \
        diag.message


def test_another_training_backend_cannot_load_it(tmp_path):
    _checkpoint(tmp_path / "tiny-cpu" / "checkpoints")
    (diag,) = _found(TINY, tmp_path, 'train.backend="megatron"', 'inference.backend="vllm"',
                     "model.random_init=false")[1]
    assert (diag.code, diag.key) == ("V708", "train.backend")
    assert "was written by the torch training backend (format torch, " in diag.message
    assert "this run's megatron backend reads torch_dist checkpoints and cannot load it" in \
        diag.message
    assert diag.help.startswith('to resume it, set train.backend = "torch";')


@pytest.mark.parametrize("sets, fires", [
    ((), None),
    (("train.parallel.ep=4",), "train.parallel.ep"),
    (("train.parallel.tp=2", "train.parallel.cp=2"), "train.parallel.tp"),
    (("train.parallel.tp=4", "train.parallel.cp=2"), None),  # dp 2 -> 1: resharded
    (("cluster.nodes=2",), "train.num_gpus"),  # 16 ranks, 8 RNG files
])
def test_megatron_loads_under_another_dp_or_cp_only_with_no_more_ranks(tmp_path, sets, fires):
    layout = {"tp": 4, "pp": 1, "cp": 1, "ep": 8, "etp": 1, "dp": 2, "edp": 1, "ranks": 8}
    _checkpoint(tmp_path / "qwen3-30b-a3b-grpo" / "checkpoints", backend="megatron", arch={},
                layout=layout)
    found = _found(MEGATRON, tmp_path, *sets)[1]
    assert [d.key for d in found] == ([fires] if fires else [])
    for diag in found:
        assert diag.code == "V709"
    if fires == "train.parallel.tp":
        assert "was saved with tp=4 (" in found[0].message and "this run uses tp=2: its " \
            "torch_dist format loads only under the tp, pp, ep, etp it was saved with" in \
            found[0].message
    if fires == "train.num_gpus":
        assert "saved by 8 training ranks" in found[0].message
        assert "this run has 16: every rank loads its own rng_rank<r>.pt, which ranks 8 to " \
            "15 do not have" in found[0].message


def test_fewer_megatron_ranks_load_it(tmp_path):
    layout = {"tp": 4, "pp": 1, "cp": 1, "ep": 8, "etp": 1, "dp": 4, "edp": 2, "ranks": 16}
    _checkpoint(tmp_path / "qwen3-30b-a3b-grpo" / "checkpoints", backend="megatron", arch={},
                layout=layout)
    assert _found(MEGATRON, tmp_path)[1] == []


@pytest.mark.parametrize("text", ["{not json", '{"train_backend": "torch", "arch": {}}', "[]"])
def test_an_unusable_record_is_a_warning(tmp_path, text):
    checkpoint = _checkpoint(tmp_path / "tiny-cpu" / "checkpoints")
    (checkpoint / "vime_checkpoint.json").write_text(text)
    result, (diag,) = _found(TINY, tmp_path, "model.arch.num_hidden_layers=3")
    assert (diag.code, diag.severity, diag.key) == ("V708", "warning", "experiment.output_dir")
    assert diag.message.startswith(f"{checkpoint}/vime_checkpoint.json ")
    assert result.ok


def test_model_load_is_what_a_resume_reads_and_what_to_change(tmp_path):
    _checkpoint(tmp_path / "ckpt")
    (diag,) = _found(TINY, tmp_path / "runs", f"model.load={json.dumps(str(tmp_path / 'ckpt'))}",
                     "model.arch.num_hidden_layers=3")[1]
    assert [".".join(path) for path, _ in diag.related] == ["model.load"]
    assert diag.help.endswith("; to start over instead, set model.load to another folder")


def test_submit_fresh_and_convert_are_not_refused_for_the_old_runs_checkpoint(tmp_path,
                                                                              capsys):
    _checkpoint(tmp_path / "tiny-cpu" / "checkpoints")
    sets = ["--set", f"experiment.output_dir={json.dumps(str(tmp_path))}",
            "--set", "model.arch.num_hidden_layers=3"]
    assert main(["submit", str(TINY), "--local", *sets]) == 1
    assert "error[V708]" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-cpu"]  # nothing started
    # --fresh gets as far as the preflight of the new run (a record past the 20 that plan
    # reads has no label)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "1+1", "label": "2"}\n' * 20 + '{"prompt": "2+2"}\n')
    assert main(["submit", str(TINY), "--local", "--fresh", *sets,
                 "--set", f"data.prompt_data={json.dumps(str(prompts))}"]) == 2
    out, err = capsys.readouterr()
    assert f"vime: --fresh: a new run tiny-cpu-2 in {tmp_path / 'tiny-cpu-2'}" in out
    assert "V708" not in err and "data.prompt_data: " in err
    # the initial weights do not load the run's checkpoint
    assert main(["convert", str(TINY), "--dry-run", *sets, "-o", str(tmp_path / "td")]) == 0
    assert "V708" not in capsys.readouterr().err
