"""Time `vime plan specs/qwen3_30b.toml` against a bare `python -c pass`.

Usage: python benchmarks/plan_startup.py [--runs N]. Prints a Markdown table row set;
results are recorded in benchmarks/RESULTS.md with the date and machine.
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


def measure(argv: list[str], runs: int) -> list[float]:
    subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)  # warm the file cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)
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
    print(f"python {platform.python_version()} on {platform.machine()}, {runs} runs each\n")
    print("| command | median ms | min ms | max ms |")
    print("|---|---|---|---|")
    for name, argv in cases.items():
        times = [t * 1000 for t in measure(argv, runs)]
        print(f"| `{name}` | {statistics.median(times):.0f} | {min(times):.0f} | {max(times):.0f} |")


if __name__ == "__main__":
    main()
