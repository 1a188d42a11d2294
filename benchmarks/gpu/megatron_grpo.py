"""On a GPU, without Ray: the GRPO loop of runtime/rl/loop.py on the toy task of
specs/tiny_cpu.toml, with the Megatron training backend and the torch rollout backend
in this process (runtime.workers.actors.local_groups). Prints the reward per rollout.

    python benchmarks/gpu/megatron_grpo.py --rollouts 20 --out $OUT/megatron_grpo.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from runtime.node.driver import job_loop
from runtime.node.torchrun import job_config
from runtime.rl.metrics import MetricsLogger
from runtime.workers import actors

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--spec", default=str(ROOT / "specs" / "tiny_cpu.toml"))
    parser.add_argument("--set", dest="sets", action="append", default=[])
    args = parser.parse_args()
    sets = ['train.backend="megatron"', f"rollout.num_rollout={args.rollouts}",
            "cluster.gpu=H200", *args.sets]
    job_dir = Path(tempfile.mkdtemp(prefix="megatron-grpo-"))
    config = job_config(args.spec, sets, job_dir)
    train, rollout = actors.local_groups(config, cpu_threads=4)
    metrics = MetricsLogger(job_dir, job_dir.name, None, None, None, config={}, print_fn=print)
    loop = job_loop(config, train, rollout, metrics, log=print)
    started = time.perf_counter()
    loop.run()
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    summary = {"seconds": time.perf_counter() - started, "rollouts": len(rows),
               "reward": [round(r.get("reward/mean", float("nan")), 3) for r in rows],
               "last": rows[-1] if rows else None}
    print(json.dumps(summary, indent=1))
    Path(args.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
