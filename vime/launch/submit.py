"""`vime submit`: compile, write the job folder, hand the job to Slurm (or run it here).

The job folder holds what the job was made from (resolved.toml with the input's hash,
plan.json, the argument files, the exact job.sbatch) before the job can start: a Slurm job is
submitted held and released once its folder is complete."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vime import __version__
from vime.emit import build
from vime.launch import jobdir, lock, paths, ports, resume, slurm
from vime.launch.jobdir import DEFAULT_DRIVER, JobFolder

ARTIFACTS = ("resolved.toml", "plan.json", "megatron.args", "vllm.args")


class SubmitError(Exception):
    """Cannot submit (no Slurm, a folder vime cannot use, sbatch said no): exit 2."""


@dataclass
class Prepared:
    experiment_dir: Path
    script: str
    files: dict[str, str]
    launch: dict
    info: dict
    plan: object = field(repr=False)


def experiment_dir(output_dir: str, name: str) -> Path:
    path = Path(os.path.abspath(Path(output_dir).expanduser())) / name
    # Slurm and submitit read %j, %t, %A … in paths as patterns, and a backslash anywhere in
    # an output file name turns Slurm's patterns off (sbatch(1), "filename pattern")
    for char, why in (("%", "a file-name pattern"), ("\\", "turning file-name patterns off")):
        if char in str(path):
            raise SubmitError(f"experiment folder {str(path)!r} contains {char!r}, which Slurm "
                              f"reads as {why}; choose another output_dir")
    if "\n" in str(path) or "\r" in str(path):
        raise SubmitError("the experiment folder's path contains a line break")
    return path


def prepare(result, source_name: str, source_text: str, plan_obj: dict, launcher: str,
            spec_dir: Path | None = None, ray_address: str | None = None) -> Prepared:
    """The job folder's files; the spec's relative paths are read from spec_dir (default: the
    spec's own folder) and the folder vime runs in. job.json records the submit that resumes
    the run (ray_address: that of --ray-address)."""
    # the job runs elsewhere (another node, another working folder): its files get absolute
    # paths, while `vime compile`'s stay as written (vime/launch/paths.py)
    spec_dir = spec_dir or Path(source_name).resolve().parent
    spec = paths.absolute(result.spec, spec_dir, Path.cwd())
    plan = dataclasses.replace(result.plan, spec=spec)
    folder = experiment_dir(spec.experiment.output_dir, spec.experiment.name)
    # job.sbatch has no path from the spec: the same text as the build folder's (vime compile)
    compiled = build.files(plan, source_name, source_text, plan_obj, "<job folder>",
                           python=sys.executable)
    files = {name: compiled[name] for name in (*ARTIFACTS, "job.sbatch")}
    script = files["job.sbatch"]
    ray = spec.cluster.ray
    launch = {
        "nodes": spec.cluster.nodes,
        "gpus_per_node": spec.cluster.gpus_per_node,
        "ray": {"port": ray.port, "dashboard_host": ray.dashboard_host,
                "dashboard_port": ray.dashboard_port, "startup_timeout_s": ray.startup_timeout_s},
        "fixed_head_ports": launcher == "slurm" and spec.cluster.slurm.exclusive,
        "env": dict(spec.cluster.env),
        "driver": os.environ.get("VIME_DRIVER") or DEFAULT_DRIVER,
    }
    info = {
        "launcher": launcher,
        "experiment": spec.experiment.name,
        "spec": source_name,
        "spec_dir": str(spec_dir),  # rollout.reward's module is looked for here first
        "spec_sha256": hashlib.sha256(source_text.encode()).hexdigest(),
        "vime_version": __version__,
        "python": sys.executable,
        "nodes": spec.cluster.nodes,
        "gpus_per_node": spec.cluster.gpus_per_node,
        "driver": launch["driver"],
        "resume": resume.command(result.spec.invocation, launcher, ray_address, Path.cwd()),
    }
    return Prepared(folder, script, files, launch, info, plan)


def dry_run_text(prepared: Prepared) -> str:
    launch = prepared.launch
    command = slurm.submit_command(Path("<that folder>"), "job.sbatch")
    return (f"# job.sbatch (submitted from {prepared.experiment_dir}/ as "
            f"`{' '.join(command)}`)\n"
            + prepared.script + "\n"
            + ports.describe(launch["nodes"], launch["ray"]["port"],
                             launch["ray"]["dashboard_port"], launch["fixed_head_ports"])
            + f"\ndriver: {launch['driver']}\n(dry run: nothing was submitted)\n")


def environment_error(err: OSError, what: str, key: str) -> SubmitError:
    """An OS error on a path the user chose, said as such: the path, the reason, the key."""
    reason = "No space left on device" if err.errno == errno.ENOSPC else (err.strerror or str(err))
    return SubmitError(f"cannot write {what} {err.filename or ''}: {reason}. This is the "
                       f"machine's file system, not the spec: make {key} a writable folder "
                       "with free space, or point it elsewhere")


def write_folder(prepared: Prepared, job_id: str) -> JobFolder:
    """Raises:
        SubmitError: the folder cannot be written (read-only, a file in the way, a full
            disk); a half-written job folder is removed."""
    folder = JobFolder(prepared.experiment_dir / job_id)
    existed = folder.path.exists()
    info = dict(prepared.info, job_id=job_id,
                submitted=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    try:
        folder.path.mkdir(parents=True, exist_ok=True)
        folder.write({**prepared.files,
                      "launch.json": jobdir.dumps(dict(prepared.launch, job_id=job_id)),
                      "job.json": jobdir.dumps(info)})
    except OSError as err:
        if not existed:
            shutil.rmtree(folder.path, ignore_errors=True)
        raise environment_error(err, "the job folder", "experiment.output_dir") from None
    return folder


def run_folders(prepared: Prepared) -> tuple[lock.RunFolder, ...]:
    """The folders the job writes, each held by one job at a time (vime/launch/lock.py)."""
    return lock.run_folders(prepared.experiment_dir,
                            resume.save_dir(prepared.plan.spec, prepared.experiment_dir))


def check_lock(prepared: Prepared) -> None:
    """Raises SubmitError naming the job that holds the experiment or the checkpoint folder
    (vime/launch/lock.py)."""
    try:
        lock.check_run(run_folders(prepared))
    except lock.ExperimentLocked as err:
        raise SubmitError(str(err)) from None


def _acquire(prepared: Prepared, job_id: str, launcher: str, pid: int | None) -> None:
    try:
        replaced = lock.acquire_run(run_folders(prepared), lock.holder_now(
            job_id, launcher, pid, prepared.experiment_dir))
    except lock.ExperimentLocked as err:
        raise SubmitError(str(err)) from None
    except OSError as err:
        key = "model.save" if prepared.plan.spec.model.save and \
            Path(err.filename or "").is_relative_to(prepared.plan.spec.model.save) \
            else "experiment.output_dir"
        raise environment_error(err, "the run's lock in", key) from None
    for stale in replaced:
        print(f"vime: {stale.describe()} is gone; its lock on the run's folders is taken over",
              file=sys.stderr, flush=True)
        if stale.launcher == "local":  # judged stale on this host: its launcher is dead
            _stop_leftovers(stale.job_id)


def _stop_leftovers(job_id: str) -> None:
    """The processes of a local job whose launcher died with its nodes (SIGKILL): Ray's, in
    sessions of their own, marked with the job's id, which nothing else stops."""
    from vime.launch import local

    left = local.job_processes(job_id)
    if left:
        print(f"vime: stopping {len(left)} process(es) job {job_id} left running",
              file=sys.stderr, flush=True)
        local.stop_job(job_id, [], grace_s=0)


def _release(prepared: Prepared, job_id: str) -> None:
    lock.release_run(run_folders(prepared), job_id)


def submit_slurm(prepared: Prepared) -> JobFolder:
    from runtime.node.job import SlurmEntry

    if not slurm.available():
        raise SubmitError("sbatch/srun not found: this machine is not a Slurm submit host "
                          "(use --local to run here, or --ray-address for a running Ray cluster)")
    prepared.experiment_dir.mkdir(parents=True, exist_ok=True)
    check_lock(prepared)
    spec = prepared.plan.spec
    try:
        job_id = slurm.submit_held(prepared.experiment_dir, prepared.script, spec.cluster.nodes,
                                   slurm.time_minutes(spec.cluster.slurm.time),
                                   SlurmEntry(str(prepared.experiment_dir)))
    except slurm.SlurmError as err:
        raise SubmitError(f"sbatch refused the job: {err}") from None
    try:
        _acquire(prepared, job_id, "slurm", None)  # released by the job's head node
        folder = write_folder(prepared, job_id)
        jobdir.remember(job_id, folder.path)
        slurm.release(job_id)
    except BaseException:
        slurm.cancel(job_id)
        _release(prepared, job_id)
        raise
    return folder


# ids drawn for a port block no process of this machine listens on (vime/launch/ports.py)
ID_DRAWS = 4 * ports.BLOCKS


def new_local_id(kind: str) -> str:
    """A job id for a run here or on a Ray cluster, whose Ray port block (ports.plan) is free
    on this machine: ids hash into ports.BLOCKS blocks, and two jobs in one block meet on
    the GCS port."""
    # short: /tmp/vime-<id>-<attempt>-<node>/session_…/sockets/plasma_store < 107 bytes
    for _ in range(ID_DRAWS):
        job_id = f"{kind}-{uuid.uuid4().hex[:8]}"
        if not ports.block_in_use(ports.plan(job_id, 0, 0, False).base):
            return job_id
    return job_id  # every block busy: Ray says so at its start


def _run_here(prepared: Prepared, job_id: str, launcher: str, on_start,
              run: Callable[[Path], int]) -> tuple[JobFolder, int]:
    """Under the experiment's lock: write the job folder, call on_start(folder), then
    run(job folder) for the job's exit code."""
    _acquire(prepared, job_id, launcher, os.getpid())
    try:
        folder = write_folder(prepared, job_id)
        jobdir.remember(job_id, folder.path)
        if on_start:
            on_start(folder)
        code = run(folder.path)
    finally:
        _release(prepared, job_id)
    return folder, code


def submit_local(prepared: Prepared, on_start=None, on_poll=None,
                 job_id: str | None = None) -> tuple[JobFolder, int]:
    """Write the job folder (job_id: the one `submit --detach` chose), call on_start(folder),
    run the job here; on_poll() between the launcher's checks (vime/launch/progress.py)."""
    from vime.launch.local import run_local

    launch = prepared.launch
    return _run_here(prepared, job_id or new_local_id("local"), "local", on_start, lambda path:
                     run_local(path, launch["nodes"], launch["gpus_per_node"], launch["env"],
                               on_poll or (lambda: None)))


def submit_attached(prepared: Prepared, address: str, on_start=None, on_poll=None,
                    job_id: str | None = None) -> tuple[JobFolder, int]:
    """As submit_local, the job's driver on the Ray cluster at `address`."""
    from vime.launch.local import run_attached

    return _run_here(prepared, job_id or new_local_id("ray"), "ray-address", on_start,
                     lambda path: run_attached(path, address, prepared.launch["env"],
                                               on_poll or (lambda: None)))
