"""The training ranks of one torchrun world, driven from rank 0 without Ray.

On one node with several GPUs and no Ray (the GPU machines this project is lent), every
process of `torchrun --nproc-per-node N` hosts one training rank (runtime.actors.TrainWorker);
rank 0 also runs the GRPO loop and the rollout engine, and its TrainGroup holds one
RankHandle per rank. A call on the group is broadcast to every rank (torch.distributed's
object collectives), each rank runs it on its own share, and the results are gathered back to
rank 0 — the same calls, in the same order, as the Ray actors receive, so the backends'
collectives (tensor-parallel all-reduces, the expert all-to-all, weight gathers) line up.
The other ranks wait in `follow` until rank 0 says stop.

    python -m torch.distributed.run --standalone --nproc-per-node N -m runtime.spmd \
        SPEC [--set key=value ...] --job-dir DIR

compiles SPEC in every process (the plan must have N training ranks on one node), runs the
GRPO loop on rank 0 with the first engine of the plan in rank 0's process, and writes
metrics.jsonl and checkpoints under DIR. This is how the Megatron backend's multi-GPU
layouts were run on the lent GPU machines, which have no Ray (docs/gpu-runs.md).

Rollout engines live on rank 0: arguments that are engine hosts are not sent to the other
ranks, which only take part in the gathers of a weight export.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist

STOP = "__stop__"


@dataclass(frozen=True)
class RankHandle:
    """One rank of the world, as rank 0's TrainGroup sees it."""

    rank: int


def _local_only(value):
    """Engine hosts (runtime.actors.RolloutWorker) stay on rank 0."""
    from runtime.actors import RolloutWorker

    if isinstance(value, (list, tuple)) and value and all(isinstance(v, RolloutWorker)
                                                          for v in value):
        return []
    return value


def call_all(worker, method: str, calls: Sequence[tuple]) -> list:
    """On rank 0: run method on every rank with its argument tuple; the results in rank order."""
    world = dist.get_world_size()
    if len(calls) != world:
        raise ValueError(f"{len(calls)} argument tuples for {world} ranks")
    # rank 0's own arguments are used here, not sent (they may hold engines)
    sent = [(method, [()] + [tuple(_local_only(a) for a in c) for c in calls[1:]])]
    dist.broadcast_object_list(sent, src=0)
    result = getattr(worker, method)(*calls[0])
    gathered = [None] * world
    dist.gather_object(result, gathered, dst=0)
    return gathered


def follow(worker) -> None:
    """On every other rank: run what rank 0 broadcasts until it says stop."""
    rank = dist.get_rank()
    while True:
        received = [None]
        dist.broadcast_object_list(received, src=0)
        method, calls = received[0]
        if method == STOP:
            return
        result = getattr(worker, method)(*calls[rank])
        dist.gather_object(result, None, dst=0)


def stop() -> None:
    """On rank 0: release the other ranks from `follow`."""
    dist.broadcast_object_list([(STOP, [])], src=0)


# ---------------------------------------------------------------------------- the job

def job_config(spec_path, sets: Sequence[str], job_dir):
    """Compile a spec in this process (as `vime submit` does) into the runtime's JobConfig."""
    import json
    from pathlib import Path

    from runtime.slices import JobConfig, compile_job

    try:
        files = compile_job(Path(spec_path), sets)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    return JobConfig.from_job(json.loads(files["plan.json"]), files["resolved.toml"],
                              Path(job_dir))


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import os
    from pathlib import Path

    from runtime import actors
    from runtime.driver import job_loop
    from runtime.metrics import MetricsLogger

    parser = argparse.ArgumentParser(prog="python -m runtime.spmd")
    parser.add_argument("spec")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--cpu-threads", type=int, default=2)
    args = parser.parse_args(argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    job_dir = Path(args.job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    config = job_config(args.spec, args.sets, job_dir)
    if len(config.ranks) != world or len({r["node"] for r in config.ranks}) != 1:
        raise SystemExit(f"the plan has {len(config.ranks)} training ranks on "
                         f"{len({r['node'] for r in config.ranks})} nodes; this world is "
                         f"{world} processes on one node")
    train = actors.spmd_group(config, rank, args.cpu_threads)
    if train is None:  # released by rank 0
        return 0
    try:
        engine = actors.RolloutWorker(config.rollout_backend)
        engine.start(config.engine_slice(0, args.cpu_threads))
        metrics = MetricsLogger(job_dir, job_dir.name, None, None, None, config={}, print_fn=print)
        loop = job_loop(config, train, actors.RolloutGroup([engine]), metrics, log=print)
        loop.restore()
        loop.run()
    finally:
        stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
