"""The fault probe: real tiny CPU jobs (`vime submit --local` of specs/tiny_cpu.toml and
specs/tiny_cpu_tools.toml) with faults injected, each checked against the invariant it must
keep, and recorded as what, expected, observed, pass or fail.

    .venv/bin/python tests/tools/fault_probe.py [--quick] [--only kill,lock,...] [--work DIR]

Families (docs/faults.md has the last run's table):
  kill       SIGKILL of a job's process group (and of its launcher) at random moments, during
             and right after checkpoint saves; resumed, the run ends with the uninterrupted
             run's weights and metrics; `latest` never moves backwards; no checkpoint is lost
  lock       experiments sharing a folder a running job writes (model.save, --fresh, the same
             experiment): refused with a named diagnostic, the running job unharmed
  corrupt    state.json edits, truncated or changed checkpoint files, on_corrupt stop and
             previous: detected and named, nothing overwritten; a full disk is said
  rollout    rollout functions returning malformed samples, all-masked samples, dynamic
             sampling with a constant reward: a named diagnostic, never silent training
  reward     a reward server on loopback that is slow (1 byte/s), hangs, answers 500, refuses,
             answers garbage: the timeout honoured, the cause named
  input      `vime import` of hostile scripts, deep or broken TOML, bad eval files, read-only
             HF folders: a diagnostic, no hang, no traceback

The jobs run the vime of the checkout the script is in (PYTHONPATH). To probe a commit while
others edit the working tree: `git archive HEAD | tar -x -C SNAP`, its hash in
SNAP/.probe-commit, then `.venv/bin/python SNAP/tests/tools/fault_probe.py`.

It is not part of the pytest suite: a full run starts about 70 jobs (about 70 minutes, done
one after another, on 2 cores shared with other test runs); --quick starts about 20 (about
20 minutes). Results go to <work>/results.jsonl and a table by
family to <work>/results.md; the exit status is 1 when any injection failed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
VIME = Path(sys.executable).with_name("vime")
TINY = ROOT / "specs" / "tiny_cpu.toml"
TOOLS = ROOT / "specs" / "tiny_cpu_tools.toml"
ROLLOUTS = 10
JOB_TIMEOUT_S = 420
# metrics a resumed rollout repeats exactly (tests/runtime/test_tiny_cpu_submit.py's keys)
SAME_KEYS = ("reward/mean", "response_len/mean", "train/pg_loss", "train/entropy",
             "weight_version")
RESUME_TOLERANCE = 1e-6


@dataclass
class Result:
    family: str
    what: str
    expected: str
    observed: str
    ok: bool
    seconds: float


# ------------------------------------------------------------------------------ plumbing

@dataclass
class Done:
    code: int | None  # None: killed at the probe's timeout
    out: str
    err: str
    seconds: float

    @property
    def text(self) -> str:
        return self.out + self.err


def _kill_group(pid: int, sig=signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def run(argv: list[str], timeout: float = 60, cwd: Path | None = None,
        env: dict | None = None) -> Done:
    """A command in a session of its own, killed with its group at the timeout."""
    started = time.monotonic()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        out, err = process.communicate()
        code = None
    return Done(code, out, err, time.monotonic() - started)


class Raw(str):
    """A --set value written as TOML already (an array, an inline table)."""


def toml_value(value) -> str:
    if isinstance(value, Raw):
        return str(value)
    return json.dumps(value) if isinstance(value, str) else (
        str(value).lower() if isinstance(value, bool) else str(value))


def set_args(keys: dict) -> list[str]:
    return [arg for key, value in keys.items() for arg in ("--set", f"{key}={toml_value(value)}")]


def tree_digest(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under folder."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def no_traceback(text: str) -> bool:
    return "Traceback (most recent call last)" not in text and "internal error" not in text


def job_folders(experiment: Path) -> list[Path]:
    return sorted(experiment.glob("local-*"), key=lambda p: p.stat().st_mtime)


def metrics_of(job: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()
                if line.strip()]
    except OSError:
        return []


def node_log(job: Path) -> str:
    try:
        return (job / "logs" / "node-0.log").read_text(errors="replace")
    except OSError:
        return ""


def leftovers(job_id: str) -> set[int]:
    from vime.launch.local import job_processes
    return job_processes(job_id)


def reap(job_id: str) -> int:
    """SIGKILL to whatever of a job the probe killed is left; the count."""
    left = leftovers(job_id)
    for _ in range(20):
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        left = leftovers(job_id)
    return len(left)


def verify(folder: Path) -> str | None:
    from runtime.rl.checkpoint import verify as check
    return check(folder)


def checkpoint_names(save: Path) -> list[str]:
    try:
        return sorted(p.name for p in save.iterdir() if p.name.startswith("rollout_"))
    except OSError:
        return []


def read_latest(save: Path) -> str | None:
    try:
        return (save / "latest").read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def weights(save: Path, rollout: int):
    import torch
    path = save / f"rollout_{rollout:06d}" / "train" / "model_optim.pt"
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def weight_gap(a: dict, b: dict) -> float:
    if set(a) != set(b):
        return float("inf")
    return max(float((a[n].float() - b[n].float()).abs().max()) for n in a)


class Watch(threading.Thread):
    """Polls a checkpoint folder every few ms: `latest` as it moves (and whether it moved
    backwards), and .partial-rollout_* folders (a save being written)."""

    def __init__(self, save: Path):
        super().__init__(daemon=True)
        self.save = save
        self.seen: list[str] = []
        self.backwards: list[tuple[str, str]] = []
        self.partial = threading.Event()
        self.moved = threading.Event()
        self.stopped = False

    def run(self) -> None:
        while not self.stopped:
            name = read_latest(self.save)
            if name and (not self.seen or name != self.seen[-1]):
                if self.seen and name < max(self.seen):
                    self.backwards.append((max(self.seen), name))
                self.seen.append(name)
                self.moved.set()
            try:
                if any(e.name.startswith(".partial-rollout_") for e in os.scandir(self.save)):
                    self.partial.set()
            except OSError:
                pass
            time.sleep(0.003)

    def stop(self) -> None:
        self.stopped = True
        self.join(timeout=2)


# ------------------------------------------------------------------------------- the probe

class Probe:
    def __init__(self, work: Path, quick: bool, seed: int):
        self.work = work
        self.quick = quick
        self.rng = random.Random(seed)
        self.results: list[Result] = []
        self.log = open(work / "results.jsonl", "a")  # noqa: SIM115
        # the jobs run this checkout's vime (a snapshot's too: the venv's vime is editable)
        self.env = dict(os.environ, VIME_STATE_DIR=str(work / "state"), PYTHONPATH=os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        self.specs = work / "specs"
        self.specs.mkdir(exist_ok=True)
        self.tiny = self._copy_spec(TINY, "tiny.toml")
        self.tools = self._copy_spec(TOOLS, "tools.toml")
        (self.specs / "probe_fns.py").write_text(PROBE_FUNCTIONS)
        self.references: dict[str, Path] = {}
        self.commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                     capture_output=True, text=True).stdout.strip()
        if (ROOT / ".probe-commit").exists():  # a snapshot (git archive) of that commit
            self.commit = (ROOT / ".probe-commit").read_text().strip()

    def _copy_spec(self, spec: Path, name: str) -> Path:
        text = spec.read_text().replace('"data/', f'"{spec.parent / "data"}/')
        text = text.replace("#:schema ../schema/", f"#:schema {ROOT / 'schema'}/")
        (self.specs / name).write_text(text)
        return self.specs / name

    def record(self, family: str, what: str, expected: str, observed: str, ok: bool,
               seconds: float = 0.0) -> None:
        result = Result(family, what, expected, observed.strip()[:600], bool(ok), round(seconds, 1))
        self.results.append(result)
        self.log.write(json.dumps(asdict(result)) + "\n")
        self.log.flush()
        print(f"{'PASS' if ok else 'FAIL'} {family:8s} {what}: {result.observed[:200]}",
              flush=True)

    def vime(self, *args: str, timeout: float = JOB_TIMEOUT_S, cwd: Path | None = None) -> Done:
        return run([str(VIME), *args], timeout=timeout, cwd=cwd or self.work, env=self.env)

    def case_dir(self, name: str) -> Path:
        folder = self.work / "cases" / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder

    @staticmethod
    def base_keys(output: Path, **keys) -> dict:
        merged = {"experiment.output_dir": str(output), "rollout.num_rollout": ROLLOUTS,
                  "checkpoint.save_interval": 1, "eval.interval": 1000}
        merged.update({k.replace("__", "."): v for k, v in keys.items()})
        return merged

    def submit(self, spec: Path, keys: dict, *flags: str, timeout: float = JOB_TIMEOUT_S) -> Done:
        return self.vime("submit", "--local", str(spec), *flags, *set_args(keys),
                         timeout=timeout)

    def start(self, spec: Path, keys: dict, log: Path, *flags: str) -> subprocess.Popen:
        with open(log, "w") as out:
            return subprocess.Popen([str(VIME), "submit", "--local", str(spec), *flags,
                                     *set_args(keys)], cwd=self.work, env=self.env,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    # ---------------------------------------------------------------------------- references

    def reference(self, name: str, **keys) -> Path:
        """An uninterrupted run of ROLLOUTS rollouts: its experiment folder."""
        output = self.case_dir(f"reference-{name}")
        done = self.submit(self.tiny, self.base_keys(output, **keys))
        experiment = output / "tiny-cpu"
        ok = done.code == 0 and read_latest(experiment / "checkpoints") == \
            f"rollout_{ROLLOUTS - 1:06d}"
        self.record("kill", f"reference run ({name})", "an uninterrupted run succeeds",
                    f"exit {done.code} in {done.seconds:.0f} s; {done.text[-300:] if not ok else ''}",
                    ok, done.seconds)
        if not ok:
            raise RuntimeError(f"the reference run failed: {done.text[-600:]}")
        self.references[name] = experiment
        return experiment

    # --------------------------------------------------------------------------------- kill

    KILL_MODES = ("startup", "loop", "during-save", "during-save-jitter", "after-save",
                  "launcher-and-group", "launcher-only")

    def kill_chain(self, chain: str, reference: Path, modes: list[str], **keys) -> None:
        output = self.case_dir(f"kill-{chain}")
        experiment = output / "tiny-cpu"
        save = experiment / "checkpoints"
        save.mkdir(parents=True)
        spec_keys = self.base_keys(output, **keys)
        keep_last = int(keys.get("checkpoint__keep_last", 0))
        watch = Watch(save)
        watch.start()
        for index, mode in enumerate(modes):
            before = {name for name in checkpoint_names(save) if verify(save / name) is None}
            latest_before = read_latest(save)
            watch.partial.clear()
            watch.moved.clear()
            started = time.monotonic()
            launcher = self.start(self.tiny, spec_keys, output / f"launcher-{index}.log")
            moment, job = self._kill_at(mode, launcher, experiment, watch)
            what = f"{chain}: kill {index + 1} ({mode})"
            if moment is None:
                self.record("kill", what, "the kill lands while the job runs",
                            "not injected: the job ended first (counted as a pass of nothing)",
                            True, time.monotonic() - started)
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):
                launcher.wait(timeout=90)
            if launcher.poll() is None:
                _kill_group(launcher.pid)
                launcher.wait()
            gone_s = None
            if job is not None and mode == "launcher-only":
                deadline = time.monotonic() + 30
                while leftovers(job.name) and time.monotonic() < deadline:
                    time.sleep(0.2)
                gone_s = 30 - max(0.0, deadline - time.monotonic())
            left = len(leftovers(job.name)) if job is not None else 0
            if job is not None:
                reap(job.name)
            problems = []
            names = checkpoint_names(save)
            for name in names:
                problem = verify(save / name)
                if problem:
                    problems.append(f"{name} does not verify: {problem}")
            latest = read_latest(save)
            if latest and latest not in names:
                problems.append(f"latest names {latest}, which is not there")
            if latest_before and (latest or "") < latest_before:
                problems.append(f"latest went from {latest_before} to {latest}")
            # with keep_last, the save after the kill may remove the oldest ones legitimately
            kept = sorted(before | set(names))[-keep_last:] if keep_last else sorted(before)
            lost = [n for n in kept if n in before and n not in names]
            if lost:
                problems.append(f"lost {lost}")
            if watch.backwards:
                problems.append(f"latest moved backwards: {watch.backwards}")
            partials = [p.name for p in save.glob(".partial-*")]
            observed = (f"killed {moment}; latest {latest_before} -> {latest}; "
                        f"{len(names)} checkpoints verify"
                        + (f"; {len(partials)} .partial-* left for the next save" if partials else "")
                        + (f"; {left} Ray processes of the job outlived the kill (reaped)"
                           if left else "")
                        + (f"; the job was gone {gone_s:.1f} s after its launcher"
                           if gone_s is not None else ""))
            if mode == "launcher-only" and left:
                problems.append(f"{left} processes still alive 30 s after the launcher died")
            self.record("kill", what, "every checkpoint verifies, latest names one and never "
                        "moves backwards, none lost",
                        "; ".join(problems) + ("; " if problems else "") + observed,
                        not problems, time.monotonic() - started)
        # the resume to the end
        started = time.monotonic()
        done = self.submit(self.tiny, spec_keys)
        watch.stop()
        problems = []
        if done.code != 0:
            problems.append(f"exit {done.code}: {done.text[-400:]}")
        else:
            gap = weight_gap(weights(save, ROLLOUTS - 1), weights(reference / "checkpoints",
                                                                   ROLLOUTS - 1))
            if gap > RESUME_TOLERANCE:
                problems.append(f"final weights differ from the uninterrupted run's by {gap:g}")
            want = {r["rollout"]: r for r in metrics_of(job_folders(reference)[-1])}
            compared = 0
            for job in job_folders(experiment):
                for record in metrics_of(job):
                    other = want.get(record["rollout"])
                    for key in SAME_KEYS:
                        if other is None or abs(record.get(key, 0) - other.get(key, 0)) > \
                                RESUME_TOLERANCE:
                            problems.append(f"{job.name} rollout {record['rollout']} {key} "
                                            f"{record.get(key)} vs {other and other.get(key)}")
                            break
                    compared += 1
            if watch.backwards:
                problems.append(f"latest moved backwards: {watch.backwards}")
        self.record("kill", f"{chain}: resumed to the end",
                    "the uninterrupted run's final weights (max gap <= 1e-6) and metrics, "
                    "every rollout of every job of the chain",
                    "; ".join(problems[:4]) or
                    f"final weights equal (gap {gap:g}), {compared} metrics records of "
                    f"{len(job_folders(experiment))} jobs equal the reference's",
                    not problems, time.monotonic() - started)

    def _kill_at(self, mode: str, launcher: subprocess.Popen, experiment: Path,
                 watch: Watch) -> tuple[str | None, Path | None]:
        """Waits for mode's moment and kills; (what was killed when, the job folder), or
        (None, job) when the job ended first."""
        deadline = time.monotonic() + 240
        job, node = None, None
        while time.monotonic() < deadline and launcher.poll() is None:
            for folder in reversed(job_folders(experiment)):
                try:
                    local = json.loads((folder / "local.json").read_text())
                except (OSError, ValueError):
                    continue
                if local.get("launcher_pid") == launcher.pid:
                    job, node = folder, local["pids"][0]
                    break
            if node:
                break
            time.sleep(0.05)
        if node is None:
            return None, job

        def wait_for(ready: Callable[[], bool]) -> bool:
            while time.monotonic() < deadline and launcher.poll() is None:
                if ready():
                    return True
                time.sleep(0.002)
            return False

        if mode == "startup":
            time.sleep(self.rng.uniform(0.5, 12))
        elif mode in ("loop", "launcher-and-group", "launcher-only"):
            if not wait_for(lambda: (job / "metrics.jsonl").exists()):
                return None, job
            time.sleep(self.rng.uniform(0, 2.0))
        elif mode.startswith("during-save"):
            if not wait_for(watch.partial.is_set):
                return None, job
            if mode.endswith("jitter"):
                time.sleep(self.rng.uniform(0, 0.02))
        elif mode == "after-save" and not wait_for(watch.moved.is_set):
            return None, job
        if launcher.poll() is not None:
            return None, job
        latest = read_latest(experiment / "checkpoints")
        if mode == "launcher-only":
            os.kill(launcher.pid, signal.SIGKILL)
            return f"the launcher alone (latest {latest})", job
        _kill_group(node)
        if mode == "launcher-and-group":
            os.kill(launcher.pid, signal.SIGKILL)
            return f"the node's group and the launcher (latest {latest})", job
        return f"the node's group at {mode} (latest {latest})", job

    # --------------------------------------------------------------------------------- lock

    def lock_family(self) -> None:
        """Conflicting submits while a reference-like run writes its folders; then two runs
        started together on one model.save."""
        output = self.case_dir("lock")
        experiment = output / "tiny-cpu"
        save = experiment / "checkpoints"
        keys = self.base_keys(output, rollout__num_rollout=ROLLOUTS * 3)
        watch = Watch(save)
        save.mkdir(parents=True)
        watch.start()
        holder = self.start(self.tiny, keys, output / "holder.log")
        while not (experiment.exists() and any(experiment.glob("local-*/metrics.jsonl"))):
            if holder.poll() is not None:
                break
            time.sleep(0.1)
        other = self.work / "cases" / "lock-other"
        shutil.rmtree(other, ignore_errors=True)
        conflicts = [
            ("the same experiment again", keys, ()),
            ("--fresh in the same experiment, model.save the running job's checkpoints",
             dict(keys, **{"model.save": str(save)}), ("--fresh",)),
            ("another experiment whose model.save is the running job's checkpoint folder",
             dict(self.base_keys(other), **{"experiment.name": "other", "model.save": str(save)}),
             ()),
            ("another experiment whose model.save is the running job's experiment folder",
             dict(self.base_keys(other), **{"experiment.name": "other2",
                                            "model.save": str(experiment)}), ()),
            ("another experiment, --fresh, model.save the running job's checkpoints",
             dict(self.base_keys(other), **{"experiment.name": "other3", "model.save": str(save)}),
             ("--fresh",)),
            ("the same experiment, --detach", keys, ("--detach",)),
            ("the same experiment from another working folder (relative output_dir)",
             dict(keys, **{"experiment.output_dir": os.path.relpath(output, ROOT)}), ()),
        ]
        if self.quick:
            conflicts = conflicts[1:3]
        for what, conflict_keys, flags in conflicts:
            before = tree_digest(save)
            cwd = ROOT if "another working folder" in what else None
            done = run([str(VIME), "submit", "--local", str(self.tiny), *flags,
                        *set_args(conflict_keys)], timeout=120, cwd=cwd or self.work, env=self.env)
            running = holder.poll() is None
            holder_id = json.loads((experiment / "lock.json").read_text())["job_id"]
            named = holder_id in done.text or ("--fresh" in flags and str(save) in done.text)
            ok = done.code not in (0, None) and named and no_traceback(done.text) and running
            self.record("lock", what, "refused with a diagnostic naming the job that holds the "
                        "folder (--fresh: or the folder it holds); the running job goes on",
                        f"exit {done.code} in {done.seconds:.1f} s; holder "
                        f"{'running' if running else 'ended before the check'}; "
                        f"{_first_line(done.err or done.out, 'lock')}"
                        + ("" if set(before) <= set(tree_digest(save)) else "; files gone"),
                        ok, done.seconds)
        holder.wait(timeout=JOB_TIMEOUT_S)
        watch.stop()
        names = checkpoint_names(save)
        bad = [n for n in names if verify(save / n)]
        ok = holder.returncode == 0 and not bad and not watch.backwards and \
            read_latest(save) == f"rollout_{ROLLOUTS * 3 - 1:06d}"
        self.record("lock", "the job that held the folders, at its end",
                    "succeeded, every checkpoint verifies, latest never moved backwards",
                    f"exit {holder.returncode}; {len(names)} checkpoints, {len(bad)} bad; "
                    f"latest {read_latest(save)}; backwards {watch.backwards}", ok)
        if not self.quick:
            self.race_on_one_save()

    def race_on_one_save(self) -> None:
        output = self.case_dir("lock-race")
        shared = output / "shared-checkpoints"
        launchers = []
        for name in ("left", "right"):
            keys = dict(self.base_keys(output), **{"experiment.name": name,
                                                   "model.save": str(shared)})
            launchers.append(self.start(self.tiny, keys, output / f"{name}.log"))
        codes = [p.wait(timeout=JOB_TIMEOUT_S) for p in launchers]
        texts = [(output / f"{n}.log").read_text() for n in ("left", "right")]
        refused = [t for c, t in zip(codes, texts, strict=True) if c != 0]
        ok = sorted(c == 0 for c in codes) == [False, True] and refused and \
            "job local-" in refused[0] and all(verify(shared / n) is None
                                              for n in checkpoint_names(shared))
        self.record("lock", "two new experiments started at once on one model.save",
                    "one runs to its end, the other is refused naming it",
                    f"exits {codes}; refused: {_first_line(refused[0] if refused else '', 'lock')}",
                    ok)

    # ------------------------------------------------------------------------------ corrupt

    CORRUPTIONS = {
        "state.json: a digit of the data offset changed": ("state", "offset"),
        "state.json: next_rollout changed": ("state", "next_rollout"),
        "state.json: weight_version changed": ("state", "weight_version"),
        "state.json truncated to half": ("truncate", "state.json"),
        "state.json removed": ("remove", "state.json"),
        "state.json: one byte changed to make invalid JSON": ("jsonbyte", "state.json"),
        "state.json: format 2": ("state", "format"),
        "state.json: the file list emptied": ("state", "files"),
        "model_optim.pt truncated to half": ("truncate", "train/model_optim.pt"),
        "model_optim.pt: one byte flipped": ("flip", "train/model_optim.pt"),
        "model_optim.pt emptied": ("empty", "train/model_optim.pt"),
        "rng_rank0.pt removed": ("remove", "train/rng_rank0.pt"),
        "the train/ folder removed": ("remove", "train"),
        "rng_rank0.pt: one byte flipped": ("flip", "train/rng_rank0.pt"),
    }
    PREVIOUS = ("state.json: a digit of the data offset changed",
                "model_optim.pt: one byte flipped", "state.json removed",
                "the train/ folder removed")

    def corrupt_family(self, reference: Path) -> None:
        cases = list(self.CORRUPTIONS)
        previous = list(self.PREVIOUS)
        if self.quick:
            cases, previous = cases[:3], previous[:1]
        for what in cases:
            self._corrupt_case(reference, what, "stop")
        for what in previous:
            self._corrupt_case(reference, what, "previous")
        for index, (what, latest_text) in enumerate((
                ("latest names a folder that is not there", "rollout_000123\n"),
                ("latest holds binary garbage", "\x00\xff\xfe garbage"),
                ("latest is empty", ""))):
            self._latest_case(reference, what, latest_text, index)
        self._record_case(reference)
        if not self.quick:
            self._disk_full()
            self._stale_partial(reference)

    def _copy_reference(self, reference: Path, name: str) -> tuple[Path, Path]:
        output = self.case_dir(name)
        save = output / "tiny-cpu" / "checkpoints"
        shutil.copytree(reference / "checkpoints", save)
        return output, save

    def _corrupt_case(self, reference: Path, what: str, on_corrupt: str) -> None:
        action, target = self.CORRUPTIONS[what]
        output, save = self._copy_reference(reference, f"corrupt-{on_corrupt}-{action}-"
                                            f"{target.replace('/', '_')}")
        last = save / f"rollout_{ROLLOUTS - 1:06d}"
        corrupt(last, action, target)
        before = tree_digest(save)
        corrupted = tree_digest(last)
        started = time.monotonic()
        # one rollout more than the checkpoints hold: a run whose newest checkpoint is its
        # last is finished, and nothing reads that checkpoint's sums
        done = self.submit(self.tiny, self.base_keys(output, checkpoint__on_corrupt=on_corrupt,
                                                     rollout__num_rollout=ROLLOUTS + 1
                                                     if on_corrupt == "stop" else ROLLOUTS))
        jobs = job_folders(output / "tiny-cpu")
        text = done.text + (node_log(jobs[-1]) if jobs else "")
        after = tree_digest(save)
        named = last.name in text and ("corrupt" in text or "incomplete" in text)
        if on_corrupt == "stop":
            ok = done.code not in (0, None) and named and before == after
            self.record("corrupt", f"{what} (on_corrupt stop)",
                        "refused by the submit (sizes, state.json) or the job (sums), naming "
                        "the checkpoint and what is wrong; no file changed",
                        f"exit {done.code}; {'files unchanged' if before == after else 'FILES CHANGED'}; "
                        + _first_line(text, "corrupt or incomplete"), ok, time.monotonic() - started)
            return
        aside = save / f"corrupt-{last.name}"
        kept = aside.exists() and tree_digest(aside) == corrupted
        gap = None
        if done.code == 0 and (save / last.name / "state.json").exists():
            gap = weight_gap(weights(save, ROLLOUTS - 1), weights(reference / "checkpoints",
                                                                  ROLLOUTS - 1))
        ok = done.code == 0 and named and kept and gap is not None and gap <= RESUME_TOLERANCE
        self.record("corrupt", f"{what} (on_corrupt previous)",
                    "named, moved aside unchanged, resumed from the one before; the final "
                    "weights are the uninterrupted run's",
                    f"exit {done.code}; aside kept unchanged: {kept}; final weight gap {gap}; "
                    + _first_line(done.text, "corrupt"), ok, time.monotonic() - started)

    def _latest_case(self, reference: Path, what: str, text: str, index: int) -> None:
        output, save = self._copy_reference(reference, f"latest-{index}")
        (save / "latest").write_text(text, errors="surrogateescape")
        before = tree_digest(save)
        done = self.submit(self.tiny, self.base_keys(output, rollout__num_rollout=ROLLOUTS + 1))
        newest = f"rollout_{ROLLOUTS - 1:06d}"
        ok = done.code == 0 and f"resuming from rollout {ROLLOUTS} " in done.text and \
            set(before) - {"latest"} <= set(tree_digest(save)) and no_traceback(done.text)
        self.record("corrupt", what, f"resumes from the newest complete checkpoint ({newest}), "
                    "said; nothing removed",
                    f"exit {done.code}; " + _first_line(done.text, "resuming from"), ok,
                    done.seconds)

    def _record_case(self, reference: Path) -> None:
        output, save = self._copy_reference(reference, "record-garbage")
        (save / f"rollout_{ROLLOUTS - 1:06d}" / "vime_checkpoint.json").write_text("{not json")
        before = tree_digest(save)
        done = self.vime("plan", str(self.tiny), *set_args(self.base_keys(output)), timeout=60)
        ok = no_traceback(done.text) and before == tree_digest(save) and done.code in (0, 1)
        self.record("corrupt", "vime_checkpoint.json (the model record) is not JSON; vime plan",
                    "a diagnostic or the record ignored, no traceback, no file changed",
                    f"exit {done.code}; " + _first_line(done.text, "vime_checkpoint"), ok,
                    done.seconds)

    def _disk_full(self) -> None:
        output = self.case_dir("disk-full")
        save = output / "small"
        save.mkdir()
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(save)],
                                 capture_output=True, text=True)
        if mounted.returncode:
            self.record("corrupt", "a full disk (4 MB tmpfs as model.save)", "named",
                        f"not injected: mount failed: {mounted.stderr.strip()}", True)
            return
        try:
            done = self.submit(self.tiny, self.base_keys(output, model__save=str(save)))
            names = checkpoint_names(save)
            bad = [n for n in names if verify(save / n)]
            latest = read_latest(save)
            ok = done.code not in (0, None) and ("free space" in done.text or
                                                 "No space left" in done.text) and \
                not bad and latest in names and no_traceback(done.err)
            self.record("corrupt", "a full disk (4 MB tmpfs as model.save, 1.6 MB saves)",
                        "the job stops saying the disk is full; the checkpoints before verify",
                        f"exit {done.code}; {len(names)} checkpoints, {len(bad)} bad, latest "
                        f"{latest}; " + _first_line(done.text, "space"), ok, done.seconds)
        finally:
            subprocess.run(["umount", "-l", str(save)], check=False)

    def _stale_partial(self, reference: Path) -> None:
        output, save = self._copy_reference(reference, "stale-partial")
        keep = sorted(checkpoint_names(save))[:5]
        for name in checkpoint_names(save):
            if name not in keep:
                shutil.rmtree(save / name)
        (save / "latest").write_text(keep[-1] + "\n")
        stale = save / f".partial-rollout_000005-deadbeef-999999.1@{socket.gethostname()}"
        shutil.copytree(reference / "checkpoints" / "rollout_000005", stale)
        done = self.submit(self.tiny, self.base_keys(output))
        gap = weight_gap(weights(save, ROLLOUTS - 1), weights(reference / "checkpoints",
                                                              ROLLOUTS - 1)) \
            if done.code == 0 else None
        ok = done.code == 0 and not stale.exists() and gap is not None and \
            gap <= RESUME_TOLERANCE and f"resuming from rollout {len(keep)} " in done.text
        self.record("corrupt", "a complete .partial-* of a dead writer beside the checkpoints",
                    "never resumed from; removed by the next save; the run ends as the "
                    "uninterrupted one",
                    f"exit {done.code}; partial left: {stale.exists()}; gap {gap}", ok,
                    done.seconds)

    # ------------------------------------------------------------------------------ rollout

    MALFORMED = {
        "sevens": "ctx.loss_mask[0] is 7",
        "string_token": "a str, not an int token id",
        "float_token": "a float, not an int token id",
        "out_of_vocabulary": "outside the model's vocabulary",
        "negative_token": "outside the model's vocabulary",
        "short_mask": "entries for the",
        "text_log_prob": "not a finite log-probability",
        "emptied": "no token after the prompt",
        "replaced_by_str": "ctx.token_ids is a str, not a list",
        "mask_none": "ctx.loss_mask",
        "masks_everything": "has a trained token",
        "raises": "ValueError",
        "reward_text": "reward",
        "reward_nan": "reward",
    }

    def rollout_family(self) -> None:
        names = list(self.MALFORMED)
        if self.quick:
            names = ["sevens", "emptied", "masks_everything"]
        for name in names:
            output = self.case_dir(f"rollout-{name}")
            keys = self.base_keys(output, rollout__function=f"probe_fns:{name}",
                                  rollout__num_rollout=2)
            done = self.submit(self.tools, keys)
            experiment = output / "tiny-cpu-tools"
            jobs = job_folders(experiment)
            log = node_log(jobs[-1]) if jobs else ""
            trained = [r for job in jobs for r in metrics_of(job)]
            saved = checkpoint_names(experiment / "checkpoints")
            text = done.text + log
            ok = done.code not in (0, None) and f"probe_fns:{name}" in text and \
                self.MALFORMED[name] in text and not trained and not saved and \
                no_traceback(done.err)
            self.record("rollout", f"rollout function: {name}",
                        "the job stops naming the function, the sample and what is wrong; "
                        "nothing trained or saved",
                        f"exit {done.code}; {len(trained)} rollouts trained, {len(saved)} saved; "
                        + _first_line(text, f"probe_fns:{name}"), ok, done.seconds)
        self._constant_reward()

    def _constant_reward(self) -> None:
        output = self.case_dir("dynamic-constant")
        keys = self.base_keys(output, rollout__reward="probe_fns:constant_reward",
                              rollout__dynamic_sampling=True, rollout__num_rollout=12)
        done = self.submit(self.tiny, keys)
        jobs = job_folders(output / "tiny-cpu")
        records = metrics_of(jobs[-1]) if jobs else []
        loud = "NO GROUP KEPT" in done.text
        ok = done.code not in (0, None) and loud and "kept no group" in done.text and \
            len(records) <= 10 and no_traceback(done.err)
        self.record("rollout", "dynamic sampling with a constant reward",
                    "every progress line says NO GROUP KEPT; the job stops after 10 such "
                    "rollouts naming the cause",
                    f"exit {done.code} after {len(records)} rollouts in {done.seconds:.0f} s; "
                    + _first_line(done.text, "kept no group"), ok, done.seconds)

    # ------------------------------------------------------------------------------- reward

    def reward_family(self) -> None:
        behaviours = ["slow", "hang", "status500", "refused", "garbage", "short", "nan",
                      "later500", "laterslow", "closes"]
        if self.quick:
            behaviours = ["slow", "status500", "refused"]
        expect = {"slow": "timeout", "hang": "timeout", "status500": "500",
                  "refused": "refused", "garbage": "scores", "short": "score(s)",
                  "nan": "nan", "later500": "500", "laterslow": "timeout",
                  "closes": "closed"}
        timeout_s = 3
        for behaviour in behaviours:
            with RewardServer(behaviour) as server:
                url = server.url if behaviour != "refused" else dead_url()
                output = self.case_dir(f"reward-{behaviour}")
                keys = self.base_keys(output, rollout__reward=url,
                                      rollout__reward_timeout_s=timeout_s,
                                      rollout__num_rollout=2, eval__datasets=Raw("[]"))
                done = self.submit(self.tiny, keys, timeout=300)
                jobs = job_folders(output / "tiny-cpu")
                text = done.text + (node_log(jobs[-1]) if jobs else "")
                trained = [r for job in jobs for r in metrics_of(job)]
                word = expect[behaviour]
                named = word.lower() in text.lower() and "127.0.0.1" in text
                ok = done.code not in (0, None) and named and not trained and \
                    no_traceback(done.err)
                self.record("reward", f"reward server: {behaviour} (reward_timeout_s = "
                            f"{timeout_s})",
                            f"the job stops in bounded time naming the server and the cause "
                            f"({word}); nothing trained",
                            f"exit {done.code} in {done.seconds:.0f} s, {server.requests} "
                            f"requests; " + _first_line(text, "127.0.0.1"), ok, done.seconds)

    # -------------------------------------------------------------------------------- input

    def input_family(self) -> None:
        folder = self.case_dir("input")
        train = "python3 train.py --lr 1e-6 ${ARGS[@]}\n"
        scripts = {
            "a stray ;;": "A=1\nB=2 ;;\n" + train,
            "a script that sources itself 200 times": 'source "$0"\n' * 200 + train,
            "an array doubled 64 times": "ARGS=(--x)\n" + 'ARGS=("${ARGS[@]}" "${ARGS[@]}")\n'
            * 64 + train,
            "two scripts sourcing each other": None,
            "binary garbage": bytes(range(256)) * 40,
            "an empty script": "",
            "an unterminated quote": 'ARGS="--lr 1e-6\n' + train,
            "an unterminated heredoc": "cat <<EOF\n--lr\n" + train,
            "$( ) nested 500 deep": "X=" + "$(" * 500 + "echo" + ")" * 500 + "\n" + train,
            "a 2 MB line": "X=" + "a" * (2 << 20) + "\n" + train,
            "100,000 assignments": "".join(f"V{i}={i}\n" for i in range(100_000)) + train,
            "a while loop that never ends": "while true; do X=1; done\n" + train,
            "function recursion": "f() { f; }\nf\n" + train,
        }
        if self.quick:
            scripts = dict(list(scripts.items())[:3])
        for what, text in scripts.items():
            script = folder / f"script-{abs(hash(what))}.sh"
            if text is None:
                (folder / "b.sh").write_text(f"source {script.name}\nB=1\n" * 100)
                text = "source b.sh\n" * 100 + train
            script.write_bytes(text if isinstance(text, bytes) else text.encode())
            done = self.vime("import", str(script), timeout=60, cwd=folder)
            ok = done.code in (0, 1) and no_traceback(done.text) and done.seconds < 30
            self.record("input", f"vime import: {what}",
                        "a diagnostic or a spec within 30 s, no traceback",
                        f"exit {done.code} in {done.seconds:.1f} s; "
                        + _first_line(done.err, "V9"), ok, done.seconds)
        self._tomls(folder)
        self._eval_files(folder)
        self._read_only(folder)

    def _tomls(self, folder: Path) -> None:
        base = self.tiny.read_text()
        cases = {
            "arrays nested 500 deep": base + "\n[extra]\nx = " + "[" * 500 + "]" * 500 + "\n",
            "inline tables nested 500 deep": base + "\n[extra]\nx = " + "{a = " * 500 + "1"
            + "}" * 500 + "\n",
            "a [a.b.c...] header 500 deep": base + "\n[" + ".".join(["a"] * 500) + "]\nx = 1\n",
            "dotted key 500 deep": base + "\n" + ".".join(["k"] * 500) + " = 1\n",
            "arrays nested 100,000 deep": base + "\n[extra]\nx = " + "[" * 100_000 + "]"
            * 100_000 + "\n",
            "an empty file": "",
            "invalid UTF-8": base.encode().replace(b"tiny-cpu", b"tiny-\xff\xfe"),
            "a 20 MB string": base + f'\n[extra]\nx = "{"a" * (20 << 20)}"\n',
            "a NUL byte": base.replace("seed = 1234", "seed = 12\x0034"),
            "an integer of 5,000 digits": base.replace("seed = 1234", "seed = " + "9" * 5000),
            "a duplicated table": base + "\n[experiment]\nname = \"again\"\n",
            "a number where a table is": base.replace("[train.optimizer]", "train.optimizer = 3\n[x]"),
        }
        if self.quick:
            cases = dict(list(cases.items())[:2])
        for what, text in cases.items():
            spec = folder / f"spec-{abs(hash(what))}.toml"
            spec.write_bytes(text if isinstance(text, bytes) else text.encode())
            done = self.vime("plan", str(spec), timeout=60)
            ok = done.code in (1, 2) and no_traceback(done.text) and done.seconds < 30 and \
                ("error[V" in done.err or "vime: error" in done.err)
            self.record("input", f"vime plan, a spec with {what}",
                        "a positioned diagnostic within 30 s (exit 1), no traceback",
                        f"exit {done.code} in {done.seconds:.1f} s; "
                        + _first_line(done.err, "error"), ok, done.seconds)
        for what, value in (("a --set nested 500 deep", "train.x=" + "[" * 500 + "]" * 500),
                            ("a --set of a 500-deep key", ".".join(["k"] * 500) + "=1"),
                            ("a --set without =", "train.lr"),
                            ("a --set of an empty key", "=3")):
            done = self.vime("plan", str(self.tiny), "--set", value, timeout=60)
            ok = done.code in (1, 2) and no_traceback(done.text) and "error" in done.err
            self.record("input", f"vime plan, {what}", "a diagnostic, no traceback",
                        f"exit {done.code}; " + _first_line(done.err, "error"), ok, done.seconds)

    def _eval_files(self, folder: Path) -> None:
        cases = {
            "wrong keys": ('{"question": "What is 1 + 1?", "answer": "2"}\n', "V731"),
            "no lines": ("", "V733"),
            "a null prompt": ('{"prompt": null, "label": "2"}\n', "V733"),
            "a numeric prompt": ('{"prompt": 3, "label": "2"}\n', "V733"),
            "an object prompt": ('{"prompt": {"a": 1}, "label": "2"}\n', "V733"),
            "a line that is not JSON": ('{"prompt": "x", "label": "2"\n', "V73"),
            "a missing file": (None, "V732"),
        }
        if self.quick:
            cases = dict(list(cases.items())[:3])
        for what, (text, code) in cases.items():
            path = folder / f"eval-{abs(hash(what))}.jsonl"
            if text is not None:
                path.write_text(text)
            datasets = ('[{name = "probe", prompt_data = ' + json.dumps(str(path)) +
                        ", n_samples_per_prompt = 1}]")
            done = self.vime("plan", str(self.tiny), "--set", f"eval.datasets={datasets}",
                             timeout=60)
            ok = f"[{code}" in done.err and str(path.name) in done.err and \
                no_traceback(done.text)
            self.record("input", f"eval file with {what}: vime plan",
                        f"{code} naming the file (and line), before any job",
                        f"exit {done.code}; " + _first_line(done.err, code), ok, done.seconds)
        # the same at submit --local: refused before Ray starts
        path = folder / "eval-null-submit.jsonl"
        path.write_text('{"prompt": null, "label": "2"}\n')
        output = folder / "submit-eval"
        datasets = ('[{name = "probe", prompt_data = ' + json.dumps(str(path)) +
                    ", n_samples_per_prompt = 1}]")
        done = self.vime("submit", "--local", str(self.tiny),
                         *set_args(self.base_keys(output)), "--set",
                         f"eval.datasets={datasets}", timeout=120)
        started = any((output / "tiny-cpu").glob("local-*/logs"))
        ok = done.code == 1 and "V733" in done.err and not started and no_traceback(done.text)
        self.record("input", "eval file with a null prompt: vime submit --local",
                    "refused (exit 1) before the job starts",
                    f"exit {done.code} in {done.seconds:.1f} s; job started: {started}; "
                    + _first_line(done.err, "V733"), ok, done.seconds)

    def _read_only(self, folder: Path) -> None:
        for what, hf in (("a read-only HF export folder", True), ("a read-only model.save", False)):
            save = folder / f"ro-{hf}"
            target = save / "hf" if hf else save
            target.mkdir(parents=True, exist_ok=True)
            mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs",
                                      str(target)], capture_output=True, text=True)
            if mounted.returncode:
                self.record("input", what, "said before the job starts",
                            f"not injected: {mounted.stderr.strip()}", True)
                continue
            try:
                output = folder / f"ro-out-{hf}"
                done = self.submit(self.tiny, self.base_keys(
                    output, model__save=str(save), checkpoint__save_hf_interval=1 if hf else 0,
                    rollout__num_rollout=1), timeout=120)
            finally:
                subprocess.run(["umount", "-l", str(target)], check=False)
            started = any((output / "tiny-cpu").glob("local-*/logs"))
            ok = done.code not in (0, None) and "Read-only file system" in done.err and \
                not started and no_traceback(done.text)
            self.record("input", f"{what}: vime submit --local",
                        "said before the job starts, naming the folder",
                        f"exit {done.code} in {done.seconds:.1f} s; job started: {started}; "
                        + _first_line(done.err, "Read-only"), ok, done.seconds)

    # ------------------------------------------------------------------------------ summary

    def summary(self, argv: list[str]) -> str:
        commit = self.commit  # at the start: other work may commit while the probe runs
        families: dict[str, list[Result]] = {}
        for result in self.results:
            families.setdefault(result.family, []).append(result)
        lines = [f"commit {commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                 f"`{' '.join(argv)}`", "", "| family | injections | pass | fail |",
                 "|---|---:|---:|---:|"]
        for family, results in families.items():
            passed = sum(r.ok for r in results)
            lines.append(f"| {family} | {len(results)} | {passed} | {len(results) - passed} |")
        total = len(self.results)
        passed = sum(r.ok for r in self.results)
        lines.append(f"| all | {total} | {passed} | {total - passed} |")
        failed = [r for r in self.results if not r.ok]
        if failed:
            lines += ["", "Failures:", ""]
            lines += [f"- {r.family}: {r.what}: expected {r.expected}; observed {r.observed}"
                      for r in failed]
        return "\n".join(lines) + "\n"


def _first_line(text: str, word: str) -> str:
    """The first line of text holding word (else its last non-empty line), shortened."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if word.lower() in line.lower():
            return line[:300]
    return lines[-1][:300] if lines else ""


def corrupt(folder: Path, action: str, target: str) -> None:
    path = folder / target
    if action == "state":
        state_path = folder / "state.json"
        text = state_path.read_text()
        state = json.loads(text)
        if target == "offset":
            offset = state["data"]["offset"]
            text = text.replace(f'"offset": {offset}', f'"offset": {(offset + 1) % 10}', 1)
        elif target == "next_rollout":
            text = text.replace(f'"next_rollout": {state["next_rollout"]}',
                                f'"next_rollout": {state["next_rollout"] - 3}', 1)
        elif target == "weight_version":
            text = text.replace(f'"weight_version": {state["weight_version"]}',
                                f'"weight_version": {state["weight_version"] + 1}', 1)
        elif target == "format":
            text = text.replace('"format": 1', '"format": 2', 1)
        elif target == "files":
            state["files"] = {}
            text = json.dumps(state, indent=1) + "\n"
        state_path.write_text(text)
    elif action == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2])
    elif action == "remove":
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    elif action == "jsonbyte":
        data = bytearray(path.read_bytes())
        data[0] = ord("[")
        path.write_bytes(bytes(data))
    elif action == "flip":
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif action == "empty":
        path.write_bytes(b"")


def dead_url() -> str:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{free.getsockname()[1]}/score"


class RewardServer:
    """A reward server on loopback whose answers misbehave as named: slow (a valid answer
    one byte a second), hang (no answer), status500, garbage (200 with text), short (one
    score too few), nan, closes (the connection closed mid-answer); later500 and laterslow
    answer the empty probe and misbehave on the first real batch."""

    def __init__(self, behaviour: str):
        owner = self
        self.behaviour = behaviour
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802  (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests += 1
                owner.answer(self, len(body.get("samples", [])))

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.closing = threading.Event()

    def answer(self, handler, count: int) -> None:
        good = json.dumps({"scores": [0.1 * (i % 3) for i in range(count)]}).encode()
        behaviour = self.behaviour
        if behaviour.startswith("later"):
            if count == 0:
                return self._send(handler, 200, good)
            behaviour = behaviour[len("later"):]
        if behaviour == "slow":
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(good)))
            handler.end_headers()
            for byte in good:
                if self.closing.is_set():
                    return None
                with contextlib.suppress(OSError):
                    handler.wfile.write(bytes([byte]))
                    handler.wfile.flush()
                time.sleep(1)
            return None
        if behaviour == "hang":
            self.closing.wait(600)
            return None
        if behaviour == "500":
            return self._send(handler, 500, b"internal trouble")
        if behaviour == "status500":
            return self._send(handler, 500, b"internal trouble")
        if behaviour == "garbage":
            return self._send(handler, 200, b"<html>not scores</html>")
        if behaviour == "short":
            return self._send(handler, 200, json.dumps(
                {"scores": [0.0] * max(0, count - 1)}).encode() if count else good)
        if behaviour == "nan":
            return self._send(handler, 200, json.dumps(
                {"scores": [float("nan")] * count}).encode())
        if behaviour == "closes":
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(good) + 100))
            handler.end_headers()
            handler.wfile.write(good[:5])
            handler.wfile.flush()
            handler.connection.shutdown(socket.SHUT_RDWR)
            return None
        return self._send(handler, 200, good)

    @staticmethod
    def _send(handler, status: int, data: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        with contextlib.suppress(OSError):
            handler.wfile.write(data)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()


PROBE_FUNCTIONS = '''"""Rollout functions and rewards of the fault probe (tests/tools/fault_probe.py)."""
import math

BAD = 3


def reward(ctx):
    return 0.5 + 0.1 * (ctx.index % 2)


def constant_reward(**kwargs):
    return 1.0


async def sevens(ctx):
    await ctx.generate()
    ctx.loss_mask[:] = [7] * len(ctx.loss_mask)
    return reward(ctx)


async def string_token(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.token_ids[0] = "7"
    return reward(ctx)


async def float_token(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.token_ids[0] = 3.0
    return reward(ctx)


async def out_of_vocabulary(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.token_ids[-1] = 99999
    return reward(ctx)


async def negative_token(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.token_ids[-1] = -1
    return reward(ctx)


async def short_mask(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.loss_mask.pop()
    return reward(ctx)


async def text_log_prob(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.log_probs[0] = "-0.5"
    return reward(ctx)


async def emptied(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.token_ids.clear()
        ctx.loss_mask.clear()
        ctx.log_probs.clear()
    return reward(ctx)


async def replaced_by_str(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.token_ids = "7 8 9"
    return reward(ctx)


async def mask_none(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        ctx.loss_mask = None
    return reward(ctx)


async def masks_everything(ctx):
    await ctx.generate()
    ctx.loss_mask[:] = [0] * len(ctx.loss_mask)
    return reward(ctx)


async def raises(ctx):
    await ctx.generate()
    if ctx.index == BAD:
        raise ValueError("the probe's tool broke")
    return reward(ctx)


async def reward_text(ctx):
    await ctx.generate()
    return "high" if ctx.index == BAD else reward(ctx)


async def reward_nan(ctx):
    await ctx.generate()
    return math.nan if ctx.index == BAD else reward(ctx)
'''


FAMILIES = ("input", "reward", "rollout", "lock", "corrupt", "kill")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few injections of each family")
    parser.add_argument("--only", default=",".join(FAMILIES),
                        help=f"families, comma-separated (of {', '.join(FAMILIES)})")
    parser.add_argument("--work", type=Path, default=None,
                        help="the folder of jobs and results (default: a new one in /tmp)")
    parser.add_argument("--seed", type=int, default=20261207)
    args = parser.parse_args(argv)
    work = (args.work or Path(f"/tmp/vime-fault-probe-{time.strftime('%Y%m%d-%H%M%S')}"))
    work.mkdir(parents=True, exist_ok=True)
    work = work.resolve()
    print(f"fault probe: {work}", flush=True)
    probe = Probe(work, args.quick, args.seed)
    families = [f for f in args.only.split(",") if f]
    unknown = set(families) - set(FAMILIES)
    if unknown:
        parser.error(f"no family {', '.join(sorted(unknown))}")
    started = time.monotonic()

    def family(name: str, step: Callable[[], None]) -> None:
        """One family's injections; a failure of the probe itself is recorded, not fatal."""
        if name not in families:
            return
        try:
            step()
        except Exception as err:  # noqa: BLE001  (the probe goes on to the next family)
            probe.record(name, "the probe itself", "runs to its end",
                         f"{type(err).__name__}: {err}", False)

    modes = list(Probe.KILL_MODES)
    references: dict[str, Path] = {}

    def every() -> Path:
        if "every" not in references:
            references["every"] = probe.reference("every", checkpoint__save_interval=1)
        return references["every"]

    def kill_every() -> None:
        for chain in range(1 if args.quick else 4):
            probe.kill_chain(f"every-{chain}", every(), probe.rng.sample(modes, 2 if args.quick
                                                                          else 4))

    def kill_sparse() -> None:
        sparse = probe.reference("sparse", checkpoint__save_interval=3, checkpoint__keep_last=2)
        for chain in range(2):
            probe.kill_chain(f"sparse-{chain}", sparse, probe.rng.sample(modes, 3),
                             checkpoint__save_interval=3, checkpoint__keep_last=2)

    try:
        family("input", probe.input_family)
        family("lock", probe.lock_family)
        family("kill", kill_every)
        family("corrupt", lambda: probe.corrupt_family(every()))
        if not args.quick:
            family("kill", kill_sparse)
        family("reward", probe.reward_family)
        family("rollout", probe.rollout_family)
    finally:
        text = probe.summary(sys.argv) + f"\n{(time.monotonic() - started) / 60:.1f} minutes\n"
        (work / "results.md").write_text(text)
        print(text, flush=True)
    return 0 if all(r.ok for r in probe.results) else 1


if __name__ == "__main__":
    sys.exit(main())
