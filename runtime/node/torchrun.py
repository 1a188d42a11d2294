"""The job as one torchrun world on one node, without Ray (runtime/core/spmd.py drives its
ranks):

    python -m torch.distributed.run --standalone --nproc-per-node N -m runtime.node.torchrun \
        SPEC [--set key=value ...] --job-dir DIR

compiles SPEC in every process (the plan must have N training ranks on one node), runs the
GRPO loop on rank 0 with the first engine of the plan in rank 0's process, and writes
metrics.jsonl and checkpoints under DIR. This is how the Megatron backend's multi-GPU
layouts run on a GPU machine without Ray (benchmarks/gpu/parallel_suite.sh, docs/gpu-runs.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.core.spmd import stop


def job_config(spec_path, sets: Sequence[str], job_dir):
    """Compile a spec in this process (as `vime submit` does) into the runtime's JobConfig."""
    import json
    from pathlib import Path

    from runtime.core.slices import JobConfig, compile_job

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

    from runtime.node.driver import job_loop
    from runtime.rl.metrics import MetricsLogger
    from runtime.workers import build
    from runtime.workers.groups import RolloutGroup
    from runtime.workers.host import RolloutWorker

    parser = argparse.ArgumentParser(prog="python -m runtime.node.torchrun")
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
    train = build.spmd_group(config, rank, args.cpu_threads)
    if train is None:  # released by rank 0
        return 0
    try:
        engine = RolloutWorker(config.rollout_backend)
        engine.start(config.engine_slice(0, args.cpu_threads))
        metrics = MetricsLogger(job_dir, job_dir.name, None, None, None, config={}, print_fn=print)
        loop = job_loop(config, train, RolloutGroup([engine]), metrics, log=print)
        loop.restore()
        loop.run()
    finally:
        stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
