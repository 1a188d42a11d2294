"""What `vime submit --local` and `--ray-address` show while the job runs, and `vime logs -f`
for any job: the head node's own `vime:` lines from logs/node-0.log (Ray ready,
the prompts, the actors, resumed from ...), then one line per rollout from metrics.jsonl with
the run's progress over rollout.num_rollout and an ETA, a summary and the outcome at the end.

Plain lines, no carriage returns or colours: they read the same in a terminal, a CI log and
a file (tqdm is not one of vime's dependencies). The launcher (and `vime logs -f`) calls
poll() between its checks of the job; nothing here touches the job.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from pathlib import Path
from typing import NamedTuple

BAR = 20
ROLLOUT_LINE = re.compile(r"rollout +(\d+) \| ")
# the per-phase seconds the loop records (runtime/rl/loop.py), in the order they run
PHASES = (("generate", "gen"), ("offload", "swap"), ("reward", "reward"),
          ("log_probs", "logp"), ("train", "train"), ("save", "save"),
          ("weight_sync", "sync"))


def clock(seconds: float) -> str:
    seconds = int(round(max(seconds, 0)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def bar(done: int, total: int) -> str:
    filled = BAR * done // total if total else BAR
    return "[" + "#" * filled + "." * (BAR - filled) + "]"


def eval_parts(numbers: dict[str, float]) -> list[str]:
    """The console's words for eval metrics: each dataset's accuracy and its largest pass@k."""
    parts = []
    for key in sorted(numbers):
        if key.startswith("eval/") and key.endswith("/acc"):
            name = key[len("eval/"):-len("/acc")]
            ks = [int(k.rsplit("@", 1)[1]) for k in numbers
                  if k.startswith(f"eval/{name}/pass@")]
            best = f" pass@{max(ks)} {numbers[f'eval/{name}/pass@{max(ks)}']:.2f}" if ks else ""
            parts.append(f"eval {name} acc {numbers[key]:.2f}{best}")
    return parts


def sampling_parts(numbers: dict[str, float]) -> list[str]:
    """The console's words for dynamic sampling: groups kept and filtered, and NO GROUP KEPT
    with the rollouts in a row when none was."""
    if numbers.get("rollout/groups_kept") is None:
        return []
    kept, filtered = numbers["rollout/groups_kept"], numbers.get("rollout/groups_filtered") or 0
    part = f"groups kept {kept:.0f} filtered {filtered:.0f}"
    if not kept:
        part += f" NO GROUP KEPT ({numbers.get('rollout/empty_streak') or 1:.0f} in a row)"
    return [part]


def rollout_line(record: dict, total: int, eta_s: float | None) -> str:
    index, width = record["rollout"], len(str(total))
    if index >= total:  # the evaluation of the final weights (eval.at_end)
        return " | ".join(["final weights", *eval_parts(record)])
    parts = [f"rollout {index:>{width}} | {index + 1:>{width}}/{total} {bar(index + 1, total)} "
             f"{100 * (index + 1) // total:3d}%"]
    for key, fmt in (("reward/mean", "reward {:.3f}"), ("reward/acc", "acc {:.2f}"),
                     ("response_len/mean", "len {:.1f}"),
                     ("throughput/generate_tokens_per_s", "{:.0f} tok/s")):
        if record.get(key) is not None:
            parts.append(fmt.format(record[key]))
    parts += sampling_parts(record)
    phases = " ".join(f"{short} {record[f'time/{name}']:.2f}" for name, short in PHASES
                      if record.get(f"time/{name}") is not None)
    if phases:
        parts.append(f"{phases} s")
    parts += eval_parts(record)
    parts.append("ETA " + (clock(eta_s) if eta_s is not None else "-"))
    return " | ".join(parts)


class _Tail:
    """New complete lines of a file that another process appends to."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:
            return []
        self.offset += len(chunk)
        *complete, self.partial = (self.partial + chunk).split(b"\n")
        return [line.decode(errors="replace") for line in complete]


def next_submit(after, total: int, resume_with: str | None = None) -> str:
    """Where the next submit of a stopped run starts (`after`, a
    vime.launch.resume.StartPoint of the run's checkpoint.on_corrupt): the job's last line and
    `vime cancel` say it in these words. `resume_with` is the submit that resumes it (job.json's
    "resume"), else "the next `vime submit` of this spec"."""
    if after.problem:  # checkpoint.on_corrupt = "stop" with a corrupt newest checkpoint
        return (f"{resume_with or 'the next `vime submit` of this spec'} does not start: "
                f"{after.describe(total)}")
    if resume_with:
        return f"{resume_with} " + (
            f"resumes it from rollout {after.next_rollout} (checkpoint {after.checkpoint})"
            if after.checkpoint else "starts it again (no checkpoint yet)")
    return "the next `vime submit` of this spec " + (
        f"resumes from rollout {after.next_rollout} (checkpoint {after.checkpoint})"
        if after.checkpoint else "starts fresh (no checkpoint yet)")


class JobTimes(NamedTuple):
    started: float | None  # the job's start record's time
    finished: float | None  # its outcome record's


def job_times(job_dir: Path) -> JobTimes:
    """When the job started and ended, by its own records: the head node's start
    (ray/ready-<attempt>.json "job_start", the first attempt's; outcome.json "started" for a
    --ray-address job, which starts no Ray) and the driver's end (outcome.json "finished").
    Every duration said of a job runs from one to the other."""
    starts = []
    for ready in Path(job_dir).glob("ray/ready-*.json"):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            starts.append(float(json.loads(ready.read_text())["job_start"]))
    try:
        outcome = json.loads((Path(job_dir) / "outcome.json").read_text())
    except (OSError, ValueError):
        outcome = {}
    if not isinstance(outcome, dict):
        outcome = {}
    if isinstance(outcome.get("started"), (int, float)):
        starts.append(float(outcome["started"]))
    finished = outcome.get("finished")
    return JobTimes(min(starts) if starts else None,
                    float(finished) if isinstance(finished, (int, float)) else None)


# how a job that stopped before its end was stopped, in the outcome's words
STOPPED = {"interrupted": "interrupted", "terminated": "terminated (SIGTERM)",
           "cancelled": "cancelled (vime cancel)"}


class Progress:
    def __init__(self, job_dir: Path, num_rollout: int, out=None, quiet: bool = False,
                 started: float | None = None):
        self.job_dir, self.total, self.quiet = Path(job_dir), num_rollout, quiet
        self.out = out or sys.stdout
        self.log = _Tail(self.job_dir / "logs" / "node-0.log")
        self.metrics = _Tail(self.job_dir / "metrics.jsonl")
        self.started = time.time() if started is None else started
        self.records: list[dict] = []
        self.pending: dict[int, dict] = {}
        # (when, how many records): the end of the first poll that found rollouts
        self.anchor: tuple[float, int] | None = None

    def say(self, line: str) -> None:
        if not self.quiet:
            print(line, file=self.out, flush=True)

    def poll(self) -> None:
        for line in self.log.lines():
            # the head's own lines, in the log's order; Ray's and tracebacks stay in the log
            if line.startswith("vime: job failed: "):
                continue  # the launcher's last line says it (vime/cli.py)
            if line.startswith("vime: "):
                self.say(line)
            elif (found := ROLLOUT_LINE.match(line)):
                # the loop's console line follows its metrics.jsonl record (runtime/rl/metrics.py)
                self._read_metrics()
                record = self.pending.pop(int(found.group(1)), None)
                if record is None:
                    self.say(line)
                    continue
                self.records.append(record)
                self.say(rollout_line(record, self.total, self.eta(record)))
        if self.records and self.anchor is None:
            self.anchor = (time.time(), len(self.records))

    def _read_metrics(self) -> None:
        for line in self.metrics.lines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            self.pending[record["rollout"]] = record

    def eta(self, record: dict) -> float | None:
        """Rollouts left × the mean wall time of the rollouts seen written since the first
        poll that found any. Until then (the first rollout of a run watched from its start,
        or the rollouts already in the log of a job `vime logs -f` joins, all read at once)
        the mean of the loop's own time per rollout."""
        left = self.total - record["rollout"] - 1
        if self.anchor is None:
            times = [r["time/rollout"] for r in self.records if r.get("time/rollout") is not None]
            per = sum(times) / len(times) if times else None
        else:
            since, count = self.anchor
            per = (time.time() - since) / (len(self.records) - count)
        return None if per is None else left * per

    def summary(self, until: float | None = None) -> str | None:
        """One line of what this job did: rollouts, reward from first to last, wall time
        (job_times: from the job's start record to its outcome record; where one is missing,
        from `started`, and until `until`, default now)."""
        # the final weights' evaluation (rollout = num_rollout) trained nothing
        trained = [r for r in self.records if r["rollout"] < self.total]
        if not trained:
            return None
        first, last = trained[0], trained[-1]
        recorded = job_times(self.job_dir)
        began = self.started if recorded.started is None else recorded.started
        ended = recorded.finished or (time.time() if until is None else until)
        line = (f"rollouts {first['rollout']} to {last['rollout']} of {self.total} in "
                f"{clock(ended - began)}")
        if first.get("reward/mean") is not None and last.get("reward/mean") is not None:
            line += f", reward {first['reward/mean']:.3f} -> {last['reward/mean']:.3f}"
        return line

    def ending(self, job_id: str, state: str, error: str | None, log: Path, after=None,
               how: str | None = None, until: float | None = None,
               resume_with: str | None = None) -> str:
        """The job's last line: succeeded with the summary; stopped (STOPPED, or `how`) with
        where the next submit resumes (`after`, a vime.launch.resume.StartPoint) and the
        submit that does (`resume_with`, job.json's "resume"), or that a later job has
        finished the run; failed with the error and the log."""
        if state == "succeeded":
            did = self.summary(until)
            return f"job {job_id} succeeded" + (f": {did}" if did else "")
        if state in STOPPED or how:
            last = self.records[-1]["rollout"] if self.records else None
            line = f"job {job_id} {how or STOPPED[state]}" + (
                f" after rollout {last}" if last is not None else "")
            if after is None:
                return line
            if after.checkpoint and after.next_rollout >= self.total:
                return line + (f"; a later job has since finished its run (checkpoint "
                               f"{after.checkpoint} is at rollout {after.next_rollout} of "
                               f"{self.total}): there is nothing to resume")
            return f"{line}; {next_submit(after, self.total, resume_with)}"
        error = error or ""
        return (f"job {job_id} failed" + (f": {error}" if error else "")
                + ("" if str(log) in error else f"\n  full log: {log}"))
