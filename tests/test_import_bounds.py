"""`vime import` reads any script in bounded time: a stray `;;`, an array that doubles itself
and a script that sources itself each end quickly with a diagnostic naming the line."""

from __future__ import annotations

import subprocess
import sys
import time

TRAIN = "python3 train.py --lr 1e-6 ${ARGS[@]}\n"


def _import(tmp_path, text: str, name: str = "run.sh") -> tuple[str, float]:
    script = tmp_path / name
    script.write_text(text)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "vime", "import", str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)
    took = time.monotonic() - started
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr, took


def test_a_stray_double_semicolon_stops_the_reader_as_it_stops_bash(tmp_path):
    report, took = _import(tmp_path, "A=1\nB=2 ;;\n" + TRAIN)
    assert took < 10
    assert ("run.sh:2: warning[V960]: the reader stops here: ';;' outside a case statement is "
            "a syntax error, where bash stops the script") in report
    assert "error[V973]" in report  # bash never reaches train.py


def test_an_array_that_doubles_itself_is_bounded(tmp_path):
    doubling = 'ARGS=("${ARGS[@]}" "${ARGS[@]}")\n' * 64
    report, took = _import(tmp_path, "ARGS=(--x)\n" + doubling + TRAIN)
    assert took < 10
    assert "ARGS has more than 100000 elements" in report


def test_a_script_that_sources_itself_is_read_once(tmp_path):
    report, took = _import(tmp_path, 'source "$0"\n' * 200 + TRAIN)
    assert took < 10
    assert (f"run.sh:1: warning[V960]: source {tmp_path / 'run.sh'}: the file is being read "
            "already (it sources itself); bash would source it again and again") in report
    assert report.count("sources itself") == 1  # said once, not once a line


def test_files_sourced_without_end_are_bounded(tmp_path):
    for name in "bcd":  # each sources the next 100 times: 100**3 readings unbounded
        (tmp_path / f"{name}.sh").write_text(f"source {chr(ord(name) + 1)}.sh\n" * 100)
    (tmp_path / "e.sh").write_text("E=1\n")
    report, took = _import(tmp_path, "source b.sh\n" + TRAIN)
    assert took < 10
    assert "the script sources more than 100 files; the reader sources no more" in report


def test_two_scripts_sourcing_each_other_are_read_once_each(tmp_path):
    (tmp_path / "b.sh").write_text("source a.sh\nB=1\n" * 100)
    report, took = _import(tmp_path, "source b.sh\n" * 100 + TRAIN, name="a.sh")
    assert took < 10
    assert "source a.sh: the file is being read already" in report
