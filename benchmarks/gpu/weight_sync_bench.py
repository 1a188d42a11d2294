"""One full weight push from the Megatron actor to the colocated vLLM engine, timed: the path
the loop takes (vLLM's IPC transfer engine, or the collective_rpc fallback when the spec says
`--weight-transfer-config={"backend":"none"}`), through vime's own Ray actors on this machine.

    python benchmarks/gpu/weight_sync_bench.py SPEC [--set ...] [--repeats 3] --out F.json

Each push is what a rollout does after training: actor offloaded, engine woken with its weights
only (after a level-2 sleep), every tensor pushed, engine's KV cache woken; then a short
generation checks that the engine still answers. The spec must be colocated on one GPU.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))


def main() -> None:
    from live_grpo import arguments, start

    parser = arguments()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import ray

    from runtime.core.interfaces import GenerationRequest, SamplingParams
    from runtime.core.slices import JobConfig
    from runtime.node import placement
    from runtime.node.driver import cpu_threads_per_actor
    from runtime.workers import actors

    files, job_dir = start(args)
    plan = json.loads(files["plan.json"])
    config = JobConfig.from_job(plan, files["resolved.toml"], job_dir)
    group = placement.create(plan)
    started = time.perf_counter()
    train, rollout = actors.ray_groups(config, group, cpu_threads_per_actor(config))
    ready_s = time.perf_counter() - started
    pushes = []
    for version in range(1, args.repeats + 1):
        train.offload()
        rollout.sleep(2)
        rollout.wake(["weights"])
        t0 = time.perf_counter()
        sent = train.push_weights(rollout, version, config.weight_bucket_bytes)
        seconds = time.perf_counter() - t0
        rollout.wake(["kv_cache"])
        pushes.append({"version": version, "seconds": round(seconds, 3), "bytes": sent,
                       "gb_per_s": round(sent / seconds / 1e9, 2),
                       "export_s": round(train.export_seconds, 3)})
        print("push", pushes[-1], flush=True)
    out = rollout.generate([GenerationRequest((1, 2, 3, 4), seed=s) for s in range(4)],
                           SamplingParams(1.0, 1.0, 4, ()))
    route = train.sync_route(rollout)
    result = {"spec": args.spec, "sets": args.sets, "path": route.path,
              "bucket_bytes": config.weight_bucket_bytes, "ready_s": round(ready_s, 1),
              "pushes": pushes, "generated_after": [len(g.token_ids) for g in out]}
    print("RESULT " + json.dumps(result), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    train.stop()
    rollout.stop()
    placement.remove(group)
    ray.shutdown()


if __name__ == "__main__":
    main()
