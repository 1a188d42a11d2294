"""The local twins of a Slurm job: `--local` runs one process per node on this machine (Ray
with logical GPUs where there are none), `--ray-address` runs the driver against a Ray
cluster someone started by hand; `vime submit` (vime/launch/submit.py) calls them. Both block
until the job ends; the nodes write the job folder's logs, as on Slurm, and the launcher shows
the run's progress on the terminal (vime/launch/progress.py). How the job's processes never
outlive the launcher: docs/design.md, "Local jobs and how they stop".
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from vime.words import plural

HEAD_GONE_GRACE_S = 30.0
# A node given SIGTERM stops its actors and its Ray (runtime/node/job.py); past this the rest
# is killed, so that the whole job is gone within 10 s of Ctrl-C or `vime cancel`.
STOP_GRACE_S = 6.0
POLL_S = 0.3
_PR_SET_PDEATHSIG = 1
# what asks a node process to stop (runtime/node/job.py: SIGTERM would meet Ray's C++ handler
# in the driver's process, which skips the teardown)
STOP_SIGNAL = signal.SIGINT
# what stopped the job -> outcome state, exit code
STOPPED_BY = {signal.SIGINT: ("interrupted", 130), signal.SIGHUP: ("interrupted", 129),
              signal.SIGTERM: ("terminated", 143)}


def _die_with_parent(parent: int):
    """preexec_fn of a node process: SIGTERM when the launcher dies, even by SIGKILL."""
    def arm():
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, STOP_SIGNAL)
        if os.getppid() != parent:  # the launcher died before the line above
            os.kill(os.getpid(), STOP_SIGNAL)
    return arm


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=_die_with_parent(os.getpid()))


def _record(job_dir: Path, processes: list[subprocess.Popen]) -> None:
    (job_dir / "local.json").write_text(json.dumps(
        {"launcher_pid": os.getpid(), "pids": [p.pid for p in processes]}) + "\n")


def _visible_devices(node: int, gpus_per_node: int) -> str | None:
    """On a machine with real GPUs (CUDA_VISIBLE_DEVICES set), node i gets its own slice."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    devices = [d for d in visible.split(",") if d.strip()]
    return ",".join(devices[node * gpus_per_node:(node + 1) * gpus_per_node])


# --------------------------------------------------------------------- the job's processes

def process_start(pid: int) -> int | None:
    """The start time of process `pid` on this host (/proc/<pid>/stat, clock ticks since
    boot): with the pid, it names one process, where a pid alone is reused. None when there
    is no such process, or it is a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19]) if len(fields) > 19 and fields[0] != "Z" else None


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid exists on this host, of any user, a zombie included
    (signal 0 checks without sending)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (a zombie does not)."""
    return process_start(pid) is not None


def job_processes(job_id: str) -> set[int]:
    """Every live process of this job's Ray, on any of its nodes and attempts: they carry
    VIME_RAY_NODE=/tmp/vime-<job id>-<attempt>-<node>, or hold a file open in that folder
    (runtime/node/ray_bootstrap.py, marked)."""
    from runtime.node.ray_bootstrap import marked, temp_dir

    prefix = str(temp_dir(job_id, 0, 0).parent / f"vime-{job_id}-")
    return {pid for pid in marked(prefix, prefix=True) if alive(pid)}


def temp_dirs(job_id: str) -> list[Path]:
    from runtime.node.ray_bootstrap import temp_dir

    return sorted(temp_dir(job_id, 0, 0).parent.glob(f"vime-{job_id}-*-*"))


def _kill(pids, sig) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)  # a node process leads its own session and group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_job(job_id: str, pids: list[int], grace_s: float = STOP_GRACE_S,
             processes: list[subprocess.Popen] = ()) -> None:
    """STOP_SIGNAL to the node processes, then, after grace_s, SIGKILL to whatever of the job is
    left; then its temp folders are removed. Returns once every process of the job is gone."""
    def reap():
        for process in processes:
            process.poll()

    _kill([pid for pid in pids if alive(pid)], STOP_SIGNAL)
    deadline = time.time() + grace_s
    while time.time() < deadline:
        reap()
        if not any(alive(pid) for pid in pids):
            break
        time.sleep(0.1)
    for _ in range(20):  # a Ray worker may fork while we look
        reap()
        left = {pid for pid in pids if alive(pid)} | job_processes(job_id)
        if not left:
            break
        _kill(left, signal.SIGKILL)
        time.sleep(0.1)
    reap()
    for folder in temp_dirs(job_id):
        shutil.rmtree(folder, ignore_errors=True)


def write_outcome(job_dir: Path, state: str, **extra) -> None:
    path = job_dir / "outcome.json"
    try:
        previous = json.loads(path.read_text())
    except (OSError, ValueError):
        previous = {}
    outcome = {"attempt": previous.get("attempt", 0), "error": previous.get("error"),
               **extra, "state": state, "finished": time.time()}
    tmp = path.with_name(f".outcome.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(outcome, indent=1) + "\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------- waiting

class _Stop(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def _raise_stop(signum, frame):
    raise _Stop(signum)


def _wait(job_dir: Path, processes: list[subprocess.Popen], on_poll) -> tuple[list[int], int | None]:
    """Wait for every node, showing progress; if the head is gone, the workers get a grace
    period, then SIGTERM. Returns the exit codes and the signal that stopped the job, if any."""
    job_id = job_dir.name
    head_gone = None
    previous = {sig: signal.signal(sig, _raise_stop) for sig in STOPPED_BY}
    stopped_by = None
    try:
        try:
            while any(p.poll() is None for p in processes):
                if processes[0].poll() is not None:
                    head_gone = head_gone or time.time()
                    if time.time() - head_gone > HEAD_GONE_GRACE_S:
                        for p in processes[1:]:
                            if p.poll() is None:
                                p.send_signal(signal.SIGTERM)
                on_poll()
                time.sleep(POLL_S)
        except (_Stop, KeyboardInterrupt) as stop:
            stopped_by = getattr(stop, "signum", signal.SIGINT)
            for sig in STOPPED_BY:  # a second Ctrl-C must not cut the teardown short
                signal.signal(sig, signal.SIG_IGN)
            stop_job(job_id, [p.pid for p in processes], processes=processes)
        if stopped_by is None and (job_dir / "cancel.json").exists():
            stop_job(job_id, [p.pid for p in processes], processes=processes)
        on_poll()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    codes = [p.wait() for p in processes]
    if stopped_by is None:
        # A node that ended cleanly left its Ray stopped and its folder gone; one killed
        # outright (SIGKILL, the OOM killer) left Ray's processes running in their own sessions
        if job_processes(job_id):
            stop_job(job_id, [], grace_s=0)
        for folder in temp_dirs(job_id):
            shutil.rmtree(folder, ignore_errors=True)
    return codes, stopped_by


def _finish(job_dir: Path, codes: list[int], stopped_by: int | None) -> int:
    if stopped_by is not None:
        state, code = STOPPED_BY[stopped_by]
        write_outcome(job_dir, state, signal=signal.Signals(stopped_by).name)
        return code
    if (job_dir / "cancel.json").exists():
        write_outcome(job_dir, "cancelled")
        return 4
    return codes[0] or next((c for c in codes if c), 0)


def run_local(job_dir: Path, nodes: int, gpus_per_node: int, env: dict[str, str],
              on_poll=lambda: None) -> int:
    from runtime.node.ray_bootstrap import abandoned_temp_dirs

    for folder in abandoned_temp_dirs():  # of jobs killed outright before this one
        shutil.rmtree(folder, ignore_errors=True)
    processes = []
    for node in range(nodes):
        node_env = dict(os.environ, **env)
        devices = _visible_devices(node, gpus_per_node)
        if devices is not None:
            node_env["CUDA_VISIBLE_DEVICES"] = devices
        argv = [sys.executable, "-m", "runtime.node.job", "node", "--job-dir", str(job_dir),
                "--node", str(node)]
        processes.append(_spawn(argv, job_dir / "logs" / f"node-{node}.log", node_env))
    _record(job_dir, processes)
    return _finish(job_dir, *_wait(job_dir, processes, on_poll))


def run_attached(job_dir: Path, address: str, env: dict[str, str], on_poll=lambda: None) -> int:
    argv = [sys.executable, "-m", "runtime.node.job", "attach", "--job-dir", str(job_dir),
            "--address", address]
    process = _spawn(argv, job_dir / "logs" / "node-0.log", dict(os.environ, **env))
    _record(job_dir, [process])
    return _finish(job_dir, *_wait(job_dir, [process], on_poll))


# ------------------------------------------------------------------------ what it runs on

# one folder per GPU the NVIDIA driver has found: read without importing torch
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def layout_words(nodes: int, gpus_per_node: int, torch_pair: bool, here: bool,
                 nvidia_gpus: Path = NVIDIA_GPUS) -> str:
    """"2 nodes × 4 GPUs". A job of the torch pair (train.backend = inference.backend =
    "torch") run on this machine (`here`: --local, or a Ray cluster at one of its addresses)
    where the NVIDIA driver shows no GPU gets Ray's logical GPUs, and torch computes on the
    CPU (runtime/backends/torch_model.py): said so."""
    nodes_words = plural(nodes, "node")
    if torch_pair and here and not _has_entries(nvidia_gpus):
        return (f"{nodes_words} × {plural(gpus_per_node, 'logical GPU')} "
                "(none here: torch runs on the CPU)")
    return f"{nodes_words} × {plural(gpus_per_node, 'GPU')}"


def _has_entries(folder: Path) -> bool:
    try:
        return any(folder.iterdir())
    except OSError:
        return False


def on_this_machine(address: str) -> bool:
    """Whether a --ray-address names this machine: "auto" (the cluster `ray start` left an
    address of on this machine), or a host this machine can bind to (a local address)."""
    import socket

    if address == "auto":
        return True
    host = address.removeprefix("ray://").rpartition(":")[0].strip("[]")
    try:
        for family, kind, proto, _, where in socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM):
            with socket.socket(family, kind, proto) as probe:
                probe.bind((where[0], 0))
            return True
    except OSError:
        return False
    return False


# ---------------------------------------------------------------------------- preflight

def unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """None when something listens at --ray-address's host:port, else why not. ray.init()
    retries an address nobody answers for minutes (more than 600 s)."""
    import socket

    if address == "auto" or address.startswith("ray://"):
        return None  # Ray finds the cluster itself, or the client server answers
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return f"--ray-address {address!r} is not host:port (the GCS address `ray start --head` prints)"
    deadline = time.time() + timeout_s
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
                return None
        except OSError as err:
            reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
            if isinstance(err, socket.gaierror) or time.time() > deadline:
                return (f"no Ray cluster answers at {address} ({reason}); start one with "
                        "`ray start --head`, or give the address it printed")
            time.sleep(0.5)
