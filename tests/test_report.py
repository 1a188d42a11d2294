"""`vime report JOB`: the run's curves as one HTML file with inline SVG, read back into numbers
(specsupport.read_report) and compared with the metrics.jsonl the runtime's own logger wrote."""

from __future__ import annotations

import json
import subprocess
import sys

from specsupport import ROOT, assert_report_matches, read_report

from runtime.rl.metrics import MetricsLogger
from vime.cli import main
from vime.report import REPORT_FILE


def _job(experiment, name: str, rollouts: range, scale: float = 1.0) -> list[dict]:
    """A job folder whose metrics.jsonl the runtime's MetricsLogger writes."""
    folder = experiment / name
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({"job_id": name}))
    logger = MetricsLogger(folder, name, print_fn=lambda line: None)
    for rollout in rollouts:
        numbers = {"reward/mean": scale * rollout / 10, "reward/acc": rollout / 20,
                   "response_len/mean": 100.0 + 7 * rollout, "response_len/max": 300.0,
                   "rollout/logprob_abs_diff": 0.01 + 1e-3 * rollout,
                   "time/generate": 2.0, "time/train": 1.0 + rollout,
                   "time/rollout": 3.0 + rollout}
        if rollout % 2 == 0:  # eval on every other rollout
            numbers.update({"eval/aime/acc": 0.1 * rollout, "eval/aime/pass@4": 0.2})
        logger.log(rollout, numbers)
    logger.close()
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_the_report_draws_the_runs_metrics_and_says_what_it_did_not_log(tmp_path, capsys):
    experiment = tmp_path / "qwen3-moe"
    first = _job(experiment, "local-1", range(0, 6))
    # the resumption repeats rollout 5 (its checkpoint was at 4): its record wins
    second = _job(experiment, "local-2", range(5, 9), scale=2.0)
    assert main(["report", str(experiment / "local-2")]) == 0
    page = experiment / "local-2" / REPORT_FILE
    assert capsys.readouterr().out == (f"wrote {page}: 9 rollouts of qwen3-moe (open it in a "
                                       "browser; it needs no server)\n")
    panels = read_report(page)
    records = first[:5] + second
    assert assert_report_matches(panels, records) == 10
    assert set(panels["Reward"]) == {"reward/mean", "reward/acc"}
    assert set(panels["Eval"]) == {"eval/aime/acc", "eval/aime/pass@4"}
    assert [x for x, _ in panels["Eval"]["eval/aime/acc"]] == [0, 2, 4, 6, 8]
    assert set(panels["Time per phase (s)"]) == {"time/rollout", "time/generate", "time/train"}
    assert panels["Route match (routing replay)"] == {}
    text = page.read_text()
    assert "not logged by this run (train/replayed_route_match)" in text
    assert "<script" not in text and "http://" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched: it opens offline


def test_a_job_without_metrics_yet_gets_a_page_that_says_so(tmp_path, capsys):
    folder = tmp_path / "run" / "local-1"
    folder.mkdir(parents=True)
    (folder / "job.json").write_text("{}")
    out = tmp_path / "elsewhere.html"
    assert main(["report", str(folder), "-o", str(out)]) == 0
    assert "0 rollouts of run" in capsys.readouterr().out
    assert "no rollouts logged yet" in out.read_text()
    assert all(curves == {} for curves in read_report(out).values())


def test_report_imports_no_heavy_library(tmp_path):
    experiment = tmp_path / "run"
    _job(experiment, "local-1", range(3))
    code = ("import sys; from vime.cli import main; rc = main(['report', sys.argv[1]]); "
            "heavy = {'torch', 'ray', 'vllm', 'megatron', 'submitit'} & "
            "{m.split('.')[0] for m in sys.modules}; print(sorted(heavy)); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, str(experiment / "local-1")],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip().endswith("[]"), done.stdout + done.stderr
