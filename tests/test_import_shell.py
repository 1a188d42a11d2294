"""The bash-subset reader of `vime import`: what it follows, what it reports, and that no
script makes it (or the verb) raise."""

from __future__ import annotations

import io
import tomllib
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vime.cli import main
from vime.importer import import_script
from vime.importer.shell import Unknown, read_script
from vime.importer.toml_out import render


def _argv(text: str, env: dict[str, str] | None = None, tmp: Path | None = None) -> list:
    path = (tmp or Path("/nonexistent")) / "run.sh"
    reading = read_script(path, text, env or {})
    assert reading.argv is not None, reading.notes
    return [w.value if isinstance(w.value, str) else w.value for w in reading.argv]


def _codes(text: str, env: dict[str, str] | None = None) -> list[str]:
    return [n.code for n in read_script(Path("/x/run.sh"), text, env or {}).notes]


def test_defaults_env_and_nested_defaults():
    text = ('NODES=${ACTOR_NUM_NODES:-1}\nTP=${MEGATRON_TP:-${DEFAULT_TP:-4}}\n'
            'python3 train.py --actor-num-nodes $NODES --tp "${TP}"\n')
    assert _argv(text) == ["--actor-num-nodes", "1", "--tp", "4"]
    assert _argv(text, {"ACTOR_NUM_NODES": "3", "DEFAULT_TP": "2"}) == \
        ["--actor-num-nodes", "3", "--tp", "2"]
    assert _argv(': ${X:=7}\npython train.py --x $X\n') == ["--x", "7"]


def test_arrays_append_comments_and_continuations():
    text = ("A=(\n  --one 1   # a comment\n  # --commented-out\n  --two \\\n   2\n)\n"
            "A+=(--three)\nB=(\"a b\" c)\n"
            "python3 train.py \\\n  ${A[@]} \"${B[@]}\" ${B[@]}\n")
    assert _argv(text) == ["--one", "1", "--two", "2", "--three", "a b", "c", "a", "b", "c"]


def test_array_elements_remember_their_line(tmp_path):
    text = "ARGS=(\n   --lr 1e-6\n)\n\npython3 train.py ${ARGS[@]}\n"
    reading = read_script(tmp_path / "run.sh", text, {})
    assert [(w.value, w.line) for w in reading.argv] == [("--lr", 2), ("1e-6", 2)]


def test_seq_and_arithmetic():
    text = ("N=${NODES:-2}\nG=$((N * 8))\nH=$(( (G + 1) / 2 ))\n"
            "python3 train.py --sizes 1 $(seq 16 8 40) --g $G --h $H --q $(seq 3)\n")
    assert _argv(text) == ["--sizes", "1", "16", "24", "32", "40", "--g", "16", "--h", "8",
                           "--q", "1", "2", "3"]


def test_if_elif_else_on_known_values():
    text = ('if [[ "$N" -gt 1 ]]; then\n  TP=8\nelif [ "$N" == "1" ] && [[ -n "$BIG" ]]; then\n'
            '  TP=4\nelse\n  TP=2\nfi\npython3 train.py --tp $TP\n')
    assert _argv(text, {"N": "2"}) == ["--tp", "8"]
    assert _argv(text, {"N": "1", "BIG": "y"}) == ["--tp", "4"]
    assert _argv(text, {"N": "1"}) == ["--tp", "2"]


def test_an_undecidable_condition_makes_its_values_unknown():
    text = ('if [ "$(nvidia-smi -L | wc -l)" -gt 4 ]; then\n  TP=8\nfi\n'
            'python3 train.py --tp $TP\n')
    argv = _argv(text)
    assert argv[0] == "--tp" and isinstance(argv[1], Unknown)
    assert "TP" in argv[1].why and "--env TP=" in argv[1].why
    assert "V960" in _codes(text)


def test_command_substitution_is_never_run(tmp_path):
    marker = tmp_path / "ran"
    text = (f"X=$(touch {marker})\nY=`touch {marker}`\neval touch {marker}\n"
            f"( touch {marker} )\ntouch {marker}\npython3 train.py --x $X\n")
    argv = _argv(text, tmp=tmp_path)
    assert isinstance(argv[1], Unknown) and not marker.exists()
    codes = _codes(text)
    assert codes.count("V960") >= 2 and "V961" in codes


def test_source_relative_to_the_script_and_export(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.sh").write_text("export LAYERS=48\nMODEL_ARGS=(--num-layers $LAYERS)\n")
    text = ('SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"\n'
            'source "${SCRIPT_DIR}/models/m.sh"\n. /elsewhere/scripts/models/m.sh\n'
            'python3 train.py ${MODEL_ARGS[@]}\n')
    assert _argv(text, tmp=tmp_path) == ["--num-layers", "48"]
    missing = read_script(tmp_path / "run.sh", "source models/none.sh\npython3 train.py\n", {})
    assert [n.code for n in missing.notes] == ["V974"]


def test_loops_and_functions_are_skipped_and_named():
    text = ("for i in 1 2; do\n  X=$i\ndone\nf() {\n  Y=1\n}\ncase $Z in\n a) W=1;;\nesac\n"
            "python3 train.py --x $X\n")
    argv = _argv(text)
    assert isinstance(argv[1], Unknown)
    assert _codes(text).count("V960") == 3


def test_no_train_command_is_v973(tmp_path):
    script = tmp_path / "run.sh"
    result = import_script(script, "echo hello\n", {})
    assert [f.code for f in result.findings] == ["V961", "V973"]
    assert not result.complete


WORDS = st.sampled_from([
    "--flag", "--rollout-batch-size", "4", "--vllm-max-num-seqs", "--sglang-x", "$X", "${X:-1}",
    "${A[@]}", '"${A[@]}"', "'a b'", '"q $X"', "$(seq 1 3)", "$((1+X))", "$(date)", "`date`",
    "\\", "\\\n", "#", "(", ")", "[[", "]]", ";", "&&", "||", "|", "&", "<", ">", "=", "+=",
    "A=(", "X=", "if", "then", "fi", "else", "for", "do", "done", "source", ".", "export",
    "\"", "'", "${", "$((", "$(", "{", "}", "\n", " ", "\t", "ñ", "\x00", "train.py",
    "python3 train.py", "--tensor-model-parallel-size", "--colocate", "--vllm-eplb-config",
    '\'{"num_redundant_experts": 16}\'', "--moe-layer-freq", "[1,0]", "1e400", "-1",
])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(WORDS, max_size=40), st.dictionaries(st.sampled_from(["X", "A", "N"]),
                                                      st.text(max_size=5), max_size=2))
def test_fuzz_random_scripts_never_raise(words, env):
    text = " ".join(words)
    result = import_script(Path("/nonexistent/run.sh"), text, env)
    assert all(f.code.startswith("V9") for f in result.findings)
    tomllib.loads(render(result))  # the written spec is TOML whatever the script held


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_any_text_through_the_verb_exits_0_1_or_2(tmp_path_factory, text):
    script = tmp_path_factory.mktemp("fuzz") / "run.sh"
    script.write_text(text + "\npython3 train.py " + text.replace("\n", " "), errors="replace")
    out, err = io.StringIO(), io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["import", str(script)])
    assert code in (0, 1), err.getvalue()
    assert "Traceback" not in err.getvalue() and "internal error" not in err.getvalue()


def test_control_characters_of_a_script_stay_valid_toml():
    text = "source \x00\npython3 train.py --x\x01y 1 --hf-checkpoint '/m\x7f' --num-rollout \x1b\n"
    result = import_script(Path("/nonexistent/run.sh"), text, {})
    spec = tomllib.loads(render(result))
    assert spec["model"]["hf_checkpoint"] == "/m\x7f"


def test_heredocs_redirections_and_exec():
    text = ("cat > notes.txt <<'EOF'\nTP=99\npython3 train.py --tp 99\nEOF\nTP=2\n"
            "exec python3 train.py --tp $TP --seed 3 2>&1 | tee log.txt\n")
    assert _argv(text) == ["--tp", "2", "--seed", "3"]
    assert _argv("python3 train.py --seed 3 > log.txt\n") == ["--seed", "3"]


def test_expansions_nested_too_deep_are_reported_not_raised():
    text = "X=" + "${A:-" * 3000 + "1" + "}" * 3000 + "\npython3 train.py --x $X\n"
    result = import_script(Path("/nonexistent/run.sh"), text, {})
    assert any(f.code == "V960" for f in result.findings)
