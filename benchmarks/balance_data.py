"""What train.balance_data buys: the busiest data-parallel replica's tokens over the mean, with
the samples split contiguously (the default) and balanced (runtime/core/hosts.balanced_split),
for GRPO batches of a long-tailed length spread. A synchronous step waits for its busiest
replica, and the actor's forward and backward cost grows with the tokens (the packed path's
tokens/s is flat over micro-batch shapes: benchmarks/RESULTS.md), so the ratio is the step's
slowdown against perfect balance.

    python benchmarks/balance_data.py [--batches 200] [--out F]

The spread is synthetic (no trained model's lengths are in the repository): each prompt has a
difficulty that sets its group's median response length (lognormal around 2,000 tokens,
sigma 0.8, capped at the 8,192 of the seed's run), the samples of a group spread around it
(sigma 0.35), prompts of 100–600 tokens; a group's samples are adjacent in the batch, as the
loop builds it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.core.hosts import balanced_split, split  # noqa: E402

MAX_RESPONSE = 8192


def batch(rng: random.Random, prompts: int, n: int) -> list[int]:
    lengths = []
    for _ in range(prompts):
        prompt = rng.randint(100, 600)
        median = min(rng.lognormvariate(7.6, 0.8), MAX_RESPONSE)
        lengths += [prompt + min(int(rng.lognormvariate(0, 0.35) * median) + 1, MAX_RESPONSE)
                    for _ in range(n)]
    return lengths


def busiest_over_mean(lengths: list[int], shares: list) -> float:
    sums = [sum(lengths[i] for i in share) for share in shares]
    return max(sums) / (sum(sums) / len(sums))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = []
    for prompts, n in ((32, 8), (64, 16)):
        batches = [batch(rng, prompts, n) for _ in range(args.batches)]
        for dp in (2, 4, 8, 16):
            contiguous = [busiest_over_mean(b, split(len(b), dp)) for b in batches]
            balanced = [busiest_over_mean(b, balanced_split(b, dp)) for b in batches]
            rows.append({"prompts": prompts, "n": n, "dp": dp,
                         "contiguous_mean": round(statistics.mean(contiguous), 3),
                         "contiguous_p90": round(sorted(contiguous)[int(0.9 * len(contiguous))], 3),
                         "balanced_mean": round(statistics.mean(balanced), 4),
                         "balanced_max": round(max(balanced), 4),
                         "step_speedup": round(statistics.mean(c / b for c, b in
                                                               zip(contiguous, balanced, strict=True)), 3)})
    print("| batch | dp | busiest / mean, contiguous (mean, p90) | balanced (mean, worst) | "
          "step time, contiguous / balanced |")
    print("|---|---:|---|---|---:|")
    for r in rows:
        print(f"| {r['prompts']} × {r['n']} | {r['dp']} | {r['contiguous_mean']}, "
              f"{r['contiguous_p90']} | {r['balanced_mean']}, {r['balanced_max']} | "
              f"{r['step_speedup']}× |")
    if args.out:
        Path(args.out).write_text(json.dumps({"seed": args.seed, "batches": args.batches,
                                              "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
