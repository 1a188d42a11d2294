"""Ray on one node of a job: start it, find it, stop it, and nothing else's.

The job's nodes (runtime/node/job.py) start and stop their Ray with it, the driver takes its
signal handlers from it (runtime/node/driver.py), and the local launcher finds a job's Ray
processes and temp folders with it (vime/launch/local.py). The findings it follows:
docs/design.md, "Ray on one node".
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from vime.launch.ports import NodePorts, PortPlan

MARKER = "VIME_RAY_NODE"
NODE_RESOURCE = "vime_node_{}"  # a custom resource that names the job's node index


@contextlib.contextmanager
def own_signal_handlers():
    """Around ray.init and ray.shutdown: this process's SIGTERM and SIGINT handlers, set again
    after them.

    ray.init installs Ray's C++ failure handler for SIGTERM (absl's: it prints `*** SIGTERM
    received at time=...` and ends the process) and ray.shutdown leaves SIGTERM to its
    default action, while Python's signal.getsignal still names the handler set before. So
    the node's teardown (runtime/node/job.py: stop its Ray, remove its temp folder, record the
    outcome) never ran on the head after a scancel or a job's time limit, and
    /tmp/vime-<job>-<attempt>-<node> was left behind. Set again, Python's handler takes the
    signal, and ray.get returns to Python to run it (seen here with Ray 2.55: a handler set
    before ray.init, or before ray.shutdown, never ran; one set after them did)."""
    import threading

    saved = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for number, handler in saved.items():
                if callable(handler):
                    signal.signal(number, handler)


def default_auth_mode(environ) -> None:
    """Token authentication off for the job's Ray, unless the user chose a mode.

    Ray 2.60 turns it on for `ray start --head` when RAY_AUTH_MODE is unset and
    ~/.ray/auth_token exists (a plain ray.init() writes one), but not for `ray start
    --address=...` nor for ray.init(address=...): the job's workers and driver are then
    refused with "InvalidAuthToken". Without a token file Ray starts with auth off, as
    before 2.60. RAY_AUTH_MODE=token in the environment or in [cluster.env] keeps it on (every
    node then needs the token: ~/.ray/auth_token on a shared home, or RAY_AUTH_TOKEN)."""
    environ.setdefault("RAY_AUTH_MODE", "disabled")


def attach_auth_mode(environ, home: Path | None = None) -> None:
    """Token authentication on for a driver joining a cluster someone else started
    (--ray-address), when a token is at hand and the user chose no mode.

    A cluster started by hand with `ray start --head` has token auth on when
    ~/.ray/auth_token exists (Ray 2.60, default_auth_mode), and ray.init(address=...) does
    not read that file unless RAY_AUTH_MODE=token: the driver was refused ("InvalidAuthToken")
    and vime reported "Failed to connect to Ray cluster". A client in token mode also joins a
    cluster without auth (checked with Ray 2.60), so the token is sent whenever there is one."""
    if "RAY_AUTH_MODE" in environ:
        return
    token_file = Path(environ.get("RAY_AUTH_TOKEN_PATH")
                      or (home or Path.home()) / ".ray" / "auth_token")
    if environ.get("RAY_AUTH_TOKEN") or token_file.is_file():
        environ["RAY_AUTH_MODE"] = "token"


class RayStartupError(RuntimeError):
    """The cluster did not come up: the message names the nodes and where their logs are."""


def temp_dir(job_id: str, attempt: int, node: int) -> Path:
    # /tmp/vime-<job>-<attempt>-<node>/session_<date>_<pid>/sockets/plasma_store stays < 107 B
    return Path(f"/tmp/vime-{job_id}-{attempt}-{node}")


def _ipv4(ifname: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:  # SIOCGIFADDR: the interface's IPv4 address, without any extra dependency
            packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def node_address() -> str:
    """The node's address for Ray: VIME_RAY_IFNAME's if set (e.g. in [cluster.env]), else the
    first non-loopback IPv4 address; 127.0.0.1 only on a machine that has none."""
    wanted = os.environ.get("VIME_RAY_IFNAME")
    names = [wanted] if wanted else [name for _, name in socket.if_nameindex()]
    for name in names:
        address = _ipv4(name)
        if address and not ipaddress.ip_address(address).is_loopback:
            return address
    if wanted:
        raise RayStartupError(f"VIME_RAY_IFNAME={wanted!r} has no IPv4 address on {socket.gethostname()}")
    return "127.0.0.1"


# ---------------------------------------------------------------------------------- processes

def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> set[int]:
    children, found, todo = _children_map(), set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _holds_files_under(pid: str, prefix: str) -> bool:
    """Whether a process has a file open (its log, a socket file) under the folder prefix."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                return True
        except OSError:
            continue
    return False


def marked(value: str, prefix: bool = False) -> set[int]:
    """Processes of this node's Ray, wherever they went: those whose environment has
    VIME_RAY_NODE=value, and those with a file open in the temp folder `value` (Ray's
    dashboard and runtime-env agents are started without the raylet's environment and
    renamed by setproctitle, so only their open logs say whose they are). prefix: every
    value that starts with it (all nodes and attempts of a job)."""
    needle = f"{MARKER}={value}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            env = []
        if any(v.startswith(needle) if prefix else v == needle for v in env) or \
                _holds_files_under(entry, value if prefix else value.rstrip("/") + "/"):
            found.add(int(entry))
    return found


def abandoned_temp_dirs(min_age_s: float = 120.0) -> list[Path]:
    """The /tmp/vime-<job>-<attempt>-<node> folders no live process refers to (by
    VIME_RAY_NODE or an open file), untouched for min_age_s: left by a node killed with
    SIGKILL, which had no chance to remove its own. A folder of a node that is starting is
    younger than min_age_s, and its `ray start` refers to it as soon as it runs."""
    root = temp_dir("x", 0, 0).parent
    folders = {str(p): p for p in root.glob("vime-*-*-*") if p.is_dir()}
    if not folders:
        return []
    used: set[str] = set()
    marker = f"{MARKER}=".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            for value in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                if value.startswith(marker):
                    used.add(value[len(marker):].decode(errors="replace"))
        except OSError:
            pass
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{entry}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{entry}/fd/{fd}")
                    if target.startswith(str(root / "vime-")):
                        used.add(str(root / Path(target).relative_to(root).parts[0]))
    now = time.time()
    left = []
    for name, path in folders.items():
        try:
            young = now - path.stat().st_mtime < min_age_s
        except OSError:
            continue
        if name not in used and not young:
            left.append(path)
    return sorted(left)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _signal(pids, sig) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


# ------------------------------------------------------------------------------------ a node

@dataclass
class RayNode:
    """`ray start --block` for one node of one job, and its teardown."""

    temp_dir: Path
    log_path: Path
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    _stopped: bool = field(default=False, repr=False)

    @staticmethod
    def command(*, head: bool, address: str, node_ip: str, plan: PortPlan, ports: NodePorts,
                node: int, gpus: int, cpus: int | None, temp: Path, dashboard_host: str) -> list[str]:
        ray = Path(sys.executable).with_name("ray")
        argv = [str(ray)] if ray.exists() else [sys.executable, "-m", "ray.scripts.scripts"]
        argv += ["start", "--block", "--disable-usage-stats", f"--node-ip-address={node_ip}",
                 f"--num-gpus={gpus}", f"--temp-dir={temp}",
                 "--resources=" + json.dumps({NODE_RESOURCE.format(node): 1}),
                 *ports.ray_start_args()]
        if cpus:
            argv.append(f"--num-cpus={cpus}")
        if head:
            argv += ["--head", f"--port={plan.gcs_port}",
                     f"--ray-client-server-port={plan.client_server_port}",
                     "--include-dashboard=true", f"--dashboard-host={dashboard_host}",
                     f"--dashboard-port={plan.dashboard_port}"]
        else:
            argv.append(f"--address={address}")
        return argv

    def start(self, argv: list[str]) -> None:
        if self.temp_dir.exists():  # a previous attempt of this very job on this node
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.temp_dir.mkdir(parents=True)
        env = dict(os.environ, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
                   RAY_USAGE_STATS_ENABLED="0", **{MARKER: str(self.temp_dir)})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        self.started_at = time.time()

    def restart(self, argv: list[str], keep_logs: Path | None = None) -> None:
        self.stop(keep_logs=keep_logs)
        self._stopped = False
        self.start(argv)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, grace_s: float = 8.0, keep_logs: Path | None = None) -> None:
        """SIGTERM `ray start`, then SIGKILL whatever of this node's Ray is left."""
        if self._stopped or self.process is None:
            return
        self._stopped = True
        ours = descendants(self.process.pid) | marked(str(self.temp_dir))
        _signal([self.process.pid], signal.SIGTERM)
        deadline = time.time() + grace_s
        while time.time() < deadline:
            self.process.poll()
            if not any(_alive(pid) for pid in ours | {self.process.pid}):
                break
            time.sleep(0.2)
        for _ in range(3):  # stragglers; a worker may fork while we look
            left = {pid for pid in ours | marked(str(self.temp_dir)) if _alive(pid)}
            if self.process.poll() is None:
                left.add(self.process.pid)
            if not left:
                break
            _signal(left, signal.SIGKILL)
            time.sleep(0.3)
            ours = left
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        if keep_logs is not None:
            logs = self.temp_dir / "session_latest" / "logs"
            if logs.is_dir():
                shutil.copytree(logs, keep_logs, dirs_exist_ok=True, symlinks=False,
                                ignore_dangling_symlinks=True)
        for _ in range(5):  # a process that was still exiting may have written into it
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            if not self.temp_dir.exists():
                break
            time.sleep(0.5)


# ------------------------------------------------------------------------------- the cluster

def gpus_by_node(nodes: int) -> dict[int, float]:
    """GPUs of the alive Ray nodes, by the job's node index (needs ray.init first)."""
    import ray

    found: dict[int, float] = {}
    for info in ray.nodes():
        if not info.get("Alive"):
            continue
        resources = info.get("Resources", {})
        for index in range(nodes):
            if resources.get(NODE_RESOURCE.format(index)):
                found[index] = found.get(index, 0.0) + resources.get("GPU", 0.0)
    return found


def check_cluster(address: str, nodes: int, gpus_per_node: int) -> str | None:
    """For --ray-address: None when the cluster at address has nodes × gpus_per_node GPUs on at
    least `nodes` nodes of gpus_per_node each, else what it lacks."""
    import ray

    with own_signal_handlers():
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    try:
        per_node = sorted((info.get("Resources", {}).get("GPU", 0.0)
                           for info in ray.nodes() if info.get("Alive")), reverse=True)
    finally:
        with own_signal_handlers():
            ray.shutdown()
    enough = [g for g in per_node if g >= gpus_per_node]
    if len(enough) >= nodes:
        return None
    have = ", ".join(f"{g:g}" for g in per_node) or "none"
    return (f"the Ray cluster at {address} has {len(per_node)} node(s) with {have} GPU(s); "
            f"the plan needs {nodes} node(s) with {gpus_per_node} GPUs each")
