"""`vime status / logs / cancel JOB`: JOB is a job folder or a Slurm job id.

A Slurm job id leads to its folder through Slurm itself: the job's working directory is its
experiment folder (`sbatch --chdir`), asked from squeue first and sacct after (finished jobs
leave squeue after MinJobAge)."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from vime.launch import local as local_launcher
from vime.launch import slurm
from vime.launch.jobdir import JobFolder, is_job_folder, remembered
from vime.words import plural


class FollowError(Exception):
    pass


def find(job: str) -> JobFolder:
    """A job folder, or a job id from any folder: the ids `vime submit` remembered
    (jobdir.remember: Slurm, local and --ray-address runs), then job folders of that name
    under this folder (build/runs/<experiment>/<id>, ...), then, for Slurm ids, Slurm's own
    working directory of the job."""
    path = Path(job).expanduser()
    if path.is_dir():
        if is_job_folder(path):
            return JobFolder(path.resolve())
        raise FollowError(f"{job} is a folder but not a vime job folder (no job.json)")
    if "/" not in job:
        for candidate in (remembered(job), *_under_here(job)):
            if candidate is not None and is_job_folder(candidate) and \
                    JobFolder(candidate).info.get("job_id") == job:
                return JobFolder(candidate)
    if not job.isdigit():
        raise FollowError(f"{job!r} is neither a job folder nor a Slurm job id, nor the id of a "
                          "job submitted from this machine or found under this folder; give "
                          "its job folder (<output_dir>/<experiment.name>/<job id>)")
    if not slurm.available():
        raise FollowError(f"no Slurm here to look job {job} up; give its job folder instead")
    found = slurm.state(job)
    if found.source == "none":
        raise FollowError(f"Slurm knows no job {job} (not in squeue, nor in sacct)")
    candidate = Path(found.workdir) / job
    if is_job_folder(candidate) and JobFolder(candidate).info.get("job_id") == job:
        return JobFolder(candidate)
    if found.state in ("PENDING", "CONFIGURING"):
        raise FollowError(f"job {job} is {found.state} and has no job folder yet: a job.sbatch "
                          "submitted with plain sbatch writes it when the job starts "
                          "(vime/launch/batch.py); ask again then")
    raise FollowError(f"job {job} is not a vime job, or its folder is gone (Slurm's working "
                      f"directory: {found.workdir}); give its job folder instead")


def _under_here(job: str, depth: int = 4) -> list[Path]:
    """Folders named job at most depth levels below this one (the repository root holds
    build/runs/<experiment>/<job id>)."""
    here = Path.cwd()
    return [found for level in range(depth)
            for found in sorted(here.glob("/".join(["*"] * level + [job])))]


def live_state(folder: JobFolder) -> tuple[str, bool, str]:
    """(state, finished, detail) from Slurm for Slurm jobs, from the folder for local ones."""
    info = folder.info
    outcome = folder.read_json("outcome.json")
    if info["launcher"] == "slurm":
        state = slurm.state(info["job_id"])
        detail = ", ".join(x for x in (
            f"from {state.source}", state.nodes and f"nodes {state.nodes}",
            state.elapsed and f"elapsed {state.elapsed}",
            state.reason and state.reason != "None" and f"reason {state.reason}",
            state.exit_code and f"exit {state.exit_code}") if x)
        return state.state, state.finished, detail
    local = folder.read_json("local.json") or {}
    running = any(local_launcher.pid_alive(pid) for pid in local.get("pids", []))
    if running:
        return "RUNNING", False, f"{info['launcher']}, pids {local['pids']}"
    if outcome:
        return {"succeeded": "COMPLETED", "failed": "FAILED"}.get(
            outcome["state"], outcome["state"].upper()), True, info["launcher"]
    return "ENDED", True, f"{info['launcher']}, no outcome recorded"


def _name(folder: JobFolder) -> str:
    """How to name the job in a command that works from any folder: its id when find() leads
    back to this folder, else the folder itself."""
    job_id = folder.info["job_id"]
    try:
        if find(job_id).path.resolve() == folder.path.resolve():
            return job_id
    except (FollowError, slurm.SlurmError, OSError):
        pass
    return shlex.quote(str(folder.path))


def layout(folder: JobFolder) -> str:
    """The job's nodes × GPUs, logical ones said so (vime/launch/local.py, layout_words)."""
    import tomllib

    info = folder.info
    try:
        resolved = tomllib.loads((folder.path / "resolved.toml").read_text())
    except (OSError, ValueError):
        resolved = {}
    torch_pair = (resolved.get("train", {}).get("backend")
                  == resolved.get("inference", {}).get("backend") == "torch")
    address = (folder.path / "ray_address").read_text().strip() \
        if (folder.path / "ray_address").is_file() else ""
    here = info["launcher"] == "local" or (info["launcher"] == "ray-address" and bool(address)
                                           and local_launcher.on_this_machine(address))
    return local_launcher.layout_words(info["nodes"], info["gpus_per_node"], torch_pair, here)


def status_text(folder: JobFolder) -> str:
    info = folder.info
    state, _, detail = live_state(folder)
    lines = [f"job {info['job_id']}  {state}  ({detail})",
             f"  experiment {info['experiment']}: {layout(folder)}, spec {info['spec']} "
             f"(sha256 {info['spec_sha256'][:16]})",
             f"  folder     {folder.path}"]
    head = folder.read_json("ray/head.json")
    if head:
        lines.append(f"  ray        {head['address']} (dashboard {head['dashboard']}, "
                     f"attempt {head['attempt']})")
    ready = sorted(folder.path.glob("ray/ready-*.json"))
    if ready:
        timing = folder.read_json(f"ray/{ready[-1].name}")
        gpus = plural(info["nodes"] * info["gpus_per_node"], "GPU")
        lines.append(f"  ready      all {gpus} after "
                     f"{timing['seconds_to_gpus_ready']:.1f} s (attempt {timing['attempt']})")
    outcome = folder.read_json("outcome.json")
    if outcome:
        line = f"  outcome    {outcome['state']} (attempt {outcome['attempt']})"
        if outcome.get("error"):
            line += f": {outcome['error']}"
        lines.append(line)
    lines.append(f"  logs       {folder.path / 'logs'}/node-<i>.log (vime logs {_name(folder)} "
                 "[-f] [--node N])")
    return "\n".join(lines) + "\n"


def logs(folder: JobFolder, node: int, follow: bool, out=sys.stdout) -> int:
    nodes = folder.info.get("nodes")
    if isinstance(nodes, int) and not 0 <= node < nodes:
        only = "only node 0" if nodes == 1 else f"nodes 0 to {nodes - 1}"
        raise FollowError(f"job {folder.info['job_id']} has {only}; there is no node {node}")
    path = folder.log(node)
    offset = 0
    quiet_since = None
    while True:
        if path.is_file():
            with open(path, "rb") as log:
                log.seek(offset)
                chunk = log.read()
            if chunk:
                offset += len(chunk)
                out.write(chunk.decode(errors="replace"))
                out.flush()
                quiet_since = None
        if not follow:
            if not path.is_file():
                state, _, _ = live_state(folder)
                print(f"vime: no log yet for node {node} ({path}); job {state}", file=sys.stderr)
                return 1
            return 0
        _, finished, _ = live_state(folder)
        if finished:  # one more read after the end, then stop
            quiet_since = quiet_since or time.time()
            if time.time() - quiet_since > 1.0:
                return 0
        time.sleep(0.5)


WATCH_POLL_S = 1.0
# squeue at most this often while a Slurm job is followed (slurmctld answers every user of the
# cluster; the log and metrics are read every WATCH_POLL_S), and at once when the head writes
# outcome.json
SLURM_POLL_S = 5.0
OUTCOME_WAIT_S = 5.0  # the head writes outcome.json as it ends; a shared file system may lag
WHERE = {"slurm": "on Slurm", "local": "here, one process per node",
         "ray-address": "on a Ray cluster"}


def _ending(folder: JobFolder, state: str) -> tuple[str, str | None, str | None]:
    """(outcome state, how it stopped, error) of a job that has ended, from outcome.json
    and, for Slurm jobs, Slurm's state (a cancelled job's head may not get to write one)."""
    from vime.launch.progress import STOPPED

    outcome = folder.read_json("outcome.json") or {}
    word = state.split()[0] if state else ""
    if outcome.get("state") == "succeeded" or (word == "COMPLETED" and not outcome):
        return "succeeded", None, None
    if folder.info["launcher"] == "slurm":
        if word == "CANCELLED":
            return "cancelled", "cancelled (scancel or vime cancel)", None
        if word in ("TIMEOUT", "DEADLINE", "PREEMPTED"):
            return "stopped", f"stopped by Slurm ({word})", None
    if outcome.get("state") in STOPPED:
        return outcome["state"], None, None
    return "failed", None, outcome.get("error") or (f"Slurm says {state}" if state else None)


def watch(folder: JobFolder, quiet: bool = False, out=sys.stdout) -> int:
    """`vime logs -f` of node 0: what `vime submit --local` shows (vime/launch/progress.py),
    read from the job folder's log and metrics as they grow, until the job ends; then its
    outcome. Exit 0 when it succeeded, 4 when not, 130 on Ctrl-C, which leaves the job be."""
    import tomllib

    from vime.launch import progress, resume

    info = folder.info
    job_id = info["job_id"]
    total = tomllib.loads((folder.path / "resolved.toml").read_text())["rollout"]["num_rollout"]
    shown = progress.Progress(folder.path, total, out=out, quiet=quiet)
    state, finished, detail = live_state(folder)
    shown.say(f"vime: job {job_id}: {info['experiment']}, {layout(folder)}, "
              f"{WHERE.get(info['launcher'], '')} "
              f"({state}; {detail})\n"
              f"  folder  {folder.path}\n"
              f"  logs    {folder.log(0)} (head and driver)")
    asked = time.monotonic()
    try:
        while not finished:
            shown.poll()
            time.sleep(WATCH_POLL_S)
            if (info["launcher"] != "slurm" or time.monotonic() - asked >= SLURM_POLL_S
                    or (folder.path / "outcome.json").exists()):
                state, finished, _ = live_state(folder)
                asked = time.monotonic()
        deadline = time.time() + OUTCOME_WAIT_S
        while not (folder.path / "outcome.json").exists() and time.time() < deadline:
            time.sleep(0.2)
        shown.poll()
    except KeyboardInterrupt:
        print(f"vime: stopped following job {job_id}; the job goes on "
              f"(vime cancel {_name(folder)} stops it)", file=sys.stderr)
        return 130
    ended, how, error = _ending(folder, state)
    after = None
    if ended != "succeeded" and (how or ended in progress.STOPPED):
        after = resume.job_start_point(folder.path)
    # the summary's time is the job's own records' (progress.job_times), wherever it was joined
    print(shown.ending(job_id, ended, error, folder.log(0), after, how,
                       resume_with=info.get("resume")),
          file=out, flush=True)
    return 0 if ended == "succeeded" else 4


def cancel(folder: JobFolder) -> str:
    """Slurm: scancel. Here: the local launcher's stop (vime/launch/local.py), from this
    process: SIGINT to the node processes, SIGKILL to whatever of the job is left after the
    grace period, the temp folders removed, outcome `cancelled`; the job's launcher, if it
    still runs, reads cancel.json and says so."""
    info = folder.info
    if info["launcher"] == "slurm":
        slurm.cancel(info["job_id"])
        # scancel returns before the nodes stop: a save they finish as they stop moves it on
        return (f"cancelled job {info['job_id']} (scancel; each node stops its own Ray, "
                f"which scancel does not wait for); now: {_next_submit(folder)}")

    pids = (folder.read_json("local.json") or {}).get("pids", [])
    alive = [pid for pid in pids if local_launcher.pid_alive(pid) and local_launcher.alive(pid)]
    if not alive:
        return f"job {info['job_id']} is not running"
    (folder.path / "cancel.json").write_text(f'{{"by": "vime cancel", "at": {time.time()}}}\n')
    started = time.time()
    local_launcher.stop_job(info["job_id"], alive)
    local_launcher.write_outcome(folder.path, "cancelled")
    return (f"cancelled job {info['job_id']}: {len(alive)} node process(es) and their Ray "
            f"stopped in {time.time() - started:.1f} s; {_next_submit(folder)}")


def _next_submit(folder: JobFolder) -> str:
    """Where the next submit of the job's spec starts, as the job's last line says it."""
    import tomllib

    from vime.launch import progress, resume

    total = tomllib.loads((folder.path / "resolved.toml").read_text())["rollout"]["num_rollout"]
    return progress.next_submit(resume.job_start_point(folder.path), total,
                                folder.info.get("resume"))
