"""Flags and entry points of real launch scripts that `vime import` maps or names: each test
quotes the lines as upstream writes them (repository, path and commit in the docstring)."""

from __future__ import annotations

from pathlib import Path

from vime.importer import import_argv, import_script
from vime.importer.shell import read_script


def _findings(result, flag: str) -> list:
    return [f for f in result.findings if flag in f.message]


def test_a_kl_coef_of_zero_is_kl_off():
    """`--kl-coef 0.00` in GRPO_ARGS (THUDM/slime scripts/run-glm4.7-30B-A3B.sh at
    624b824a898ab0ec1fcb4d373004c7f3852bf515): the reward's KL off, which is vime's; a
    coefficient above 0 is a KL vime does not have."""
    grpo_args = ["--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.00",
                 "--kl-loss-type", "low_var_kl", "--kl-coef", "0.00", "--entropy-coef", "0.00"]
    said = _findings(import_argv(grpo_args), "--kl-coef")
    assert [(f.code, f.severity) for f in said] == [("V965", "note")], said
    said = _findings(import_argv(["--kl-coef", "0.01"]), "--kl-coef")
    assert [(f.code, f.severity) for f in said] == [("V963", "error")], said
    assert "vime uses --kl-coef 0" in said[0].message


def test_sglang_expert_parallelism_becomes_the_engines_expert_parallelism():
    """`--sglang-ep-size 32` (THUDM/slime scripts/run-qwen3-235B-A22B.sh at 624b824a) and
    `--sglang-expert-parallel-size 8` (scripts/low_precision/run-qwen3-30b-a3b-fp8.sh at
    624b824a) in SGLANG_ARGS."""
    for sglang_args in (["--rollout-num-gpus-per-engine", "32", "--sglang-enable-dp-attention",
                         "--sglang-dp-size", "4", "--sglang-ep-size", "32"],
                        ["--rollout-num-gpus-per-engine", "8", "--sglang-mem-fraction-static",
                         "0.6", "--sglang-expert-parallel-size", "8"]):
        result = import_argv(sglang_args)
        assert result.values["inference.expert_parallel"] is True, sglang_args
        flag = sglang_args[-2]
        said = _findings(result, flag)
        assert [(f.code, f.severity) for f in said] == [("V967", "warning")], said
        assert "becomes inference.expert_parallel" in said[0].message
    assert import_argv(["--sglang-ep-size", "1"]).values["inference.expert_parallel"] is False
    said = _findings(import_argv(["--sglang-ep-size", "0"]), "--sglang-ep-size")
    assert [f.code for f in said] == ["V963"]


# THUDM/slime examples/fully_async/run-qwen2.5-0.5B-fully_async.sh at 624b824a
FULLY_ASYNC = '''ACTOR_GPUS=${ACTOR_GPUS:-1}
ROLLOUT_GPUS=${ROLLOUT_GPUS:-$((NUM_GPUS - ACTOR_GPUS))}

ray job submit --address="http://127.0.0.1:8265" \\
   --runtime-env-json="${RUNTIME_ENV_JSON}" \\
   -- python3 train_async.py \\
   --actor-num-nodes 1 \\
   --actor-num-gpus-per-node "${ACTOR_GPUS}" \\
   --rollout-num-gpus "${ROLLOUT_GPUS}" \\
   "${MISC_ARGS[@]}"
'''


def test_train_async_py_is_one_step_asynchrony():
    result = import_script(Path("/nonexistent/run-qwen2.5-0.5B-fully_async.sh"), FULLY_ASYNC,
                           {"NUM_GPUS": "8"})
    assert result.values["rollout.async"] == "one_step"
    assert (result.origins["rollout.async"].flag, result.origins["rollout.async"].line) == \
        ("train_async.py", 4)
    assert not [f for f in result.findings if f.code == "V964"]
    assert result.values["train.num_gpus"] == 1 and result.values["inference.num_gpus"] == 7
    plain = import_script(Path("/nonexistent/run.sh"), FULLY_ASYNC.replace("train_async.py",
                                                                           "train.py"),
                          {"NUM_GPUS": "8"})
    assert "rollout.async" not in plain.values
    # upstream's fully-async rollout function (a buffer across weight updates) is not vime's
    buffered = import_script(Path("/nonexistent/run.sh"), FULLY_ASYNC.replace(
        '   "${MISC_ARGS[@]}"', "   --rollout-function-path "
        "fully_async_rollout.generate_rollout_fully_async \\\n   \"${MISC_ARGS[@]}\""),
        {"NUM_GPUS": "8"})
    said = [f for f in buffered.findings if f.code == "V964"]
    assert [(f.severity, f.line) for f in said] == [("warning", 4)], said
    assert 'planned: rollout.async = "buffer"' in said[0].message


# vllm-project/vime agent_run/local_multi_turn_smoke/run_rl.sh at
# 009ea3cb75dff0afb2d51163dd5cd7fe50627b02: a comment line after a '\' ends the command
RUN_RL = '''ray job submit --address=http://127.0.0.1:8265 \\
  --runtime-env-json="${RUNTIME_ENV_JSON}" \\
  -- python -u train.py \\
  --num-rollout ${NUM_ROLLOUT:-2} \\
  --rollout-batch-size ${RB:-4} \\
  # n-samples-per-prompt and rollout-temperature are both load-bearing for GRPO:
  # the advantage is computed within a prompt's sample group, so one sample -- or
  # n identical greedy samples -- gives an advantage of exactly zero and no
  # gradient. Changing only one of the two does not help. Measured: at n=4 this
  # task set showed 2/10 prompts with usable variance, at n=8 it showed 4/10.
  --n-samples-per-prompt ${N_SAMPLES:-8} \\
  --rollout-max-context-len ${CTX:-32768} \\
  --rollout-max-response-len ${RESP:-4096} \\
  --rollout-stop-token-ids 151645 151643 \\
  # temperature > 0 and n-samples-per-prompt > 1 are both load-bearing for GRPO:
  # the advantage is computed within a prompt's sample group, so a single sample
  # (or n identical greedy samples) gives an advantage of exactly zero and no
  # gradient. Changing only one of the two does not help.
  --rollout-temperature 1.0 \\
  --num-steps-per-rollout 1 \\
  2>&1 | tee "${RUN_ROOT}/run.log"

echo "RUN_ROOT=${RUN_ROOT}" | tee "${RUN_ROOT}/completed.txt"
'''


def test_a_line_of_flags_after_the_train_command_ended_gets_a_hint_naming_it():
    reading = read_script(Path("/nonexistent/run_rl.sh"), RUN_RL, {})
    assert [w.value for w in reading.argv] == ["--num-rollout", "2", "--rollout-batch-size", "4"]
    hints = [n for n in reading.notes if "missing" in n.message]
    assert [(n.code, n.line) for n in hints] == [("V960", 11), ("V960", 19)], reading.notes
    assert hints[0].message.startswith("line 11 begins with --n-samples-per-prompt, but the "
                                       "command that runs train.py ends on line 5")
    # a flag line after any other command is only a command the reader does not run
    later = read_script(Path("/x/run.sh"), "python3 train.py --lr 1\necho done\n--x 1\n", {})
    assert not [n for n in later.notes if "missing" in n.message]


def test_weight_buffer_and_server_concurrency_are_noted_as_having_no_effect():
    """`--update-weight-buffer-size $(( 1024 * 1024 * 1024 * 4 ))` (THUDM/slime
    scripts/run-qwen3-235B-A22B.sh at 624b824a) and `--vllm-server-concurrency` (upstream
    vime's train.py flag, vime/data/upstream-flags.json: "Max concurrent inference requests
    sent to each vLLM server worker", 512 by default): settings of upstream's weight push and
    client that vime's own do instead; a warning, not an error."""
    result = import_argv(["--update-weight-buffer-size", str(4 * 2**30),
                          "--vllm-server-concurrency", "64"])
    for flag in ("--update-weight-buffer-size", "--vllm-server-concurrency"):
        [said] = [f for f in result.findings if f.message.startswith(flag)]
        assert (said.code, said.severity) == ("V963", "warning"), said
        assert "no effect in vime" in said.help
    assert "inference.extra_args" not in result.values


# THUDM/slime-style run of a Qwen3-4B (scripts/models/qwen3-4B.sh's MODEL_ARGS at 624b824a)
# with upstream vime's VLLM_ARGS of scripts/run-gpt-oss-20B.sh (vllm-project/vime at
# 45d26df9): --vllm-tensor-parallel-size beside --rollout-num-gpus-per-engine's default
QWEN3_4B_RUN = """--swiglu --num-layers 36 --hidden-size 2560 --ffn-hidden-size 9728
--num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128
--use-rotary-position-embeddings --disable-bias-linear --normalization RMSNorm
--norm-epsilon 1e-6 --rotary-base 1000000 --vocab-size 151936 --qk-layernorm
--hf-checkpoint /nonexistent/Qwen3-4B --prompt-data /nonexistent/p.jsonl --num-rollout 2
--rollout-batch-size 8 --n-samples-per-prompt 4 --rollout-max-prompt-len 1024
--rollout-max-response-len 3072 --actor-num-nodes 1 --actor-num-gpus-per-node 4
--rollout-num-gpus 4 --vllm-tensor-parallel-size 1 --vllm-gpu-memory-utilization 0.55
--vllm-max-num-seqs 64 --vllm-max-cudagraph-capture-size 16 --vllm-max-model-len 4096"""


def test_vllm_flags_vime_sets_never_reach_extra_args_which_plan_would_refuse(tmp_path):
    import shlex

    from vime import pipeline
    from vime.importer.toml_out import render
    from vime.parse import Source

    result = import_argv(shlex.split(QWEN3_4B_RUN))
    assert result.values["inference.extra_args"] == ["--max-num-seqs=64",
                                                     "--max-cudagraph-capture-size=16"]
    said = {f.message.split(":")[0]: (f.code, f.severity) for f in result.findings}
    assert said["--vllm-tensor-parallel-size 1"] == ("V965", "note")
    assert said["--vllm-max-model-len 4096"] == ("V965", "note")
    planned = pipeline.run(Source("imported.toml", render(result, str(tmp_path))), [], tmp_path)
    assert "V507" not in {d.code for d in planned.diagnostics}
    other = import_argv(shlex.split(QWEN3_4B_RUN.replace("--vllm-tensor-parallel-size 1",
                                                         "--vllm-tensor-parallel-size 2")))
    [tp] = [f for f in other.findings if f.message.startswith("--vllm-tensor-parallel-size")]
    assert (tp.code, tp.severity) == ("V963", "error")
    assert "TP = gpus_per_engine ÷ data_parallel_size = 1 ÷ 1 = 1" in tp.message


def test_router_pre_softmax_is_norm_topk_prob_false_and_its_absence_true():
    """slime's models files give a Qwen3-MoE no --moe-router-pre-softmax (scripts/models/
    qwen3-30B-A3B.sh at 624b824a: Megatron's softmax over the top-k, HF's norm_topk_prob
    true) and DeepSeek-V3 the flag beside sigmoid scores (scripts/models/deepseek-v3.sh)."""
    moe = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
           "--vocab-size", "1000", "--ffn-hidden-size", "512", "--num-experts", "8",
           "--moe-router-topk", "2", "--moe-ffn-hidden-size", "128", "--qk-layernorm"]
    assert import_argv(moe).values["model.arch.norm_topk_prob"] is True
    pre = import_argv([*moe, "--moe-router-pre-softmax"])
    assert pre.values["model.arch.norm_topk_prob"] is False
    assert not _findings(pre, "--moe-router-pre-softmax")
    sigmoid = import_argv([*moe, "--moe-router-score-function", "sigmoid",
                           "--moe-router-pre-softmax"])
    said = _findings(sigmoid, "--moe-router-pre-softmax")
    assert [(f.code, f.severity) for f in said] == [("V965", "note")], said
    assert "renormalises the top-k weights either way" in said[0].message


def test_yarn_flags_name_the_missing_capability():
    """DeepSeek-V3's rope scaling in THUDM/slime scripts/models/deepseek-v3.sh at 624b824a:
    `--rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0`."""
    result = import_argv(["--multi-latent-attention", "--rotary-scaling-factor", "40",
                          "--mscale", "1.0", "--mscale-all-dim", "1.0", "--rope-type", "yarn"])
    for flag in ("--rotary-scaling-factor", "--mscale 1.0", "--mscale-all-dim", "--rope-type"):
        [said] = _findings(result, flag)
        assert (said.code, said.severity) == ("V964", "error"), said
        assert "rope_scaling" in said.message
    [plain] = _findings(import_argv(["--rope-type", "rope"]), "--rope-type")
    assert (plain.code, plain.severity) == ("V965", "note")


def test_kernel_choices_and_vocabulary_padding_are_notes():
    """`--no-rope-fusion` (THUDM/slime scripts/models/deepseek-v3.sh at 624b824a, and four
    more of the corpus), `--no-masked-softmax-fusion` and `--make-vocab-size-divisible-by 128`
    (vllm-project/vime scripts/models/gpt-oss-20B.sh at 96e0e22e): choices of kernels and
    of padding that do not change the layers vime trains."""
    flags = ["--no-rope-fusion", "--no-masked-softmax-fusion", "--cross-entropy-loss-fusion",
             "--make-vocab-size-divisible-by", "128"]
    result = import_argv(flags)
    for flag in ("--no-rope-fusion", "--no-masked-softmax-fusion",
                 "--cross-entropy-loss-fusion", "--make-vocab-size-divisible-by"):
        assert [(f.code, f.severity) for f in _findings(result, flag)] == [("V965", "note")]


def test_yarn_flags_are_checked_against_the_preset_the_model_args_match(tmp_path):
    """THUDM/slime scripts/models/deepseek-v3.sh at 624b824a gives DeepSeek-R1's YaRN as
    `--rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0` and moonlight.sh
    `--rotary-scaling-factor 1` (none): notes where the matched preset holds the same, V968
    where a copy of the models file says another factor."""
    corpus = Path(__file__).parent / "fixtures" / "scripts" / "corpus" / "slime" / "scripts"
    models = (corpus / "models" / "deepseek-v3.sh").read_text()
    argv = ["--hf-checkpoint", "/root/DeepSeek-R1", "--prompt-data", "/root/p.jsonl"]
    script = tmp_path / "run.sh"
    script.write_text(f'{models}\npython3 train.py "${{MODEL_ARGS[@]}}" {" ".join(argv)}\n')
    result = import_script(script, script.read_text(), {})
    assert result.values["model.preset"] == "deepseek-r1"
    for flag in ("--rotary-scaling-factor 40", "--mscale 1.0", "--mscale-all-dim 1.0"):
        [said] = _findings(result, flag)
        assert (said.code, said.severity) == ("V965", "note"), said
        assert "as in the preset deepseek-r1" in said.message
    script.write_text(script.read_text().replace("--rotary-scaling-factor 40",
                                                 "--rotary-scaling-factor 20"))
    [said] = _findings(import_script(script, script.read_text(), {}), "--rotary-scaling-factor")
    assert (said.code, said.severity) == ("V968", "error"), said
    assert "rope_scaling.factor = 40" in said.message
    moonlight = tmp_path / "moonlight.sh"
    moonlight.write_text((corpus / "models" / "moonlight.sh").read_text()
                         + f'\npython3 train.py "${{MODEL_ARGS[@]}}" {" ".join(argv)}\n')
    for flag in ("--rotary-scaling-factor 1", "--mscale 1.0"):
        [said] = _findings(import_script(moonlight, moonlight.read_text(), {}), flag)
        assert (said.code, said.severity) == ("V965", "note"), said
