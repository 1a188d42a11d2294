"""`vime import` on scripts made by mutating the corpus of real launch scripts
(tests/fixtures/scripts/corpus/): lines deleted and duplicated, shell tokens inserted anywhere
(`;;`, `$(`, quotes, `\\`, here-docs, unbalanced brackets), huge and self-doubling arrays, a
script or models file that sources itself. Whatever the text, the import reports diagnostics
and writes TOML; it never raises, and the verb never prints a traceback. The fast tier runs a
fixed sample; the slow tier many more."""

from __future__ import annotations

import contextlib
import io
import shutil
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specsupport import ROOT

from vime.cli import main
from vime.importer import import_script
from vime.importer.toml_out import render

CORPUS = ROOT / "tests" / "fixtures" / "scripts" / "corpus"
SCRIPTS = sorted(path for path in CORPUS.rglob("*.sh") if path.parent.name != "models")
MODELS = sorted(CORPUS.rglob("models/*.sh"))

# shell tokens a mutation inserts: syntax the reader must survive, and constructs that grow
TOKENS = [
    ";;", ";", "&&", "||", "|", "&", "$(", "$((", "((", "))", "`", "(", ")", "{", "}", "${",
    "${A[@]", "${#A[@]}", "${A[@]+\"${A[@]}\"}", "\"", "'", "\\", "\\\n", "\n", " ", "#",
    "[[", "]]", "[ -z \"$X\" ]", "if", "then", "elif", "else", "fi", "for i in 1 2; do",
    "done", "while true; do", "case $X in a) ;; esac", "case", "esac", "<<EOF\n", "<<'EOF'\n",
    "\nEOF\n", "<<<", "< <(", "2>&1", ">/dev/null", "A=(", "A+=(", "X=", "=", "+=",
    "source \"${BASH_SOURCE[0]}\"\n", "source \"$0\"\n", ". ./run.sh\n",
    "source \"${SCRIPT_DIR}/models/none.sh\"\n", "export X=1\n", "unset MODEL_ARGS\n",
    "IFS=, read -r -a A <<< \"a,b,c\"\n", "read -ra N <<< \"$(hostname)\"\n",
    "eval \"$X\"\n", "exit 1\n", "set -- a b\n", "function f { :; }\n", "f() { echo; }\n",
    "A=($(seq 1 100000))\n", "A+=(\"${A[@]}\" \"${A[@]}\")\n", "$(seq 1 999999999)",
    "$((2**64))", "$((1/0))", "${X:?unset}", "${X//a/b}", "${!X}", "ñ", "\x00", "\x1b",
    "--tensor-model-parallel-size", "--colocate", "--decoder-last-pipeline-num-layers", "-1",
    "1e400", "nan", "python3 train.py --actor-num-nodes 1\n", "ray start --head --num-gpus x\n",
]


@st.composite
def _mutation(draw, texts: list[str]) -> str:
    """One corpus text with 1 to 8 edits: a line deleted or duplicated (up to 64 times), a
    token inserted at any character, or a span cut out."""
    text = draw(st.sampled_from(texts))
    for _ in range(draw(st.integers(1, 8))):
        lines = text.split("\n")
        kind = draw(st.sampled_from(["delete", "duplicate", "insert", "insert", "cut"]))
        at = draw(st.integers(0, max(len(lines) - 1, 0)))
        if kind == "delete":
            del lines[at:at + draw(st.integers(1, 5))]
            text = "\n".join(lines)
        elif kind == "duplicate":
            lines[at:at + 1] = lines[at:at + 1] * draw(st.sampled_from([2, 3, 64]))
            text = "\n".join(lines)
        elif kind == "insert":
            spot = draw(st.integers(0, len(text)))
            text = text[:spot] + draw(st.sampled_from(TOKENS)) + text[spot:]
        else:
            start = draw(st.integers(0, len(text)))
            text = text[:start] + text[start + draw(st.integers(1, 200)):]
    return text


SCRIPT_TEXTS = [path.read_text() for path in SCRIPTS]
MODEL_TEXTS = [path.read_text() for path in MODELS]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the corpus's slime checkout, where a mutated script and models file live
    (with a .git folder, so that `source /root/slime/...` is looked for in it)."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(CORPUS / "slime", root, dirs_exist_ok=True)
    (root / ".git").mkdir()
    return root


def _import_never_raises(checkout: Path, script: str, models: str) -> None:
    (checkout / "scripts" / "models" / "mutated.sh").write_text(models, errors="replace")
    script = script.replace("models/qwen3-4B.sh", "models/mutated.sh", 1)
    path = checkout / "scripts" / "run.sh"
    path.write_text(script, errors="replace")
    result = import_script(path, script, {"BASE_DIR": "/data", "X": "a b"})
    assert all(f.code.startswith("V9") for f in result.findings)
    tomllib.loads(render(result))  # the spec written is TOML whatever the script held


def _through_the_verb(path: Path, tmp: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["import", str(path), "-o", str(tmp / "spec.toml"), "--force"])
    assert code in (0, 1), err.getvalue()
    assert "Traceback" not in err.getvalue() and "internal error" not in err.getvalue()


FAST = settings(max_examples=80, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
SLOW = settings(max_examples=1500, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@FAST
@given(script=_mutation(SCRIPT_TEXTS), models=_mutation(MODEL_TEXTS))
def test_a_mutated_corpus_script_never_raises(checkout, script, models):
    _import_never_raises(checkout, script, models)


@pytest.mark.slow
@SLOW
@given(script=_mutation(SCRIPT_TEXTS), models=_mutation(MODEL_TEXTS))
def test_many_mutated_corpus_scripts_never_raise(checkout, script, models):
    _import_never_raises(checkout, script, models)


@FAST
@given(script=_mutation(SCRIPT_TEXTS))
def test_the_verb_on_a_mutated_corpus_script_exits_0_or_1_without_a_traceback(checkout, script):
    path = checkout / "scripts" / "run.sh"
    path.write_text(script, errors="replace")
    _through_the_verb(path, checkout)


def test_every_corpus_script_and_models_file_reads_without_raising(checkout):
    for text in SCRIPT_TEXTS + MODEL_TEXTS:
        _import_never_raises(checkout, text, MODEL_TEXTS[0])


def test_a_script_that_sources_itself_is_said_once():
    """A models file that sources itself (a mutation of upstream's
    `source "$(dirname -- "${BASH_SOURCE[0]}")/qwen3-4B.sh"`, slime's qwen3-4B-Instruct-2507.sh)
    is read once, with one V960."""
    path = CORPUS / "slime" / "scripts" / "run-qwen3-32B.sh"
    text = 'source "${BASH_SOURCE[0]}"\n' + path.read_text()
    result = import_script(path, text, {})
    said = [f for f in result.findings if "sources itself" in f.message]
    assert len(said) == 1 and said[0].code == "V960"
