"""Slurm through submitit: submit job.sbatch as it is, and ask squeue / sacct / scancel.

submitit brings the job runner each task executes (`python -m submitit.core._submit`), the
pickled entry point, and USR2 checkpoint-and-requeue. vime renders the batch script itself
(vime/emit/sbatch.py: the build folder's job.sbatch, shown by `--dry-run` and kept in the job
folder), so the executor is told to submit exactly that text, held (`sbatch --hold`) until the
job folder is written. A job.sbatch submitted with plain sbatch writes its job folder and the
entry point's pickle itself (vime/launch/batch.py, write_entry below).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from vime.emit.sbatch import BATCH_LOG, JOB_FOLDER

# requeues after a time limit before the job is left to end (submitit's max_num_timeout)
MAX_NUM_TIMEOUT = 3
TERMINAL = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
            "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "REVOKED")


class SlurmError(Exception):
    pass


def available() -> bool:
    return shutil.which("sbatch") is not None and shutil.which("srun") is not None


def time_minutes(slurm_time: str) -> int:
    """Slurm's --time formats (the schema's pattern) in whole minutes, for submitit."""
    days, _, clock = slurm_time.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:
        hours, minutes, seconds = (parts + [0, 0])[:3]
        return int(days) * 1440 + hours * 60 + minutes + (seconds > 0)
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:
        return parts[0] + (parts[1] > 0)
    return parts[0] * 60 + parts[1] + (parts[2] > 0)


def submit_command(experiment_dir: Path, script_path: str) -> list[str]:
    """How `vime submit` submits job.sbatch: held, from the experiment folder, the batch
    step's output in the job folder (which exists only once the job id does, so the script
    cannot name it: a plain `sbatch job.sbatch` writes Slurm's slurm-<job id>.out)."""
    return ["sbatch", "--hold", f"--chdir={experiment_dir}", f"--output={BATCH_LOG}", script_path]


def _entry_folder(experiment_dir: Path) -> Path:
    return experiment_dir / JOB_FOLDER / "submitit"


def submit_held(experiment_dir: Path, script: str, nodes: int, time_min: int, entry,
                max_num_timeout: int = MAX_NUM_TIMEOUT) -> str:
    """Submit `entry` (every task calls it) with `script` as the batch script, held; returns
    the job id. The caller writes the job folder, then calls release()."""
    import submitit

    class Executor(submitit.SlurmExecutor):
        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return script

        def _make_submission_command(self, submission_file_path: Path) -> list[str]:
            return submit_command(experiment_dir, str(submission_file_path))

    executor = Executor(folder=_entry_folder(experiment_dir), max_num_timeout=max_num_timeout)
    # submitit reads these for the task count and the timeout countdown; the text is ours
    executor.parameters.update(time=time_min, nodes=nodes, ntasks_per_node=1)
    try:
        job = executor.submit(entry)
    except (subprocess.CalledProcessError, submitit.core.utils.FailedJobError) as err:
        raise SlurmError(str(err).strip()) from None
    for link in experiment_dir.glob(".submission_file_*.sh"):  # submitit leaves a symlink
        if link.is_symlink():
            link.unlink()
    return job.job_id


def write_entry(experiment_dir: Path, job_id: str, entry, time_min: int,
                max_num_timeout: int = MAX_NUM_TIMEOUT) -> Path:
    """What submit_held's executor writes after sbatch answers: `entry` pickled where
    submitit's job runner loads it (<job id>/submitit/<job id>_submitted.pkl), with the
    timeout countdown of its requeues."""
    from submitit.core.utils import DelayedSubmission, JobPaths

    delayed = DelayedSubmission(entry)
    delayed.set_timeout(time_min, max_num_timeout)
    path = JobPaths(_entry_folder(experiment_dir), job_id=job_id).submitted_pickle
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    delayed.dump(tmp)
    tmp.rename(path)
    return path


def script_path(job_id: str) -> str | None:
    """The batch script a job was submitted from, as Slurm recorded it (absolute)."""
    found = _run(["squeue", "-h", "-j", job_id, "-o", "%o"])
    line = found.stdout.strip() if found.returncode == 0 else ""
    return line or None


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def release(job_id: str) -> None:
    done = _run(["scontrol", "release", job_id])
    if done.returncode:
        raise SlurmError(f"scontrol release {job_id}: {done.stderr.strip()}")


def cancel(job_id: str, signal: str | None = None) -> None:
    done = _run(["scancel", *([f"--signal={signal}"] if signal else []), job_id])
    if done.returncode:
        raise SlurmError(f"scancel {job_id}: {done.stderr.strip()}")


@dataclass(frozen=True)
class JobState:
    state: str  # PENDING, RUNNING, COMPLETED, ... or UNKNOWN
    source: str  # squeue | sacct | none
    nodes: str = ""
    elapsed: str = ""
    reason: str = ""
    workdir: str = ""
    exit_code: str = ""

    @property
    def finished(self) -> bool:
        return self.state.split()[0] in TERMINAL or self.state == "UNKNOWN"


def state(job_id: str) -> JobState:
    """squeue first (live jobs, no accounting needed), then sacct (finished jobs)."""
    queue = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%M|%N|%r|%Z"])
    line = queue.stdout.strip().splitlines()[0] if queue.returncode == 0 and queue.stdout.strip() else ""
    if line:
        state_, elapsed, nodes, reason, workdir = line.split("|", 4)
        return JobState(state_, "squeue", nodes, elapsed, reason, workdir)
    if shutil.which("sacct"):
        acct = _run(["sacct", "-n", "-P", "-X", "-j", job_id,
                     "-o", "State,Elapsed,NodeList,ExitCode,WorkDir"])
        rows = [r for r in acct.stdout.strip().splitlines() if r] if acct.returncode == 0 else []
        if rows:
            state_, elapsed, nodes, exit_code, workdir = rows[-1].split("|", 4)
            return JobState(state_, "sacct", nodes, elapsed, "", workdir, exit_code)
    return JobState("UNKNOWN", "none")
