"""`vime import` on real launch scripts (tests/fixtures/scripts/README.md names their source):
the imported spec plans to the layout the script asked for."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from specsupport import ROOT

from vime.cli import main
from vime.importer import import_argv, import_script

SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"


def _import(capsys, tmp_path: Path, script: str, *env: str) -> tuple[int, Path, str]:
    out = tmp_path / "imported.toml"
    args = ["import", str(SCRIPTS / script), "-o", str(out)]
    for item in env:
        args += ["--env", item]
    code = main(args)
    return code, out, capsys.readouterr().err


def _plan(capsys, spec: Path) -> dict:
    code = main(["plan", str(spec), "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["ok"], [d["message"] for d in plan["diagnostics"]]
    return plan


# script, --env, (nodes, tp, cp, ep, dp), (engines, gpus per engine, engine tp, dp, ep),
# (rollout batch, samples per prompt, global batch)
CASES = {
    "seed-1-node": ("seed/run-qwen3-30B-A3B.sh", (), (1, 4, 1, 8, 2), (1, 8, 8, 1, 8),
                    (4, 2, 8)),
    "seed-2-nodes": ("seed/run-qwen3-30B-A3B.sh", ("ACTOR_NUM_NODES=2",), (2, 8, 2, 8, 1),
                     (1, 16, 16, 1, 16), (4, 2, 8)),
    "seed-24-gpus-eplb": ("seed/run-qwen3-30B-A3B-24gpu-eplb.sh", (), (3, 4, 1, 8, 6),
                          (1, 24, 8, 3, 24), (12, 2, 24)),
    "vime-30b": ("vime/run-qwen3-30B-A3B.sh", (), (1, 4, 1, 8, 2), (1, 8, 8, 1, 1),
                 (32, 8, 256)),
    "vime-4b": ("vime/run-qwen3-4B.sh", ("NUM_GPUS=8",), (1, 2, 1, 1, 4), (4, 2, 2, 1, 1),
                (32, 8, 256)),
    "slime-30b": ("slime/run-qwen3-30B-A3B.sh", (), (1, 4, 1, 8, 2), (1, 8, 8, 1, 1),
                  (32, 8, 256)),
    "slime-4b": ("slime/run-qwen3-4B.sh", ("NUM_GPUS=4",), (1, 2, 1, 1, 2), (2, 2, 2, 1, 1),
                 (32, 8, 256)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_imported_script_plans_to_the_layout_it_asked_for(case, capsys, tmp_path):
    script, env, actor, rollout, batch = CASES[case]
    code, out, report = _import(capsys, tmp_path, script, *env)
    assert code == 0, report
    assert "complete (0 errors" in report
    plan = _plan(capsys, out)
    train = plan["train"]
    assert (plan["cluster"]["nodes"], train["tp"], train["cp"], train["ep"], train["dp"]) == actor
    engines = plan["rollout"]["engines"]
    assert (plan["rollout"]["num_engines"], plan["rollout"]["gpus_per_engine"],
            engines[0]["tp"], engines[0]["dp"], engines[0]["ep"]) == rollout
    assert (plan["batch"]["rollout_batch_size"], plan["batch"]["n_samples_per_prompt"],
            plan["batch"]["global_batch_size"]) == batch


def test_seed_scenarios_keep_cpu_adam_r3_and_eplb_where_the_script_asked(capsys, tmp_path):
    (tmp_path / "1").mkdir()
    _code, one, _ = _import(capsys, tmp_path / "1", "seed/run-qwen3-30B-A3B.sh")
    spec = tomllib.loads(one.read_text())
    assert spec["train"]["optimizer"]["cpu_offload"] is True
    assert spec["train"]["routing_replay"] is True
    assert spec["inference"]["moe_backend"] == "triton"
    assert spec["inference"]["cudagraph_capture_sizes"] == [1, 2, 4, 8, *range(16, 257, 8)]
    (tmp_path / "2").mkdir()
    _code, two, _ = _import(capsys, tmp_path / "2", "seed/run-qwen3-30B-A3B.sh",
                            "ACTOR_NUM_NODES=2", "ENABLE_R3=0", "NUM_ROLLOUT=2")
    spec = tomllib.loads(two.read_text())
    assert "cpu_offload" not in spec["train"]["optimizer"]
    assert spec["train"]["optimizer"]["distributed"] is True
    assert "routing_replay" not in spec["train"]
    assert spec["rollout"]["num_rollout"] == 2
    (tmp_path / "3").mkdir()
    _code, eplb, _ = _import(capsys, tmp_path / "3", "seed/run-qwen3-30B-A3B-24gpu-eplb.sh")
    plan = _plan(capsys, eplb)
    engine = plan["rollout"]["engines"][0]
    assert (engine["physical_experts"], engine["redundant_experts"], engine["experts_per_gpu"]) \
        == (144, 16, 6)


def _argv_flags(script: str, *env: str) -> list[str]:
    path = SCRIPTS / script
    environ = dict(item.split("=", 1) for item in env)
    from vime.importer.shell import read_script

    reading = read_script(path, path.read_text(), environ)
    return [w.value for w in reading.argv if isinstance(w.value, str) and w.value.startswith("--")]


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_flag_of_the_script_is_a_key_or_explained(case):
    script, env, *_ = CASES[case]
    path = SCRIPTS / script
    result = import_script(path, path.read_text(), dict(item.split("=", 1) for item in env))
    explained = {origin.flag for origin in result.origins.values()}
    said = " ".join(f.message for f in result.findings)
    for flag in _argv_flags(script, *env):
        assert flag in explained or flag in said, f"{flag} neither mapped nor reported"
    assert not any(f.code == "V966" for f in result.findings)


def test_each_key_names_the_flag_and_the_line_it_came_from(capsys, tmp_path):
    script = SCRIPTS / "vime" / "run-qwen3-30B-A3B.sh"
    _code, out, _ = _import(capsys, tmp_path, "vime/run-qwen3-30B-A3B.sh")
    lines = out.read_text().splitlines()
    tp_at = lines.index("tp = 4")
    flag_line = next(n for n, text in enumerate(script.read_text().splitlines(), 1)
                     if "--tensor-model-parallel-size" in text)
    assert lines[tp_at - 1] == f"# --tensor-model-parallel-size (run-qwen3-30B-A3B.sh:{flag_line})"
    # a model flag points into the sourced models file
    assert any(line.startswith("# --num-attention-heads") for line in lines) or \
        "preset = \"qwen3-30b-a3b\"" in lines
    # upstream's --balance-data is train.balance_data, named with its line like every key
    at = lines.index("balance_data = true")
    assert lines[at - 1].startswith("# --balance-data (run-qwen3-30B-A3B.sh:")


def test_a_value_only_a_run_knows_is_an_error_naming_the_variable(capsys, tmp_path):
    code, out, report = _import(capsys, tmp_path, "vime/run-qwen3-4B.sh")
    assert code == 1
    assert "error[V962]: --actor-num-gpus-per-node: NUM_GPUS" in report
    assert "--env NUM_GPUS=VALUE" in report and "error[V969]" in report
    assert out.exists() and "gpus_per_node" not in out.read_text()  # not guessed


def test_output_is_never_overwritten_without_force(capsys, tmp_path):
    out = tmp_path / "mine.toml"
    out.write_text("precious")
    script = str(SCRIPTS / "seed" / "run-qwen3-30B-A3B.sh")
    assert main(["import", script, "-o", str(out)]) == 2
    assert out.read_text() == "precious"
    assert "--force" in capsys.readouterr().err
    assert main(["import", script, "-o", str(out), "--force"]) == 0
    assert tomllib.loads(out.read_text())["train"]["parallel"]["tp"] == 4


def test_bad_env_is_a_usage_error(capsys):
    assert main(["import", str(SCRIPTS / "seed" / "run-qwen3-30B-A3B.sh"), "--env", "NODES"]) == 2
    assert "--env[0]" in capsys.readouterr().err


def test_argv_flag_list(capsys, tmp_path):
    flags = tmp_path / "flags.txt"
    flags.write_text(
        "python3 train.py --actor-num-nodes 1 --actor-num-gpus-per-node 4 --rollout-num-gpus 4 "
        "--hf-checkpoint /m --prompt-data /d.jsonl --num-rollout 2 --rollout-batch-size 4 "
        "--n-samples-per-prompt 2 --global-batch-size 8 --vllm-max-num-seqs 64 "
        "--vllm-enforce-eager --sglang-chunked-prefill-size 4096 "
        "--tensor-model-parallell-size 2 --log-interval 1 # a comment\n")
    out = tmp_path / "spec.toml"
    assert main(["import", "--argv", str(flags), "-o", str(out)]) == 1
    report = capsys.readouterr().err
    spec = tomllib.loads(out.read_text())
    # without --colocate: 4 actor GPUs and 4 rollout GPUs on nodes of 4
    assert (spec["cluster"]["nodes"], spec["train"]["num_gpus"], spec["inference"]["num_gpus"],
            spec["train"]["colocate"]) == (2, 4, 4, False)
    assert spec["inference"]["extra_args"] == ["--max-num-seqs=64", "--enforce-eager"]
    assert "note[V970]: --vllm-max-num-seqs" in report
    assert "error[V967]: --sglang-chunked-prefill-size" in report
    assert "error[V966]: --tensor-model-parallell-size" in report
    assert "did you mean --tensor-model-parallel-size?" in report
    assert "error[V963]: --log-interval: a Megatron flag" in report
    # train.py's defaults where vime's differ
    assert spec["data"]["shuffle"] is False and spec["train"]["dynamic_batch"] is False
    assert spec["train"]["optimizer"]["adam_beta2"] == 0.999


def test_unquoted_array_splits_json_and_the_report_says_why():
    result = import_argv(["--vllm-eplb-config", '{"num_redundant_experts":', "16}"])
    found = [f for f in result.findings if f.code == "V963"]
    assert found and "takes one value" in found[0].message
    assert "inference.eplb.num_redundant_experts" not in result.values


def test_model_args_are_checked_against_a_readable_config_json(tmp_path):
    from vime.resolve.model import PRESETS

    (tmp_path / "config.json").write_text(json.dumps(PRESETS["qwen3-30b-a3b"]))
    same = import_argv(["--hf-checkpoint", str(tmp_path), "--num-layers", "48",
                        "--num-experts", "128", "--untie-embeddings-and-output-weights"])
    assert not [f for f in same.findings if f.code == "V968"]
    assert not [k for k in same.values if k.startswith("model.arch") or k == "model.preset"]
    other = import_argv(["--hf-checkpoint", str(tmp_path), "--num-layers", "36",
                         "--num-experts", "128", "--untie-embeddings-and-output-weights"])
    found = [f for f in other.findings if f.code == "V968"]
    assert len(found) == 1 and "num_hidden_layers = 36" in found[0].message and "48" in \
        found[0].message


def test_model_args_without_config_json_pick_a_preset_and_keep_what_differs():
    result = import_argv(["--hf-checkpoint", "/nowhere", "--num-layers", "36", "--hidden-size",
                          "2560", "--num-attention-heads", "32", "--num-query-groups", "8",
                          "--ffn-hidden-size", "9728", "--rotary-base", "5000000"])
    assert result.values["model.preset"] == "qwen3-4b"
    assert result.values["model.arch.rope_theta"] == 5000000.0
    assert "model.arch.num_hidden_layers" not in result.values


def test_explain_knows_the_import_codes(capsys):
    assert main(["explain", "V964"]) == 0
    assert "not-yet-in-vime" in capsys.readouterr().out


def test_upstream_vime_orchestration_flags_are_known_not_unknown():
    result = import_argv(["--vllm-server-concurrency", "256", "--router-policy", "cache_aware",
                          "--qkv-format", "thd", "--rollout-external"])
    codes = {f.message.split(":")[0]: (f.code, f.severity) for f in result.findings}
    # the client's requests in flight per engine: no effect in vime, which hands each engine
    # its share of a rollout at once
    assert codes["--vllm-server-concurrency 256"] == ("V963", "warning")
    assert "no effect in vime" in next(f.help for f in result.findings
                                       if f.message.startswith("--vllm-server-concurrency"))
    assert codes["--router-policy"] == ("V963", "warning")
    assert codes["--qkv-format thd"] == ("V965", "note")
    assert codes["--rollout-external"][0] == "V963"


def test_estimator_loss_and_lr_schedule_flags_become_their_keys():
    result = import_argv(["--advantage-estimator", "gspo", "--lr-decay-style", "cosine",
                          "--lr-warmup-iters", "10", "--min-lr", "1e-7", "--lr-decay-iters",
                          "300", "--loss-type", "policy_loss", "--calculate-per-token-loss"])
    values = result.values
    assert values["algorithm.advantage_estimator"] == "gspo"
    assert (values["train.optimizer.lr_decay_style"], values["train.optimizer.lr_warmup_iters"],
            values["train.optimizer.min_lr"], values["train.optimizer.lr_decay_iters"]) == \
        ("cosine", 10, 1e-7, 300)
    assert values["algorithm.loss_aggregation"] == "token-mean"
    assert not [f for f in result.findings if f.code in ("V963", "V964")]
    assert "algorithm.name" not in values


def test_without_per_token_loss_the_spec_keeps_train_pys_per_sample_mean():
    result = import_argv(["--advantage-estimator", "rloo"])
    assert result.values["algorithm.loss_aggregation"] == "seq-mean-token-mean"
    assert "--calculate-per-token-loss" in result.origins["algorithm.loss_aggregation"].flag


def test_estimators_losses_and_schedules_vime_lacks_are_errors_naming_the_value():
    result = import_argv(["--advantage-estimator", "ppo", "--lr-decay-style", "WSD",
                          "--loss-type", "sft_loss", "--lr-warmup-fraction", "0.1"])
    errors = {f.message.split(" ")[0]: f for f in result.findings if f.code == "V963"}
    assert set(errors) >= {"--advantage-estimator", "--lr-decay-style", "--loss-type",
                           "--lr-warmup-fraction"}
    assert "ppo" in errors["--advantage-estimator"].message
    assert "lr_warmup_iters" in errors["--lr-warmup-fraction"].help
    assert all(f.severity == "error" for f in errors.values())
    assert "algorithm.advantage_estimator" not in result.values


def test_save_hf_writes_hf_folders_at_every_checkpoint():
    result = import_argv(["--save", "/ckpt", "--save-interval", "20", "--save-hf",
                          "/ckpt/hf/{rollout_id}"])
    assert result.values["checkpoint.save_hf_interval"] == 20
    assert not [f for f in result.findings if "--save-hf" in f.message]
    alone = import_argv(["--save-hf", "/ckpt/hf/{rollout_id}"])
    assert "checkpoint.save_hf_interval" not in alone.values
    [finding] = [f for f in alone.findings if "--save-hf" in f.message]
    assert (finding.code, finding.severity) == ("V963", "warning")


def test_seed_script_imports_its_estimator_schedule_and_loss(capsys, tmp_path):
    code, out, report = _import(capsys, tmp_path, "seed/run-qwen3-30B-A3B.sh")
    spec = tomllib.loads(out.read_text())
    assert spec["algorithm"]["advantage_estimator"] == "grpo"
    assert spec["algorithm"]["loss_aggregation"] == "seq-mean-token-mean"
    assert spec["train"]["optimizer"]["lr_decay_style"] == "constant"


def test_a_reward_vime_does_not_have_is_reported_at_import():
    result = import_argv(["--rm-type", "remote_rm", "--custom-rm-path", "my.rewards.score"])
    found = [f for f in result.findings if f.code == "V963"]
    assert found and "deepscaler" in found[0].message
    assert result.values["rollout.reward"] == "my.rewards:score"
