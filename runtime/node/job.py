"""What every node of a vime job runs: bring up Ray, run the driver on the head, tear down.

One task per node (Slurm: one srun task per node, started by submitit's job runner from
job.sbatch; `vime submit --local`: one process per node on this machine). Node 0 checks the
inputs (runtime/node/preflight.py), starts the Ray head and publishes its address in the job
folder; the other nodes join; the head runs the driver, `run(plan, resolved_toml, job_dir,
resume)` (runtime/node/driver.py, or launch.json's "driver"), then every node stops its own Ray.

The steps, the driver contract, the watch on the head's Ray, signals and requeue:
docs/design.md, "A job's nodes".
Test hook: VIME_TEST_NO_JOIN="1,2" makes those nodes never start Ray (a node that cannot join).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import signal
import socket
import sys
import threading
import time
import tomllib
import traceback
from dataclasses import dataclass
from pathlib import Path

from runtime.node.errors import one_line
from runtime.node.preflight import PreflightError, check_job, installed_lines
from runtime.node.ray_bootstrap import (
    RayNode,
    RayStartupError,
    attach_auth_mode,
    check_cluster,
    default_auth_mode,
    gpus_by_node,
    node_address,
    own_signal_handlers,
    temp_dir,
)
from vime.launch import lock
from vime.launch import ports as port_plan
from vime.launch.jobdir import DEFAULT_DRIVER
from vime.launch.resume import job_save_dir

POLL_S = 0.5
WORKER_STOP_WAIT_S = 15.0
# After scancel, Slurm sends SIGKILL KillWait seconds after SIGTERM (5 s on the CI cluster, 30 by
# default): the node's Ray gets this long to exit before it is killed, so that its temp folder
# is removed within that time (with 8 s, /tmp/vime-<job>-<attempt>-<node> was left behind).
TERMINATED_GRACE_S = 1.0
# `ray start` on a worker gives its raylet 30 s to register with the GCS (ray/_private/node.py,
# raylet_start_wait_time_s) and exits 1 after that; on a loaded node that happens. NeMo-RL's
# ray.sub retries 3 times too.
JOIN_TRIES = 3
RAY_WATCH_S = 0.5
RAY_LOST_GRACE_S = 5.0


@dataclass(frozen=True)
class NodeContext:
    job_id: str
    job_dir: Path
    node: int
    nodes: int
    hostnames: tuple[str, ...]  # Slurm node names, for messages
    attempt: int  # 0, then 1, 2 ... after requeues (SLURM_RESTART_COUNT)
    resume: bool

    def host(self, index: int) -> str:
        return self.hostnames[index] if index < len(self.hostnames) else f"node {index}"


def _write_json(path: Path, obj) -> None:
    """Atomically: other nodes poll these files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load_driver(spec: str):
    """`module:function` or `/path/to/file.py:function`."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ValueError(f"driver {spec!r} is not module:function or file.py:function")
    if target.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location(Path(target).stem, target)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, name)


class _Terminated(SystemExit):
    pass


_signalled = False


def _on_sigterm(signum, frame):
    global _signalled
    # once: the teardown must not be interrupted
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _signalled = True
    raise _Terminated(128 + signum)


def _disconnect_driver() -> None:
    """This process's driver (ray.init in the driver: runtime/node/driver.py) leaves Ray before
    the node's Ray stops. Stopped under a connected driver, Ray's client retried the GCS for
    60 s and then ended the process with a non-zero code ("Failed to connect to GCS within 60
    seconds"), after a job that had succeeded: seen once in a CI run (2026-12-02)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        with own_signal_handlers():
            ray.shutdown()


def _stop(node: RayNode, ctx: NodeContext) -> None:
    """This node's Ray stopped, its logs kept in the job folder; quickly when signalled."""
    node.stop(grace_s=TERMINATED_GRACE_S if _signalled else 8.0,
              keep_logs=ctx.job_dir / "logs" / "ray" / f"node-{ctx.node}")


def _stop_on_signals() -> None:
    """SIGTERM (scancel) and SIGINT stop this node's Ray and exit. The local launcher and `vime
    cancel` send SIGINT (vime/launch/local.py): once the driver has called ray.init(), Ray's
    C++ failure handler takes SIGTERM, prints `*** SIGTERM received` and ends the process
    without this teardown, leaving its Ray to the launcher's sweep."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, _on_sigterm)


# -------------------------------------------------------------------------------- the node

def run_node(ctx: NodeContext) -> None:
    started = time.time()
    launch = json.loads((ctx.job_dir / "launch.json").read_text())
    os.environ.update(launch["env"])  # [cluster.env]; job.sbatch exported them already
    default_auth_mode(os.environ)  # for `ray start`, its workers and the driver alike
    _stop_on_signals()
    ray_cfg = launch["ray"]
    plan = port_plan.plan(ctx.job_id, ray_cfg["port"], ray_cfg["dashboard_port"],
                          launch["fixed_head_ports"])
    node = RayNode(temp_dir(ctx.job_id, ctx.attempt, ctx.node),
                   ctx.job_dir / "logs" / f"ray-node-{ctx.node}.log")
    gpus = _gpus_on_this_node(launch["gpus_per_node"], ctx)
    common = dict(node_ip=node_address(), plan=plan, ports=plan.node(ctx.node), node=ctx.node,
                  gpus=gpus, cpus=_cpus_on_this_node(), temp=node.temp_dir,
                  dashboard_host=ray_cfg["dashboard_host"])
    if ctx.node == 0:
        _run_head(ctx, launch, node, common, started)
    else:
        _run_worker(ctx, launch, node, common)


def _gpus_on_this_node(gpus_per_node: int, ctx: NodeContext) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and len([d for d in visible.split(",") if d.strip()]) < gpus_per_node:
        raise RayStartupError(
            f"{ctx.host(ctx.node)}: CUDA_VISIBLE_DEVICES={visible!r} shows fewer GPUs than "
            f"cluster.gpus_per_node = {gpus_per_node} (Ray refuses --num-gpus above it)")
    return gpus_per_node


def _cpus_on_this_node() -> int | None:
    for name in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def _run_head(ctx: NodeContext, launch: dict, node: RayNode, common: dict, started: float):
    ray_dir = ctx.job_dir / "ray"
    outcome = {"attempt": ctx.attempt, "state": "failed", "error": None}
    timings = {"attempt": ctx.attempt, "nodes": ctx.nodes, "job_start": started}
    address = f"{common['node_ip']}:{common['plan'].gcs_port}"
    try:
        _hold_experiment(ctx)
        _preflight(launch, ctx.job_dir)
        node.start(RayNode.command(head=True, address=address, **common))
        timings["ray_start"] = node.started_at
        (ctx.job_dir / "ray_address").write_text(address + "\n")
        dashboard = f"{launch['ray']['dashboard_host']}:{common['plan'].dashboard_port}"
        _write_json(ray_dir / "head.json", {"address": address, "attempt": ctx.attempt,
                                            "dashboard": dashboard, "host": socket.gethostname()})
        expected = launch["gpus_per_node"] * ctx.nodes
        _wait_for_gpus(ctx, node, address, launch, deadline=node.started_at
                       + launch["ray"]["startup_timeout_s"])
        timings["gpus_ready"] = time.time()
        timings["seconds_to_gpus_ready"] = round(timings["gpus_ready"] - started, 3)
        _write_json(ray_dir / f"ready-{ctx.attempt}.json", timings)
        print(f"vime: Ray ready at {address}: {expected} GPUs on {ctx.nodes} node(s) after "
              f"{timings['seconds_to_gpus_ready']:.1f} s", flush=True)
        driver = load_driver(launch["driver"])
        os.environ["RAY_ADDRESS"] = address
        resolved = (ctx.job_dir / "resolved.toml").read_text()
        plan = json.loads((ctx.job_dir / "plan.json").read_text())
        watch = _RayWatch(ctx, node, address, outcome)
        watch.start()
        try:
            driver(plan, resolved, ctx.job_dir, ctx.resume)
        finally:
            watch.driver_done.set()
        outcome["state"] = "succeeded"
    except _Terminated:
        outcome["state"] = "terminated"
        raise
    except SystemExit:  # submitit's USR2 handler after `scontrol requeue`
        outcome["state"] = "requeued"
        raise
    except PreflightError as err:
        outcome["error"] = str(err)
        raise
    except BaseException as err:
        outcome["error"] = outcome.get("ray_lost") or one_line(
            err, ctx.job_dir, ctx.job_dir / "logs" / "node-0.log")
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if outcome.get("ray_lost") and not _signalled:
            outcome.update(state="failed", error=outcome["ray_lost"])
        outcome["finished"] = time.time()
        if outcome["state"] != "requeued":  # the next attempt is the same job and keeps it
            lock.release_run(_run_folders(ctx), ctx.job_id)
        _write_json(ray_dir / f"done-{ctx.attempt}", {"state": outcome["state"]})
        if not _signalled:  # signalled, the workers were too (scancel, vime cancel)
            _wait_for_workers(ctx)
            _disconnect_driver()
        _stop(node, ctx)
        _write_json(ctx.job_dir / "outcome.json", outcome)
        if outcome["error"]:
            print(f"vime: job failed: {outcome['error']}", file=sys.stderr, flush=True)


def _run_folders(ctx: NodeContext) -> tuple[lock.RunFolder, ...]:
    return lock.run_folders(ctx.job_dir.parent, job_save_dir(ctx.job_dir))


def _hold_experiment(ctx: NodeContext) -> None:
    """The locks of the folders this job writes, its experiment and its checkpoint folder
    (vime/launch/lock.py): already this job's when `vime submit` took them; taken here for a
    job.sbatch submitted by hand.

    Raises:
        PreflightError: another live job holds one of them, or one cannot be written.
    """
    info = _read_json(ctx.job_dir / "job.json") or {}
    launcher = info.get("launcher", "slurm")
    try:
        lock.acquire_run(_run_folders(ctx), lock.holder_now(
            ctx.job_id, launcher, None if launcher == "slurm" else os.getpid(),
            ctx.job_dir.parent))
    except lock.ExperimentLocked as err:
        raise PreflightError(str(err)) from None
    except OSError as err:
        raise PreflightError(f"cannot take the run's lock in {err.filename or ''}: "
                             f"{err.strerror or err}; make model.save and "
                             "experiment.output_dir writable folders") from None


class _RayWatch(threading.Thread):
    """The head's Ray under a running driver (see the module's docstring)."""

    def __init__(self, ctx: NodeContext, node: RayNode, address: str, outcome: dict):
        super().__init__(name="vime ray watch", daemon=True)
        self.ctx, self.node, self.address, self.outcome = ctx, node, address, outcome
        self.driver_done = threading.Event()

    def run(self) -> None:
        while not self.driver_done.wait(RAY_WATCH_S):
            code = self.node.exit_code()
            if code is None:
                continue
            # scancel signals `ray start` and this process together: that is no loss
            if self.driver_done.wait(RAY_WATCH_S * 2) or _signalled:
                return
            reason = (f"the job's Ray stopped under the driver: `ray start --head` exited with "
                      f"code {code}, so its GCS at {self.address} or its raylet died (killed, "
                      f"out of memory, or the node lost); see {self.node.log_path} and "
                      f"{self.ctx.job_dir / 'logs' / 'ray' / 'node-0'}. Resubmit to resume "
                      "from the last checkpoint")
            self.outcome["ray_lost"] = reason
            print(f"vime: {reason}", file=sys.stderr, flush=True)
            _write_json(self.ctx.job_dir / "outcome.json", dict(
                self.outcome, state="failed", error=reason, finished=time.time()))
            if self.driver_done.wait(RAY_LOST_GRACE_S):
                return  # the driver failed by itself: the head's own teardown follows
            _write_json(self.ctx.job_dir / "ray" / f"done-{self.ctx.attempt}",
                        {"state": "failed"})
            _stop(self.node, self.ctx)
            os._exit(1)


def _preflight(launch: dict, job_dir: Path) -> None:
    """The default driver's inputs, before Ray starts (runtime/node/preflight.py)."""
    for line in installed_lines(tomllib.loads((job_dir / "resolved.toml").read_text())):
        print(line, flush=True)
    if launch["driver"] == DEFAULT_DRIVER:
        check_job(job_dir)


def _wait_for_gcs(node: RayNode, address: str, deadline: float) -> None:
    host, port = address.rsplit(":", 1)
    while time.time() < deadline:
        if node.exit_code() is not None:
            raise RayStartupError(f"the Ray head exited with code {node.exit_code()} before its "
                                  f"GCS listened at {address}; see {node.log_path}")
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return
        except OSError:
            time.sleep(POLL_S)
    raise RayStartupError(f"the Ray head's GCS never listened at {address}; see {node.log_path}")


def _wait_for_gpus(ctx: NodeContext, node: RayNode, address: str, launch: dict,
                   deadline: float) -> None:
    import ray

    gpus_per_node, timeout = launch["gpus_per_node"], launch["ray"]["startup_timeout_s"]
    _wait_for_gcs(node, address, deadline)
    with own_signal_handlers():
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    try:
        while True:
            per_node = gpus_by_node(ctx.nodes)
            missing = [i for i in range(ctx.nodes) if per_node.get(i, 0) < gpus_per_node]
            if not missing:
                return
            if node.exit_code() is not None:
                raise RayStartupError(f"the Ray head exited with code {node.exit_code()}; "
                                      f"see {node.log_path}")
            failed = {i: state for i in missing
                      if (state := _read_json(ctx.job_dir / "ray" / f"node-{i}.json"))
                      and state.get("attempt") == ctx.attempt and state.get("state") == "failed"}
            if failed:
                raise RayStartupError("; ".join(
                    f"node {i} ({ctx.host(i)}) could not join the Ray cluster: {s['error']} "
                    f"(see {ctx.job_dir / 'logs' / f'ray-node-{i}.log'})"
                    for i, s in failed.items()))
            if time.time() > deadline:
                names = ", ".join(f"node {i} ({ctx.host(i)})" for i in missing)
                have = sum(per_node.values())
                raise RayStartupError(
                    f"Ray cluster not ready after cluster.ray.startup_timeout_s = {timeout} s: "
                    f"{have:g} of {gpus_per_node * ctx.nodes} GPUs joined; {names} never joined "
                    f"the head at {address} (logs: {ctx.job_dir / 'logs'}/node-<i>.log and "
                    "ray-node-<i>.log)")
            time.sleep(POLL_S)
    finally:
        with own_signal_handlers():
            ray.shutdown()


def _wait_for_workers(ctx: NodeContext) -> None:
    """Workers stop before the head: a raylet whose GCS is gone takes longer to exit."""
    deadline = time.time() + WORKER_STOP_WAIT_S
    for index in range(1, ctx.nodes):
        path = ctx.job_dir / "ray" / f"node-{index}.json"
        while time.time() < deadline:
            state = _read_json(path)
            if not state or state.get("attempt") != ctx.attempt or state.get("state") in (
                    "stopped", "failed", "absent"):
                break
            time.sleep(POLL_S)


def _run_worker(ctx: NodeContext, launch: dict, node: RayNode, common: dict) -> None:
    ray_dir = ctx.job_dir / "ray"
    state_path = ray_dir / f"node-{ctx.node}.json"
    done = ray_dir / f"done-{ctx.attempt}"
    state = {"attempt": ctx.attempt, "host": socket.gethostname(), "state": "waiting"}
    _write_json(state_path, state)
    deadline = time.time() + launch["ray"]["startup_timeout_s"] + 60
    try:
        head = None
        while head is None:
            found = _read_json(ray_dir / "head.json")
            if found and found.get("attempt") == ctx.attempt:
                head = found
            elif done.exists():
                return
            elif time.time() > deadline:
                raise RayStartupError("the Ray head never published its address in "
                                      f"{ray_dir / 'head.json'}")
            else:
                time.sleep(POLL_S)
        if str(ctx.node) in os.environ.get("VIME_TEST_NO_JOIN", "").split(","):
            state["state"] = "absent"
            print(f"vime: VIME_TEST_NO_JOIN: node {ctx.node} does not join", flush=True)
        else:
            argv = RayNode.command(head=False, address=head["address"], **common)
            node.start(argv)
            state.update(state="joined", tries=1)
        _write_json(state_path, state)
        while not done.exists():
            code = node.exit_code()
            if code is not None and state["state"] == "joined":
                if state["tries"] < JOIN_TRIES:
                    print(f"vime: `ray start` exited with code {code}; joining again "
                          f"(try {state['tries'] + 1} of {JOIN_TRIES})", flush=True)
                    node.restart(argv, keep_logs=ctx.job_dir / "logs" / "ray"
                                 / f"node-{ctx.node}-try{state['tries']}")
                    state["tries"] += 1
                else:
                    state.update(state="failed", error=f"`ray start` exited with code {code} "
                                 f"({JOIN_TRIES} tries)")
                _write_json(state_path, state)
            time.sleep(POLL_S)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _stop(node, ctx)
        if state["state"] != "failed":
            state["state"] = "stopped"
        _write_json(state_path, state)


# ------------------------------------------------------------------------------ entry points

class SlurmEntry:
    """The callable submitit pickles for a Slurm job: every task runs it on its node."""

    def __init__(self, experiment_dir: str, resume: bool = False):
        self.experiment_dir = experiment_dir
        self.resume = resume

    def __call__(self) -> str:
        import submitit

        env = submitit.JobEnvironment()
        attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        ctx = NodeContext(job_id=env.raw_job_id, job_dir=Path(self.experiment_dir) / env.raw_job_id,
                          node=env.node, nodes=env.num_nodes, hostnames=tuple(env.hostnames),
                          attempt=attempt, resume=self.resume or attempt > 0)
        print(f"vime: job {ctx.job_id} attempt {attempt} node {ctx.node}/{ctx.nodes} on "
              f"{ctx.host(ctx.node)} ({socket.gethostname()})", flush=True)
        try:
            run_node(ctx)
        except PreflightError:  # said in the log and outcome.json; no traceback from submitit
            raise SystemExit(1) from None
        return "ok"

    def checkpoint(self):
        """submitit calls this on USR2 (time limit, preemption): requeue, then resume."""
        import submitit

        return submitit.helpers.DelayedSubmission(SlurmEntry(self.experiment_dir, resume=True))


def _local_node(args) -> int:
    job_dir = Path(args.job_dir)
    launch = json.loads((job_dir / "launch.json").read_text())
    ctx = NodeContext(job_id=launch["job_id"], job_dir=job_dir, node=args.node,
                      nodes=launch["nodes"],
                      hostnames=tuple(f"local-{i}" for i in range(launch["nodes"])),
                      attempt=0, resume=args.resume)
    run_node(ctx)
    return 0


def _attach(args) -> int:
    """--ray-address: run the driver on a Ray cluster someone else started."""
    job_dir = Path(args.job_dir)
    launch = json.loads((job_dir / "launch.json").read_text())
    os.environ.update(launch["env"])
    attach_auth_mode(os.environ)
    _stop_on_signals()
    # "started": the job's start record, where no ray/ready-*.json is written
    outcome = {"attempt": 0, "state": "failed", "error": None, "started": time.time()}
    try:
        problem = check_cluster(args.address, launch["nodes"], launch["gpus_per_node"])
        if problem:
            raise RayStartupError(problem)
        (job_dir / "ray_address").write_text(args.address + "\n")
        os.environ["RAY_ADDRESS"] = args.address
        driver = load_driver(launch["driver"])
        driver(json.loads((job_dir / "plan.json").read_text()),
               (job_dir / "resolved.toml").read_text(), job_dir, args.resume)
        outcome["state"] = "succeeded"
    except BaseException as err:
        outcome["error"] = one_line(err, job_dir, job_dir / "logs" / "node-0.log")
        raise
    finally:
        outcome["finished"] = time.time()
        _write_json(job_dir / "outcome.json", outcome)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.node.job")
    verbs = parser.add_subparsers(dest="verb", required=True)
    node = verbs.add_parser("node", help="one node of a `vime submit --local` job")
    node.add_argument("--job-dir", required=True)
    node.add_argument("--node", type=int, required=True)
    node.add_argument("--resume", action="store_true")
    attach = verbs.add_parser("attach", help="the driver on an existing Ray cluster")
    attach.add_argument("--job-dir", required=True)
    attach.add_argument("--address", required=True)
    attach.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    try:
        return _local_node(args) if args.verb == "node" else _attach(args)
    except RayStartupError as err:
        print(f"vime: {err}", file=sys.stderr, flush=True)
        return 1
    except PreflightError:  # the head said it (`vime: job failed: ...`), and outcome.json
        return 1
    except _Terminated as err:
        return int(err.code)
    except Exception:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
