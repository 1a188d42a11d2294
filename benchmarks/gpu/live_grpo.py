"""The GRPO loop of a spec through vime's driver on this machine's GPU(s): a Ray started here
(no dashboard: the GPU machine has Ray's core only), the plan's placement group, the
Megatron actor and the vLLM engine as Ray actors, colocated as the spec says. Then a summary
of metrics.jsonl per rollout: reward, the actor/engine log-prob gap, the share of replayed
routes the actor's routers pick too, and the time of each phase.

    python benchmarks/gpu/live_grpo.py specs/tiny_h200.toml [--set KEY=VALUE ...] --out F

This is `vime submit --local` without the job launcher (which starts Ray with its dashboard).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

PHASES = ("generate", "offload", "reward", "log_probs", "train", "weight_sync", "save")


def summary(rows: list[dict]) -> dict:
    def column(key, digits=4):
        return [round(r[key], digits) if key in r else None for r in rows]

    return {
        "rollouts": len(rows),
        "reward": column("reward/mean", 3),
        "acc": column("reward/acc", 3),
        "logprob_abs_diff": column("rollout/logprob_abs_diff"),
        "logprob_abs_diff_max": column("rollout/logprob_abs_diff_max"),
        "replayed_route_match": column("train/replayed_route_match"),
        "weight_version": column("weight_version", 0),
        "mean_time_s": {p: round(sum(r.get(f"time/{p}", 0.0) for r in rows[1:])
                                 / max(len(rows) - 1, 1), 3) for p in PHASES},
        "first_rollout_time_s": {p: round(rows[0].get(f"time/{p}", 0.0), 3) for p in PHASES}
        if rows else {},
    }


def job_files(spec: Path, sets: list[str]) -> tuple[dict[str, str], Path]:
    """The job folder's files as `vime submit` writes them (paths made absolute), and a new job
    folder in the spec's experiment folder: its checkpoints are the experiment's, as with
    `vime submit` (a second run of the same experiment resumes from them)."""
    from runtime.core.slices import compiled
    from vime.launch.submit import prepare

    try:
        result, text, obj = compiled(spec, sets)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    prepared = prepare(result, str(spec), text, obj, "local")
    job_dir = prepared.experiment_dir / time.strftime("live-%Y%m%d-%H%M%S")
    job_dir.mkdir(parents=True)
    return prepared.files, job_dir


def arguments() -> argparse.ArgumentParser:
    """What the GPU scripts that run a spec on a local Ray take (this one, weight_sync_bench.py)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--out")
    parser.add_argument("--logical-gpus", type=int,
                        help="Ray's GPU count on a machine without GPUs (a CPU try of the script)")
    return parser


def start(args) -> tuple[dict[str, str], Path]:
    """The job folder written and a Ray started in this process (no dashboard: the GPU machine
    has Ray's core only); returns the job's files and folder."""
    import ray

    files, job_dir = job_files(Path(args.spec), args.sets)
    for name, text in files.items():
        (job_dir / name).write_text(text)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(include_dashboard=False, logging_level="WARNING", log_to_driver=True,
             **({"num_gpus": args.logical_gpus} if args.logical_gpus else {}))
    return files, job_dir


def main() -> None:
    args = arguments().parse_args()

    import ray

    from runtime.node import driver

    files, job_dir = start(args)
    started = time.perf_counter()
    try:
        driver.run(json.loads(files["plan.json"]), files["resolved.toml"], job_dir, resume=False)
    finally:
        ray.shutdown()
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    result = {"spec": args.spec, "sets": args.sets, "seconds": round(time.perf_counter() - started, 1),
              **summary(rows)}
    print("RESULT " + json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps({**result, "metrics": rows}, indent=1))


if __name__ == "__main__":
    main()
