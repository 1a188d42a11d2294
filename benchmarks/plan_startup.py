"""Time `vime plan specs/qwen3_30b.toml` against a bare `python -c pass`.

Usage: python benchmarks/plan_startup.py [--runs N]. Prints a Markdown table row set (the plans
themselves go to /dev/null); results are recorded in benchmarks/RESULTS.md with the date and
machine. The last four cases are the largest cluster the schema admits.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# 4096 nodes × 64 GPUs (the schema's maxima) with the seed's layout (8-GPU engines), and with
# every parallel size 1 and one-GPU engines (262,144 ranks, engines and groups of each kind)
_NODES = ["cluster.nodes=4096", "cluster.gpus_per_node=64"]
LARGEST = {
    "<seed, 4096 × 64>": _NODES + ["rollout.batch_size=32768", "train.global_batch_size=65536"],
    "<one-GPU engines, 4096 × 64>": _NODES + [
        "cluster.gpu_memory_gib=1024", "rollout.batch_size=131072",
        "train.global_batch_size=262144", "train.parallel.tp=1", "train.parallel.ep=1",
        "train.parallel.sequence_parallel=false", "inference.gpus_per_engine=1",
        "inference.expert_parallel=false"],
}


def measure(argv: list[str], runs: int) -> list[float]:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)  # warm the file cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)  # output discarded
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "vime plan specs/qwen3_30b.toml": [sys.executable, "-m", "vime", "plan",
                                           "specs/qwen3_30b.toml"],
        "vime plan specs/qwen3_30b_24gpu_eplb.toml --json": [
            sys.executable, "-m", "vime", "plan", "specs/qwen3_30b_24gpu_eplb.toml", "--json"],
    }
    # the largest cluster the schema admits (within a second on any admitted spec)
    for name, sets in LARGEST.items():
        argv = [sys.executable, "-m", "vime", "plan", "specs/qwen3_30b.toml"]
        argv += [arg for item in sets for arg in ("--set", item)]
        cases[f"vime plan {name}"] = argv
        cases[f"vime plan {name} --json"] = argv + ["--json"]
    print(f"python {platform.python_version()} on {platform.machine()}, {runs} runs each\n")
    print("| command | median ms | min ms | max ms |")
    print("|---|---|---|---|")
    for name, argv in cases.items():
        times = [t * 1000 for t in measure(argv, runs)]
        print(f"| `{name}` | {statistics.median(times):.0f} | {min(times):.0f} | {max(times):.0f} |")


if __name__ == "__main__":
    main()
