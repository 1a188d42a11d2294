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
