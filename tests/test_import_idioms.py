"""Shell idioms of real launch scripts that `vime import`'s reader follows: each test quotes
the lines as upstream writes them (repository, path and commit in the test's docstring)."""

from __future__ import annotations

from pathlib import Path

from vime.importer import import_script
from vime.importer.shell import Unknown, read_script

FIXTURES = Path(__file__).parent / "fixtures" / "scripts"


def _reading(text: str, env: dict[str, str] | None = None, tmp: Path | None = None):
    reading = read_script((tmp or Path("/nonexistent")) / "run.sh", text, env or {})
    assert reading.argv is not None, reading.notes
    return reading


def _argv(text: str, env: dict[str, str] | None = None, tmp: Path | None = None) -> list:
    return [w.value for w in _reading(text, env, tmp).argv]


# THUDM/slime examples/tau-bench/tau2/run_grpo.sh at 153ea86f783b1ca1a17922b9912f954c854cdf79
TAU2_TAIL = ('ray job submit --address="http://127.0.0.1:8265" \\\n'
             '  --runtime-env-json="${RUNTIME_ENV_JSON}" \\\n'
             '  -- python3 train.py \\\n'
             '  --actor-num-nodes 1 \\\n'
             '  ${WANDB_ARGS[@]+"${WANDB_ARGS[@]}"} \\\n'
             '  ${CUSTOM_ARGS[@]}\n')
TAU2_ARRAYS = ('CUSTOM_ARGS=(\n'
               '  --custom-generate-function-path rollout.generate\n'
               ')\n')


def test_an_array_behind_a_plus_expansion_gives_its_elements():
    """`${WANDB_ARGS[@]+"${WANDB_ARGS[@]}"}` (slime's tau2 run_grpo.sh): the array's
    elements, one word each, and the next array's words stay their own flags."""
    wandb = ('WANDB_ARGS=(\n'
             '  --use-wandb\n'
             '  --wandb-project "tau2-cookbook"\n'
             '  --wandb-group "grpo-qwen3-4b"\n'
             '  --wandb-exp-name "tau2-grpo v1"\n'
             ')\n')
    assert _argv(wandb + TAU2_ARRAYS + TAU2_TAIL) == [
        "--actor-num-nodes", "1", "--use-wandb", "--wandb-project", "tau2-cookbook",
        "--wandb-group", "grpo-qwen3-4b", "--wandb-exp-name", "tau2-grpo v1",
        "--custom-generate-function-path", "rollout.generate"]


def test_a_plus_expansion_of_an_empty_or_unset_array_is_no_word():
    for before in ("WANDB_ARGS=()\n", ""):
        argv = _argv(before + TAU2_ARRAYS + TAU2_TAIL)
        assert argv == ["--actor-num-nodes", "1", "--custom-generate-function-path",
                        "rollout.generate"], before


def test_a_minus_expansion_of_an_array_gives_its_default_when_it_has_no_element():
    text = 'A=()\nB=(--b 2)\npython3 train.py ${A[@]-"--a 1"} ${B[@]:-x}\n'
    assert _argv(text) == ["--a 1", "--b", "2"]


# THUDM/slime scripts/run-gemma4-26B-A4B-gsm8k.sh at e734ee75f9c4ea29fa4745f02151d758222ac943
GEMMA4 = '''EVAL_ARGS=()
if [ "${ENABLE_EVAL:-0}" = "1" ]; then
   EVAL_ARGS=(
      --eval-interval "${EVAL_INTERVAL:-20}"
      --eval-top-p 1
   )
fi

GRPO_ARGS=(
   --advantage-estimator grpo
   --entropy-coef "${ENTROPY_COEF:-0.001}"
)

WANDB_ARGS=()
if [ "${USE_WANDB:-0}" = "1" ]; then
   WANDB_ARGS=(
      --use-wandb
   )
fi

SGLANG_ARGS=(
   --rollout-num-gpus-per-engine "${ROLLOUT_TP_SIZE:-8}"
)

ray job submit --address="http://127.0.0.1:8265" \\
   --runtime-env-json="${RUNTIME_ENV_JSON}" \\
   -- python3 train.py \\
   --actor-num-nodes 1 \\
   "${GRPO_ARGS[@]}" \\
   "${WANDB_ARGS[@]}" \\
   "${EVAL_ARGS[@]}" \\
   "${SGLANG_ARGS[@]}" \\
   "${MISC_ARGS[@]}"
'''


def test_a_quoted_array_without_elements_is_no_word():
    """`"${WANDB_ARGS[@]}"` of `WANDB_ARGS=()` (slime's run-gemma4-26B-A4B-gsm8k.sh) is no
    word at all, as in bash: not an empty word that becomes --entropy-coef's second value."""
    assert _argv(GEMMA4) == ["--actor-num-nodes", "1", "--advantage-estimator", "grpo",
                             "--entropy-coef", "0.001", "--rollout-num-gpus-per-engine", "8"]
    assert _argv(GEMMA4, {"USE_WANDB": "1", "ENABLE_EVAL": "1"}) == [
        "--actor-num-nodes", "1", "--advantage-estimator", "grpo", "--entropy-coef", "0.001",
        "--use-wandb", "--eval-interval", "20", "--eval-top-p", "1",
        "--rollout-num-gpus-per-engine", "8"]
    # an empty quoted word stays one word, as bash keeps it
    assert _argv('E=()\npython3 train.py --x "" --y "${E[*]}" "$UNSET_BUT_EMPTY"\n',
                 {"UNSET_BUT_EMPTY": ""}) == ["--x", "", "--y", "", ""]


# THUDM/slime examples/qwen3_8b_opd_tillicum/container_exec.sh at
# 3d3af7d39d89a4bedb816f42e44767c8b1592721 (and examples/multidomain_v1's launcher at b7fcd623:
# IFS=',' read -r -a TRAIN_POOL_DATASET_ARRAY <<< "${TRAIN_POOL_DATASETS}")
BIND_ROOTS = 'IFS=\',\' read -r -a BIND_ROOTS <<< "${CONTAINER_BIND_ROOTS}"\n'


def test_read_into_an_array_from_a_here_string_of_known_text_splits_it():
    text = (BIND_ROOTS + 'N=${#BIND_ROOTS[@]}\n'
            'python3 train.py --roots "${BIND_ROOTS[@]}" --n $N --first ${BIND_ROOTS[0]}\n')
    argv = _argv(text, {"CONTAINER_BIND_ROOTS": "/scratch,/gscratch,,/data"})
    assert argv[:7] == ["--roots", "/scratch", "/gscratch", "", "/data", "--n", "4"]
    # the spelling of the issue: IFS=, and -ra; the prefix IFS holds for read alone
    text = ('GPUS=0,1,2,3\nIFS=, read -ra GPU_LIST <<< "$GPUS"\n'
            'read -r FIRST REST <<< "a b  c "\n'
            'python3 train.py --n ${#GPU_LIST[@]} --first "$FIRST" --rest "$REST"\n')
    assert _argv(text) == ["--n", "4", "--first", "a", "--rest", "b  c"]


def test_read_from_input_the_reader_cannot_see_makes_the_variable_unknown():
    """A here-string of a command's output (the Slurm idiom `read -ra NODES <<< "$(scontrol
    show hostnames ...)"`) or slime's `read -r -a TEST_ARGS_ARRAY < <(printf "%s\\n"
    "$TEST_ARGS")` (.github/workflows/pr-test.yml at 624b824a): the variable is unknown and
    the line says so; a count of its elements is never 0."""
    text = ('read -ra NODES <<< "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr \'\\n\' '
            '\' \')"\n'
            'NUM_NODES=${#NODES[@]}\n'
            'read -r -a TEST_ARGS_ARRAY < <(printf "%s\\n" "$TEST_ARGS")\n'
            'python3 train.py --actor-num-nodes ${NUM_NODES} --rollout-num-gpus $((NUM_NODES * 8 - 2))'
            ' "${TEST_ARGS_ARRAY[@]}"\n')
    reading = _reading(text)
    values = [w.value for w in reading.argv]
    assert values[0] == "--actor-num-nodes" and isinstance(values[1], Unknown)
    assert "NODES" in values[1].why and "line 1" in values[1].why
    assert values[2] == "--rollout-num-gpus" and isinstance(values[3], Unknown)
    assert isinstance(values[4], Unknown) and "TEST_ARGS_ARRAY" in values[4].why
    said = {(n.code, n.line) for n in reading.notes}
    assert ("V960", 1) in said and ("V960", 3) in said
    result = import_script(Path("/nonexistent/run.sh"), text, {})
    assert any(f.code == "V969" for f in result.findings)  # the cluster's size is unknown
    assert "cluster.nodes" not in result.values


# THUDM/slime examples/eval_multi_task/multi_task.sh at 624b824a898ab0ec1fcb4d373004c7f3852bf515
MULTI_TASK = '''SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
REPO_ROOT="$(cd -- "${SCRIPT_DIR}/../.." &>/dev/null && pwd)"
source "${REPO_ROOT}/scripts/models/qwen3-4B.sh"
EVAL_CONFIG_PATH="${REPO_ROOT}/examples/eval_multi_task/multi_task.yaml"

ray job submit --address="http://127.0.0.1:8265" \\
   --runtime-env-json="${RUNTIME_ENV_JSON}" \\
   -- python3 "${REPO_ROOT}/train.py" \\
   --actor-num-nodes 1 \\
   --actor-num-gpus-per-node 8 \\
   --colocate \\
   ${MODEL_ARGS[@]}
'''


def test_a_repo_root_found_with_cd_and_pwd_reaches_train_py_and_the_models_file(tmp_path):
    models = tmp_path / "scripts" / "models"
    models.mkdir(parents=True)
    (models / "qwen3-4B.sh").write_bytes((FIXTURES / "slime" / "models" / "qwen3-4B.sh")
                                         .read_bytes())
    folder = tmp_path / "examples" / "eval_multi_task"
    folder.mkdir(parents=True)
    reading = read_script(folder / "multi_task.sh", MULTI_TASK, {})
    assert reading.argv is not None, reading.notes
    argv = [w.value for w in reading.argv]
    assert argv[:5] == ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--colocate"]
    assert argv[argv.index("--num-layers") + 1] == "36"
    assert reading.sourced == [str(models / "qwen3-4B.sh")]
    assert reading.entry == "train.py"


def test_train_py_in_a_folder_the_reader_cannot_know_is_still_train_py():
    text = ('REPO_ROOT="$(git rev-parse --show-toplevel)"\n'
            'python3 "${REPO_ROOT}/train_async.py" --lr 1e-6\n')
    reading = _reading(text)
    assert [w.value for w in reading.argv] == ["--lr", "1e-6"]
    assert reading.entry == "train_async.py"
    # a word that only ends in train.py after a variable names no folder: not train.py
    assert read_script(Path("/x/run.sh"), 'python3 "${X}train.py" --lr 1\n', {}).argv is None


# THUDM/slime scripts/models/qwen3-4B-Instruct-2507.sh at 624b824a (the whole file)
INSTRUCT_2507 = ('MODEL_ARGS_ROTARY_BASE=5000000 source "$(dirname -- "${BASH_SOURCE[0]}")/'
                 'qwen3-4B.sh"')


def test_an_assignment_before_source_holds_while_the_file_is_read(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "qwen3-4B.sh").write_bytes((FIXTURES / "slime" / "models" / "qwen3-4B.sh")
                                         .read_bytes())
    (models / "qwen3-4B-Instruct-2507.sh").write_text(INSTRUCT_2507)
    text = ('SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"\n'
            'source "${SCRIPT_DIR}/models/qwen3-4B-Instruct-2507.sh"\n'
            'python3 train.py ${MODEL_ARGS[@]} --after "${MODEL_ARGS_ROTARY_BASE:-unset}"\n')
    reading = read_script(tmp_path / "run.sh", text, {})
    assert reading.argv is not None, reading.notes
    argv = [w.value for w in reading.argv]
    assert argv[argv.index("--rotary-base") + 1] == "5000000"
    assert argv[-2:] == ["--after", "unset"]  # the assignment ends with the source
    assert not reading.notes, reading.notes
