"""On a GPU, without Ray: the GRPO loop of runtime/loop.py on the toy task of
specs/tiny_cpu.toml, with the Megatron training backend and the torch rollout backend
in this process (runtime.actors.local_groups). Prints the reward per rollout.

    python benchmarks/gpu/megatron_grpo.py --rollouts 20 --out $OUT/megatron_grpo.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path

from runtime import actors, backends, rewards
from runtime.checkpoint import Checkpoints
from runtime.data import PromptSampler, read_prompts
from runtime.driver import load_tokenizer
from runtime.loop import GRPOLoop
from runtime.metrics import MetricsLogger
from runtime.slices import JobConfig
from vime import pipeline
from vime.emit import plan_json, resolved
from vime.parse import Source

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--spec", default=str(ROOT / "specs" / "tiny_cpu.toml"))
    parser.add_argument("--set", dest="sets", action="append", default=[])
    args = parser.parse_args()
    spec_path = Path(args.spec)
    sets = ['train.backend="megatron"', f"rollout.num_rollout={args.rollouts}",
            "cluster.gpu=H200", *args.sets]
    result = pipeline.run(Source(str(spec_path), spec_path.read_text()), sets, spec_path.parent)
    # V903 (torch backends only for random_init) predates the Megatron backend's random init
    errors = [(d.code, d.message) for d in result.diagnostics
              if d.severity == "error" and d.code != "V903"]
    if errors:
        raise SystemExit(f"spec errors: {errors}")
    job_dir = Path(tempfile.mkdtemp(prefix="megatron-grpo-"))
    if result.plan is None:
        from vime.plan import plan as make_plan

        result.plan = make_plan(result.spec)
    plan = plan_json.plan_object(str(spec_path), result.diagnostics, result.spec, result.plan)
    text = spec_path.read_text()
    resolved_toml = resolved.render(result.spec, str(spec_path),
                                    hashlib.sha256(text.encode()).hexdigest())
    config = JobConfig.from_job(plan, resolved_toml, job_dir)
    backends.TRAINING["megatron"] = "runtime.backends.megatron_train:MegatronTrainingBackend"
    tokenizer = load_tokenizer(config)
    prompts, _dropped = read_prompts(config.data, tokenizer)
    sampler = PromptSampler(prompts, config.seed, config.data.shuffle)
    train, rollout = actors.local_groups(config, cpu_threads=4)
    metrics = MetricsLogger(job_dir, job_dir.name, None, None, None, config={}, print_fn=print)
    loop = GRPOLoop(config, train, rollout, sampler, tokenizer, rewards.load(config.reward),
                    metrics, Checkpoints(config.save_dir, config.load_dir), log=print)
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
