"""One job at a time per folder a run writes: `<folder>/lock.json` names the job that holds it.

A run writes its experiment folder (job folders) and its checkpoint folder (checkpoints,
`latest`, hf/), which another experiment's model.save may name too: two jobs writing one
checkpoint folder resume from, overwrite and clean up each other's saves. So `vime submit`
takes the lock of each (`run_folders`) before the job starts (a local launcher's pid, or a
Slurm job id) and says who holds one when it cannot; a holder that died without releasing is
stale and its lock is taken over, by one taker at a time. The file is created by link(2) of a
complete temporary file, atomic on local file systems and NFS alike. Holders, release and
staleness: docs/design.md, "One job at a time per experiment".
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from vime.launch.local import process_start

LOCK_FILE = "lock.json"


@dataclass(frozen=True)
class Holder:
    job_id: str
    launcher: str  # local | ray-address | slurm
    host: str
    pid: int | None  # the launcher's (local jobs)
    pid_start: int | None  # /proc/<pid>/stat start time, against pid reuse
    since: float
    experiment: str | None = None  # the holder's experiment folder (None: an older lock)

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.since))
        pid = f", pid {self.pid}" if self.pid else ""
        return f"job {self.job_id} ({self.launcher}) on {self.host}{pid}, since {when}"


@dataclass(frozen=True)
class RunFolder:
    """A folder a run writes, and what it is to the run."""

    path: Path
    role: str  # "experiment" | "checkpoints"


def run_folders(experiment_dir: Path, save_dir: Path) -> tuple[RunFolder, ...]:
    """The folders a run writes and holds, in the order they are taken: its experiment
    folder, then its checkpoint folder (model.save, else <experiment>/checkpoints; its HF
    folders are inside it), once when they are the same folder."""
    experiment = RunFolder(Path(os.path.abspath(experiment_dir)), "experiment")
    save = RunFolder(Path(os.path.abspath(save_dir)), "checkpoints")
    return (experiment,) if save.path == experiment.path else (experiment, save)


class ExperimentLocked(Exception):
    """Another live job holds a folder of the run (its experiment, or its checkpoint folder);
    the message names that job and what to do."""

    def __init__(self, folder: Path, holder: Holder | None, role: str = "experiment"):
        """holder: None when the lock file exists and cannot be read (names no job)."""
        self.folder, self.holder, self.role = folder, holder, role
        if role == "checkpoints":
            super().__init__(self._checkpoints_message(folder, holder))
            return
        if holder is None:
            super().__init__(
                f"experiment {folder.name} has a lock file that cannot be read "
                f"({folder / LOCK_FILE} cannot be read as a lock): when no job of this "
                "experiment runs, remove it; or run beside it with --fresh")
            return
        super().__init__(
            f"experiment {folder.name} is in use by {holder.describe()} (lock {folder / LOCK_FILE}). "
            f"Wait for it, stop it with `vime cancel {holder.job_id}`, or run beside it with "
            "--fresh; if that job is gone and the lock stayed, remove the lock file")

    @staticmethod
    def _checkpoints_message(folder: Path, holder: Holder | None) -> str:
        if holder is None:
            return (f"checkpoint folder {folder} has a lock file that cannot be read "
                    f"({folder / LOCK_FILE}): when no run saves there, remove it; or point "
                    "model.save at another folder")
        of = (f", a run of experiment {Path(holder.experiment).name} ({holder.experiment})"
              if holder.experiment else "")
        return (f"checkpoint folder {folder} is in use by {holder.describe()}{of} (lock "
                f"{folder / LOCK_FILE}): two runs saving into one folder overwrite each "
                "other's checkpoints and `latest`. Point model.save at another folder, wait "
                f"for that job, or stop it with `vime cancel {holder.job_id}`; if that job is "
                "gone and the lock stayed, remove the lock file")


def _slurm_finished(job_id: str) -> bool | None:
    from vime.launch import slurm

    if not slurm.available():
        return None
    try:
        return slurm.state(job_id).finished
    except (OSError, ValueError):
        return None


def is_stale(holder: Holder, host: str | None = None) -> bool:
    """Whether a holder is known to be gone (see the module's docstring)."""
    host = host or socket.gethostname()
    if holder.launcher == "slurm":
        return bool(_slurm_finished(holder.job_id))
    if holder.host != host or not holder.pid:
        return False
    return process_start(holder.pid) != holder.pid_start


def read(folder: Path) -> Holder | None:
    """The experiment's holder, or None (no lock, or one being written)."""
    return read_path(Path(folder) / LOCK_FILE)


def read_path(path: Path) -> Holder | None:
    try:
        raw = json.loads(Path(path).read_text())
        return Holder(**{k: raw.get(k) for k in Holder.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return None


def holder_now(job_id: str, launcher: str, pid: int | None,
               experiment: Path | None = None) -> Holder:
    return Holder(job_id, launcher, socket.gethostname(), pid,
                  process_start(pid) if pid else None, time.time(),
                  str(experiment) if experiment is not None else None)


# a takeover holds its mutex for milliseconds; one older than this was left by a taker that
# died holding it
TAKEOVER_STALE_S = 30.0
# how long a submit waits for other submits' takeovers of the same stale lock
TAKEOVER_WAIT_S = 10.0


def _link_new(path: Path, content: str) -> bool:
    """Create `path` with `content`, complete, unless it exists: link(2) of a fsynced
    temporary file. Whether this call created it."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w") as handle:  # the content on disk before the name: never empty
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _take_over(folder: Path, stale: Holder) -> bool:
    """Remove the lock of `stale`, one taker at a time. Only a taker holding
    `.lock.json.takeover` removes a lock someone else wrote, and it removes it only while it
    still names `stale`: a lock a live job wrote in the meantime is never touched. Whether
    this call removed it."""
    mutex = folder / f".{LOCK_FILE}.takeover"
    if not _link_new(mutex, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                        "since": time.time()})):
        with contextlib.suppress(FileNotFoundError):
            if time.time() - mutex.stat().st_mtime > TAKEOVER_STALE_S:
                mutex.unlink()
        return False
    try:
        if read(folder) != stale:
            return False
        (folder / LOCK_FILE).unlink(missing_ok=True)
        return True
    finally:
        mutex.unlink(missing_ok=True)


def acquire(folder: Path, holder: Holder, role: str = "experiment") -> Holder | None:
    """Take a folder's lock for holder. Returns the stale holder it replaced, if any;
    the same job taking it again (its head node after the launcher) is no change.

    Raises:
        ExperimentLocked: another job holds it and is not known to be gone.
    """
    return _acquire(folder, holder, role)[1]


def _acquire(folder: Path, holder: Holder, role: str) -> tuple[bool, Holder | None]:
    """acquire, and whether this call took the lock (False: holder's job held it already)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)  # OSError: the caller names the key
    path = folder / LOCK_FILE
    content = json.dumps(asdict(holder), indent=1) + "\n"
    replaced, unreadable, deadline = None, 0, time.monotonic() + TAKEOVER_WAIT_S
    while time.monotonic() < deadline:
        if _link_new(path, content):
            return True, replaced
        current = read(folder)
        if current is None:  # being removed right now, or a file that is no lock
            unreadable += 1
            if unreadable >= 5:
                break
            time.sleep(0.05)
            continue
        if current.job_id == holder.job_id:
            return False, None
        if not is_stale(current):
            raise ExperimentLocked(folder, current, role)
        if _take_over(folder, current):
            replaced = current
        else:
            time.sleep(0.01)  # another submit is taking it over
    # None: a lock.json that stays unreadable
    raise ExperimentLocked(folder, read(folder), role)


def acquire_run(folders: tuple[RunFolder, ...], holder: Holder) -> list[Holder]:
    """Take the lock of every folder of a run (run_folders), in order; the stale holders
    replaced are returned. When one is held, the locks this call took are released again.

    Raises:
        ExperimentLocked: another job holds one of them and is not known to be gone.
        OSError: a folder cannot be made or written (the caller names its key).
    """
    taken, replaced = [], []
    try:
        for folder in folders:
            took, stale = _acquire(folder.path, holder, folder.role)
            if took:
                taken.append(folder)
            if stale is not None and stale not in replaced:
                replaced.append(stale)
    except BaseException:
        for folder in reversed(taken):
            release(folder.path, holder.job_id)
        raise
    return replaced


def check(folder: Path, role: str = "experiment") -> None:
    """Raises ExperimentLocked when a job not known to be gone holds the folder."""
    current = read(folder)
    if current is not None and not is_stale(current):
        raise ExperimentLocked(Path(folder), current, role)


def check_run(folders: tuple[RunFolder, ...]) -> None:
    """Raises ExperimentLocked for the first folder of a run that a live job holds."""
    for folder in folders:
        check(folder.path, folder.role)


def release_run(folders: tuple[RunFolder, ...], job_id: str) -> None:
    """release for every folder of a run."""
    for folder in reversed(folders):
        release(folder.path, job_id)


def release(folder: Path, job_id: str) -> None:
    """Remove the lock when job_id holds it; another job's lock is left as it is."""
    path = Path(folder) / LOCK_FILE
    current = read(folder)
    if current is None or current.job_id != job_id:
        return
    aside = path.with_name(f".{LOCK_FILE}.released-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    if (moved := read_path(aside)) is not None and moved.job_id != job_id:
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)  # not ours after all: put it back
    aside.unlink(missing_ok=True)
