"""The synchronous loop against rollout.async = "one_step" on one GPU, actor and engine both
resident, side by side in one run (issue 44).

    python benchmarks/gpu/async_step.py --out DIR                  # H200: the 4-layer slice
    python benchmarks/gpu/async_step.py --gpu H100 --layers 2 --set inference.gpu_memory_utilization=0.3

The spec is specs/qwen3_30b_slice_h200.toml (a Qwen3-30B-A3B slice, 32 prompts x 8 samples of
up to 1,024 tokens) with train.offload = "never" and `--layers` of its layers (the model folder
is written first when missing: benchmarks/gpu/tiny_moe.py). For each mode (rollout.async "off",
then "one_step") it asks `vime plan --json` for the forecast, runs the GRPO loop
(benchmarks/gpu/live_grpo.py, its own process, a fresh experiment) with one rollout more than
`--rollouts`, stops it with Ctrl-C once `--rollouts` are logged (so no checkpoint is written and
the last logged one-step rollout still has a next generation beside its training) and reads
its metrics.jsonl:

- the wall time per rollout: time/rollout (the synchronous loop's phases, one after the other)
  and, one-step, time/step (from one push to the next);
- the phases: generate, log-probs, train, weight sync, and one-step what training waited for
  the next generation (time/wait_generate);
- the share of each rollout's training spent beside the next generation: the loop's
  async/train_hidden_share, and the same recomputed from its phase intervals (phase/*);
  the synchronous loop hides nothing (its phases run one after the other);
- reward/mean and the actor/engine log-prob gap per token (synchronous: rollout/logprob_abs_diff,
  same weights; one-step: staleness/logprob_abs_diff, one version apart after rollout 0, so it
  holds one step of the policy's move too) and the importance weights TIS sees.

Steady rollouts: 1 .. N-1 (rollout 0 carries the warm-up, and one-step it also generates
rollout 0 itself). A mode run in an earlier call with the same --out, card, layers and rollouts
is kept in DIR/async-step.json and shown beside (two calls on one machine when both do not fit
one call's time). Needs vLLM, megatron-core and Ray importable. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "qwen3_30b_slice_h200.toml"
MODES = ("off", "one_step")
PHASES = ("generate", "reward", "log_probs", "train", "weight_sync", "wait_generate", "save")


def model_folder(layers: int) -> Path:
    name = "qwen3-30b-a3b-slice" if layers == 4 else f"qwen3-30b-a3b-slice-{layers}l"
    return ROOT / "build" / name


def ensure_model(layers: int) -> None:
    folder = model_folder(layers)
    if not (folder / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "tiny_moe.py"),
                        str(folder), "--shape", "qwen3-30b-a3b", "--layers", str(layers)],
                       check=True)


def spec_sets(args, mode: str) -> list[str]:
    """The --set overrides of one mode's run (the user's last: they win)."""
    return [f"model.arch.num_hidden_layers={args.layers}",
            f'model.hf_checkpoint="{model_folder(args.layers)}"',
            f'cluster.gpu="{args.gpu}"', 'train.offload="never"', f'rollout.async="{mode}"',
            f"rollout.num_rollout={args.rollouts + 1}", f'experiment.name="async-step-{mode}"',
            f'experiment.output_dir="{args.runs_dir}"', *args.sets]


def forecast(args, mode: str) -> dict:
    """`vime plan --json`'s forecast of the mode's run: its phases, the synchronous total and
    the step as the loop runs (one-step: overlapped or not)."""
    command = [sys.executable, "-m", "vime", "plan", str(SPEC), "--json",
               *[arg for s in spec_sets(args, mode) for arg in ("--set", s)]]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    try:
        plan = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"error": (done.stdout + done.stderr)[-2000:]}
    f = plan.get("forecast") or {}
    placement = plan.get("colocation") or {}
    return {"mode": f.get("mode"), "total_s": f.get("total_s"), "async": f.get("async"),
            "phases": {p["name"]: p["seconds"] for p in f.get("phases", [])},
            "colocation": placement.get("mode")}


def run_loop(args, mode: str, out_dir: Path) -> dict:
    """The mode's GRPO loop for rollout.num_rollout = rollouts + 1, stopped with Ctrl-C
    (SIGINT: the loop's own stop, Ray shut down) once `rollouts` metrics lines are written:
    the last of them still generates its successor one-step, and no checkpoint is written
    (checkpoint.save_interval is past the run)."""
    log = out_dir / f"loop-{mode}.log"
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu" / "live_grpo.py"), str(SPEC),
               *[arg for s in spec_sets(args, mode) for arg in ("--set", s)]]
    experiment = Path(args.runs_dir) / f"async-step-{mode}"
    shutil.rmtree(experiment, ignore_errors=True)  # a fresh experiment, not a resume
    began = time.perf_counter()
    code: object = None
    lines: list[str] = []
    with log.open("w") as stream:
        process = subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT, cwd=ROOT)
        while process.poll() is None and time.perf_counter() - began < args.limit_s:
            found = sorted(experiment.glob("*/metrics.jsonl"))
            lines = found[-1].read_text().splitlines() if found else []
            if len(lines) >= args.rollouts:
                break
            time.sleep(1.0)
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                code = "killed"
        code = code or process.returncode
    found = sorted(experiment.glob("*/metrics.jsonl"))
    lines = found[-1].read_text().splitlines() if found else []
    shutil.rmtree(experiment, ignore_errors=True)
    seconds = round(time.perf_counter() - began, 1)
    metrics = [json.loads(line) for line in lines[:args.rollouts]]
    (out_dir / f"metrics-{mode}.jsonl").write_text("".join(line + "\n" for line in lines))
    if len(metrics) < args.rollouts:
        return {"mode": mode, "error": f"{len(metrics)} of {args.rollouts} rollouts, exit {code}",
                "seconds": seconds, "log_tail": log.read_text().splitlines()[-25:]}
    return {"mode": mode, "seconds": seconds, "exit": code, "metrics": metrics}


def rows_of(mode: str, metrics: list[dict]) -> list[dict]:
    """Per rollout: the wall time (checkpoint left out), the phases, the hidden share (the
    loop's and the phase intervals'), reward and the log-prob gap."""
    rows = []
    for i, m in enumerate(metrics):
        wall = m["time/step"] if mode == "one_step" else m["time/rollout"]
        row = {"rollout": i, "wall": wall - m.get("time/save", 0.0),
               **{p: m.get(f"time/{p}", 0.0) for p in PHASES},
               "reward": m.get("reward/mean"), "response_len": m.get("response_len/mean"),
               "startup_s": m.get("startup/total_s")}
        if mode == "one_step":
            row["gap"] = m.get("staleness/logprob_abs_diff")
            row["hidden_share"] = m.get("async/train_hidden_share", 0.0)
            row["is_weight_mean"] = m.get("staleness/is_weight_mean")
            row["is_truncated_share"] = m.get("staleness/is_truncated_share")
            row["versions_behind"] = m.get("staleness/versions_behind")
            nxt = metrics[i + 1] if i + 1 < len(metrics) else None
            train = (m["phase/train_start"], m["phase/train_end"])
            if nxt is not None:
                generate = (nxt["phase/generate_start"], nxt["phase/generate_end"])
                shared = max(0.0, min(train[1], generate[1]) - max(train[0], generate[0]))
                row["hidden_share_intervals"] = shared / max(train[1] - train[0], 1e-9)
            else:
                row["hidden_share_intervals"] = None  # its successor's interval is not logged
            row["train_phase_s"] = train[1] - train[0]
        else:
            row["gap"] = m.get("rollout/logprob_abs_diff")
            row["hidden_share"] = row["hidden_share_intervals"] = 0.0
        rows.append(row)
    return rows


def steady(rows: list[dict]) -> list[dict]:
    return rows[1:]


def summary(mode: str, rows: list[dict], plan: dict) -> dict:
    chosen = steady(rows) or rows

    def mean(key):
        values = [r[key] for r in chosen if r.get(key) is not None]
        return statistics.fmean(values) if values else None

    out = {"steady_rollouts": [r["rollout"] for r in chosen],
           **{k: mean(k) for k in ("wall", "generate", "log_probs", "train", "weight_sync",
                                   "wait_generate", "hidden_share", "hidden_share_intervals",
                                   "gap")},
           "reward_all": statistics.fmean(r["reward"] for r in rows),
           "wall_all": sum(r["wall"] for r in rows)}
    predicted = (plan.get("async") or {}).get("step_s") or plan.get("total_s")
    if predicted and out["wall"]:
        out["forecast_s"] = predicted
        out["forecast_error"] = predicted / out["wall"] - 1.0
    return out


def _two(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(results: dict) -> list[str]:
    lines = [f"card {results['card']}, {results['layers']} layers, {results['rollouts']} rollouts "
             f"each; sets {results['sets']}"]
    for mode in MODES:
        run = results.get(mode)
        if not run:
            continue
        if "error" in run:
            lines += [f"{mode}: {run['error']} after {run['seconds']} s", *run["log_tail"]]
            continue
        lines.append(f"{mode} ({run['seconds']} s, start-up {run['rows'][0]['startup_s']} s): "
                     "rollout   wall  generate log_probs  train  w_sync  wait_gen  hidden "
                     "(intervals)  reward    gap")
        for r in run["rows"]:
            lines.append(f"  {r['rollout']:>27} {r['wall']:6.2f} {r['generate']:9.2f} "
                         f"{r['log_probs']:9.2f} {r['train']:6.2f} {r['weight_sync']:7.2f} "
                         f"{r['wait_generate']:9.2f} {r['hidden_share']:7.2f} "
                         f"({_two(r['hidden_share_intervals'])})    {r['reward']:.3f} "
                         f"{(r['gap'] or 0):.4f}")
        s, plan = run["summary"], run["plan"]
        lines.append(f"  steady {s['steady_rollouts']}: wall {s['wall']:.2f} s, hidden "
                     f"{s['hidden_share']:.2f}, gap {s['gap']:.4f}; reward over all "
                     f"{s['reward_all']:.3f}; forecast {s.get('forecast_s')} s "
                     f"(error {s.get('forecast_error', 0):+.1%}; plan: {plan.get('mode')}, "
                     f"async {plan.get('async')})")
    if results.get("off", {}).get("summary") and results.get("one_step", {}).get("summary"):
        off, one = results["off"]["summary"], results["one_step"]["summary"]
        lines.append(f"one-step / synchronous steady wall: {one['wall'] / off['wall']:.3f}")
    return lines


def card() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception as err:  # no torch or no GPU: said in the results
        return f"unknown ({err})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", default="H200", help="cluster.gpu of the plan")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--runs-dir", default=str(ROOT / "build" / "runs"),
                        help="experiment.output_dir (the checkpoints; removed after each run)")
    parser.add_argument("--limit-s", type=int, default=400, help="each loop's time limit")
    parser.add_argument("--plan-only", action="store_true")
    parser.add_argument("--out", default="build/async-step")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modes = args.modes.split(",")
    results: dict = {"card": card(), "layers": args.layers, "rollouts": args.rollouts,
                     "sets": args.sets, "spec": str(SPEC.relative_to(ROOT))}
    saved = out / "async-step.json"
    if saved.exists():  # an earlier call's modes, on the same card and shape
        earlier = json.loads(saved.read_text())
        if all(earlier.get(k) == results[k] for k in ("card", "layers", "rollouts", "sets")):
            results.update({m: earlier[m] for m in MODES if m in earlier and m not in modes})
    plans = {mode: forecast(args, mode) for mode in modes}
    print("plans", json.dumps(plans), flush=True)
    if not args.plan_only:
        ensure_model(args.layers)
    for mode in modes:
        if args.plan_only:
            results[mode] = {"plan": plans[mode]}
            continue
        print(f"{time.strftime('%H:%M:%S')} {mode}: the loop", flush=True)
        run = run_loop(args, mode, out)
        if "metrics" in run:
            run["rows"] = rows_of(mode, run.pop("metrics"))
            run["summary"] = summary(mode, run["rows"], plans[mode])
        run["plan"] = plans[mode]
        results[mode] = run
        print(mode, json.dumps(run), flush=True)
        saved.write_text(json.dumps(results, indent=1))
    if not args.plan_only:
        print("\n".join(table(results)))


if __name__ == "__main__":
    main()
