"""`vime import --argv` counts the flag list's words: its report and the spec's comments say
"word N", where a script's say "file:line"."""

from __future__ import annotations

from pathlib import Path

from vime.importer import import_argv, import_script
from vime.importer.cli import report_text
from vime.importer.toml_out import render

FLAGS = ["--actor-num-nodes", "1", "--lr", "1e-6", "--lr", "2e-6", "--bogus-flag", "3"]


def test_the_report_and_the_spec_name_words_of_a_flag_list():
    result = import_argv(FLAGS)
    report = report_text(result)
    assert ("--argv word 5: warning[V971]: --lr is given twice (word 3 and word 5); the last "
            "is taken") in report
    assert "--argv word 7: error[V966]: --bogus-flag: no parser vime knows has this flag" in report
    assert "--argv:" not in report and "line" not in report
    spec = render(result)
    assert "# --actor-num-nodes (--argv word 1)\nnodes = 1" in spec
    assert "#   error V966 (--argv word 7): --bogus-flag" in spec
    assert "--argv:" not in spec


def test_a_script_still_names_file_and_line():
    text = "python3 train.py \\\n  --lr 1e-6 \\\n  --lr 2e-6\n"
    report = report_text(import_script(Path("/x/run.sh"), text, {}))
    assert ("/x/run.sh:3: warning[V971]: --lr is given twice (line 2 and line 3); the last is "
            "taken") in report
