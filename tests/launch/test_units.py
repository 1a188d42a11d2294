"""The launcher's pure parts: port plan, sbatch quoting, time conversion, dry run, usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from launchkit import SMOKE, spec_sets, vime

from vime import pipeline
from vime.emit.sbatch import sbatch_word
from vime.launch import ports
from vime.launch.slurm import time_minutes
from vime.parse import Source


def test_port_plan_is_explicit_distinct_and_below_the_ephemeral_range():
    plan = ports.plan("12345", 6379, 8265, fixed_head_ports=False)
    used = [plan.gcs_port, plan.client_server_port, plan.dashboard_port]
    for node in range(ports.NODE_SLOTS):
        used += list(vars(plan.node(node)).values())
    assert len(used) == len(set(used))
    assert all(plan.base <= p < plan.base + ports.BLOCK for p in used)
    assert max(p for job in range(ports.BLOCKS) for p in (ports.plan(str(job), 1, 1, False).base
                                                          + ports.BLOCK - 1,)) < 32768
    neighbour = ports.plan("12346", 6379, 8265, False)
    assert neighbour.base == plan.base + ports.BLOCK  # consecutive jobs never share a port


def test_exclusive_slurm_jobs_keep_the_specs_head_ports():
    plan = ports.plan("7", 6379, 8265, fixed_head_ports=True)
    assert (plan.gcs_port, plan.dashboard_port) == (6379, 8265)
    assert ports.plan("local-1a2b3c4d", 1, 1, False) == ports.plan("local-1a2b3c4d", 1, 1, False)


@pytest.mark.parametrize("word,expected", [
    ("gpu", "gpu"), ("--mail-type=END", "--mail-type=END"), ("%j/logs/batch.log", "%j/logs/batch.log"),
    ("h100&ib", '"h100&ib"'), ('--comment=a "b" #c', '"--comment=a \\"b\\" #c"'),
    ("back\\slash", '"back\\\\slash"'),
])
def test_sbatch_words_are_quoted_the_way_sbatch_reads_directives(word, expected):
    assert sbatch_word(word) == expected


@pytest.mark.parametrize("text,minutes", [("10", 10), ("90:30", 91), ("1:00:00", 60),
                                          ("2-00:00:00", 2880), ("1-2", 1560), ("0-0:1", 1)])
def test_slurm_time_in_minutes(text, minutes):
    assert time_minutes(text) == minutes


HOSTILE = "$(touch {d}/pwned-1) `touch {d}/pwned-2`; touch {d}/pwned-3 'q' \"dq\" #h\\"


def test_hostile_env_and_extra_args_render_as_data(tmp_path):
    env_value = HOSTILE.format(d=tmp_path) + "\nsecond line"
    sets = spec_sets(tmp_path / "runs", **{
        "cluster.env": f"{{VIME_TEST_ENV = {json.dumps(env_value)}}}",
        "cluster.slurm.extra_args": json.dumps(["--comment=" + HOSTILE.format(d=tmp_path)]),
        "cluster.slurm.constraint": '"a100 & (ib|eth)"'})
    result = pipeline.run(Source("spec.toml", SMOKE.read_text()), sets[1::2], SMOKE.parent)
    assert result.ok, [d.message for d in result.diagnostics]
    from vime.emit import sbatch

    script = sbatch.render(result.plan, python=sys.executable)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    # the whole script, with srun standing in to show what the tasks would get, in the
    # experiment folder of a job `vime submit` wrote (the batch step finds it: vime/launch/batch.py)
    fake_srun = 'srun() { printf %s "$VIME_TEST_ENV"; }\n'
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "job.json").write_text("{}")
    shown = subprocess.run(["bash", "-c", fake_srun + script], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", "SLURM_CPUS_ON_NODE": "4",
                                "SLURM_JOB_ID": "7"}, cwd=tmp_path)
    assert shown.stdout == env_value
    assert not list(tmp_path.glob("pwned-*"))
    assert '#SBATCH --constraint="a100 & (ib|eth)"' in script


def test_dry_run_prints_the_script_and_port_plan_and_imports_no_ray(tmp_path):
    probe = ("import sys; from vime.cli import main; rc = main(sys.argv[1:]); "
             "print('HEAVY', sorted(m for m in ('ray', 'submitit', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe, "submit", str(SMOKE), "--dry-run",
                           *spec_sets(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --nodes=2" in done.stdout and "#SBATCH --gpus-per-node=4" in done.stdout
    assert "-m submitit.core._submit %j/submitit" in done.stdout
    assert "Ray port plan" in done.stdout and "node 1: node-manager base+16" in done.stdout
    assert "nothing was submitted" in done.stdout
    assert "HEAVY []" in done.stdout
    assert not (tmp_path / "qwen3-30b-a3b-smoke").exists()


def test_submit_without_slurm_is_a_usage_error(tmp_path):
    done = vime("submit", str(SMOKE), *spec_sets(tmp_path), env={"PATH": "/nonexistent"})
    assert done.returncode == 2
    assert "not a Slurm submit host" in done.stderr and "--local" in done.stderr


@pytest.mark.parametrize("name", ["a%jb", "a\\b"])
def test_slurm_file_name_specials_in_the_experiment_folder_are_refused(tmp_path, name):
    done = vime("submit", str(SMOKE), "--dry-run", *spec_sets(tmp_path / name))
    assert done.returncode == 2 and "file-name pattern" in done.stderr


def test_status_of_something_that_is_not_a_job(tmp_path):
    done = vime("status", str(tmp_path))
    assert done.returncode == 2 and "not a vime job folder" in done.stderr
    done = vime("logs", "no-such-job")
    assert done.returncode == 2 and "neither a job folder nor a Slurm job id" in done.stderr


def _ended_job(folder, rollouts: int, state: str = "succeeded", error=None):
    """A job folder as a local run leaves it: rollouts in metrics.jsonl and the log, ended."""
    (folder / "logs").mkdir(parents=True)
    (folder / "ray").mkdir()
    (folder / "job.json").write_text(json.dumps({
        "job_id": folder.name, "launcher": "local", "experiment": "tiny", "nodes": 1,
        "gpus_per_node": 2, "spec": "spec.toml", "spec_sha256": "0" * 64}))
    (folder / "local.json").write_text(json.dumps({"launcher_pid": 1, "pids": []}))
    (folder / "resolved.toml").write_text("[rollout]\nnum_rollout = 10\n[model]\n")
    (folder / "ray" / "ready-0.json").write_text(json.dumps({"attempt": 0, "job_start": 1000.0}))
    log = ["vime: Ray ready at 10.0.0.1:6379: 2 GPUs on 1 node(s) after 3.0 s", "Ray noise"]
    with open(folder / "metrics.jsonl", "w") as metrics:
        for rollout in range(rollouts):
            metrics.write(json.dumps({"rollout": rollout, "reward/mean": 0.1 * rollout,
                                      "time/generate": 1.0, "time/train": 2.0,
                                      "time/rollout": 60.0}) + "\n")
            log.append(f"rollout {rollout:5d} | reward {0.1 * rollout:.3f}")
    (folder / "logs" / "node-0.log").write_text("\n".join(log) + "\n")
    (folder / "outcome.json").write_text(json.dumps({"attempt": 0, "state": state,
                                                     "error": error, "finished": 1245.0}))


def test_logs_f_of_an_ended_job_shows_its_progress_and_outcome(tmp_path):
    # `vime logs -f` shows what `submit --local` shows; the rollouts already in the
    # log, read at once, get the loop's own time per rollout as their ETA, not 0:00
    folder = tmp_path / "local-0000aaaa"
    _ended_job(folder, 4)
    done = vime("logs", str(folder), "-f", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == ("vime: job local-0000aaaa: tiny, 1 node × 2 GPUs, here, one process "
                        "per node (COMPLETED; local)")
    assert lines[1:3] == [f"  folder  {folder}", f"  logs    {folder / 'logs' / 'node-0.log'} "
                          "(head and driver)"]
    assert lines[3].startswith("vime: Ray ready at") and "Ray noise" not in done.stdout
    assert lines[4] == ("rollout  0 |  1/10 [##..................]  10% | reward 0.000 | "
                        "gen 1.00 train 2.00 s | ETA 9:00")
    assert lines[7].startswith("rollout  3 |  4/10 [########............]  40% | reward 0.300")
    assert lines[7].endswith("ETA 6:00")
    assert lines[8:] == ["job local-0000aaaa succeeded: rollouts 0 to 3 of 10 in 4:05, "
                         "reward 0.000 -> 0.300"]
    quiet = vime("logs", str(folder), "-f", "--quiet", timeout=60)
    assert quiet.stdout.splitlines() == lines[8:]
    raw = vime("logs", str(folder), "-f", "--raw", timeout=60)
    assert raw.stdout == (folder / "logs" / "node-0.log").read_text()


def test_logs_f_of_a_failed_job_says_why_and_exits_4(tmp_path):
    folder = tmp_path / "local-0000bbbb"
    _ended_job(folder, 2, state="failed", error="RuntimeError: the driver fails")
    done = vime("logs", str(folder), "-f", "--quiet", timeout=60)
    assert done.returncode == 4, done.stdout + done.stderr
    assert done.stdout == (f"job local-0000bbbb failed: RuntimeError: the driver fails\n"
                           f"  full log: {folder / 'logs' / 'node-0.log'}\n")


def test_a_job_id_looked_up_from_the_root_folder_is_not_an_internal_error():
    # the folders named like the id below / include /proc/<pid>/fd/<n>, whose job.json may not
    # be looked at (PermissionError as root in a sandbox: "vime: internal error" before)
    done = vime("logs", "0", cwd=Path("/"), env={"PATH": "/nonexistent"}, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no Slurm here to look job 0 up" in done.stderr


def test_logs_f_of_a_slurm_job_asks_squeue_every_few_seconds_not_every_second(
        tmp_path, monkeypatch):
    """The log is read every second; Slurm is asked at most every SLURM_POLL_S (slurmctld
    serves the whole cluster), and at once when the head has written outcome.json."""
    import io

    from vime.launch import follow, slurm
    from vime.launch.jobdir import JobFolder

    folder = tmp_path / "4242"
    _ended_job(folder, 3)
    info = json.loads((folder / "job.json").read_text())
    (folder / "job.json").write_text(json.dumps({**info, "job_id": "4242", "launcher": "slurm"}))
    outcome = folder / "outcome.json"
    written = outcome.read_text()
    outcome.unlink()
    clock = [1000.0]
    asked = []

    def sleep(seconds):
        clock[0] += seconds
        if clock[0] >= 1030.0 and not outcome.exists():  # the head ends after 30 s
            outcome.write_text(written)

    def state(job_id):
        asked.append(clock[0])
        done = outcome.exists()
        return slurm.JobState("COMPLETED" if done else "RUNNING", "squeue")

    monkeypatch.setattr(follow.time, "sleep", sleep)
    monkeypatch.setattr(follow.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(follow.time, "time", lambda: clock[0])
    monkeypatch.setattr(slurm, "state", state)
    out = io.StringIO()
    assert follow.watch(JobFolder(folder), out=out) == 0
    assert "job 4242 succeeded" in out.getvalue()
    gaps = [b - a for a, b in zip(asked[:-1], asked[1:], strict=True)]
    assert len(asked) <= 2 + 30 / follow.SLURM_POLL_S, asked
    assert all(gap >= follow.SLURM_POLL_S for gap in gaps[:-1]), gaps
    assert asked[-1] - 1030.0 <= follow.WATCH_POLL_S  # the end is seen within a second
