"""The colocated step at a realistic batch, phase by phase, with the floors of its copies.

    python benchmarks/gpu/step_breakdown.py --out DIR                 # all parts, one GPU
    python benchmarks/gpu/step_breakdown.py --parts copies --out DIR  # one part
    python benchmarks/gpu/step_breakdown.py --parts loop --modes offload --set rollout.batch_size=16

The spec (default specs/qwen3_30b_slice_h200.toml) is a 4-layer Qwen3-30B-A3B slice, 32 prompts
x 8 samples of up to 1,024 tokens; its model folder is written first when missing
(benchmarks/gpu/tiny_moe.py). Parts:

- copies: the actor's offload mechanism (runtime/backends/offload.py) over storages of the
  slice's sizes (bf16 weights, fp32 main parameters and two Adam moments kept, fp32 gradients
  dropped), against one pinned cudaMemcpy of the same bytes each way, and the pageable copy
  the backend made before (a fresh host tensor per storage); the contents checked bit for bit.
- loop: the GRPO loop (benchmarks/gpu/live_grpo.py, its own process) once per mode: resident
  (train.offload = "never") and offload ("always"); the time of each phase per rollout.
- sync: the floor of the weight sync: vLLM's load_weights of the slice's tensors already in
  device memory, in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), through vime's worker
  extension, bare and inside vLLM's layerwise reload round.

Needs vLLM, megatron-core and Ray importable. Prints a table per part last; DIR gets the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
SPEC = ROOT / "specs" / "qwen3_30b_slice_h200.toml"
MODEL = ROOT / "build" / "qwen3-30b-a3b-slice"
PHASES = ("generate", "offload", "reward", "log_probs", "train", "weight_sync")
MODES = {"resident": "never", "offload": "always"}


def ensure_model() -> None:
    if not (MODEL / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "tiny_moe.py"),
                        str(MODEL), "--shape", "qwen3-30b-a3b", "--layers", "4"], check=True)


def slice_params() -> int:
    """Parameters of the slice as megatron-core holds them (vime's count of the spec's arch)."""
    from vime.pipeline import run_file

    result = run_file(str(SPEC), SPEC.read_bytes(), [], SPEC.parent)
    return int(result.spec.arch.params_total)


# ---------------------------------------------------------------------------------- copies

def _events_s(fn) -> float:
    import torch

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3


def _registered(nbytes: int):
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8)
    assert int(torch.cuda.cudart().cudaHostRegister(host.data_ptr(), nbytes, 0)) == 0
    return host


def _memcpy_floor(nbytes: int, repeats: int, device) -> dict:
    """One pinned cudaMemcpy of nbytes each way, the best of `repeats`."""
    import torch

    flat = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    host = _registered(nbytes)
    d2h = [_events_s(lambda: host.copy_(flat, non_blocking=True)) for _ in range(repeats)]
    h2d = [_events_s(lambda: flat.copy_(host, non_blocking=True)) for _ in range(repeats)]
    torch.cuda.cudart().cudaHostUnregister(host.data_ptr())
    return {"memcpy_d2h_gb_s": nbytes / min(d2h) / 1e9, "memcpy_h2d_gb_s": nbytes / min(h2d) / 1e9}


def copies(params: int, pieces: int, repeats: int) -> dict:
    import torch

    from runtime.backends.offload import HostMirror

    device = torch.device("cuda", 0)
    kept_bytes = params * (2 + 4 + 4 + 4)
    out: dict = {"params": params, "kept_gb": kept_bytes / 1e9, "grads_gb": params * 4 / 1e9}
    out.update(_memcpy_floor(kept_bytes, repeats, device))
    torch.cuda.empty_cache()
    # the actor's storages: Megatron's bf16 parameter buffer and fp32 gradient buffer are one
    # storage each; the distributed optimizer's fp32 state is one tensor per parameter
    def state(numel, dtype, count):
        step = -(-numel // count)
        return [torch.randn(min(step, numel - i), dtype=dtype, device=device)
                for i in range(0, numel, step)]

    weights = state(params, torch.bfloat16, 1)
    main, exp_avg, exp_avg_sq = (state(params, torch.float32, pieces) for _ in range(3))
    grads = state(params, torch.float32, 1)
    kept = weights + main + exp_avg + exp_avg_sq
    sample = [t[:4096].clone() for t in kept]
    # the copy the backend made before: a fresh pageable host tensor per storage
    began = time.perf_counter()
    pageable = weights[0].to("cpu", copy=True)
    out["pageable_d2h_gb_s"] = pageable.numel() * 2 / (time.perf_counter() - began) / 1e9
    del pageable
    mirror = HostMirror(device)
    began = time.perf_counter()
    mirror.track([t.untyped_storage() for t in kept], [t.untyped_storage() for t in grads],
                 {weights[0].untyped_storage().data_ptr()})
    out["buffers_made_s"] = time.perf_counter() - began
    cycles = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        mirror.offload()
        t1 = time.perf_counter()
        mirror.onload()
        torch.cuda.synchronize()
        cycles.append((t1 - t0, time.perf_counter() - t1))
        mirror.track([t.untyped_storage() for t in kept], [t.untyped_storage() for t in grads],
                     {weights[0].untyped_storage().data_ptr()})
    out["buffers_made"] = mirror.buffers_made
    out["storages"] = len(kept) + len(grads)
    out["offload_s"] = [round(c[0], 3) for c in cycles]
    out["onload_s"] = [round(c[1], 3) for c in cycles]
    out["offload_gb_s"] = mirror.host_bytes / min(c[0] for c in cycles) / 1e9
    out["onload_gb_s"] = mirror.host_bytes / min(c[1] for c in cycles) / 1e9
    out["bit_for_bit"] = all(torch.equal(t[:4096], s) for t, s in zip(kept, sample, strict=True))
    out["offload_vs_memcpy"] = out["offload_gb_s"] / out["memcpy_d2h_gb_s"]
    out["onload_vs_memcpy"] = out["onload_gb_s"] / out["memcpy_h2d_gb_s"]
    return out


# ------------------------------------------------------------------------------------ loop

def loop(mode: str, rollouts: int, sets: list[str], out_dir: Path, limit_s: int) -> dict:
    out = out_dir / f"loop-{mode}.json"
    log = out_dir / f"loop-{mode}.log"
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu" / "live_grpo.py"), str(SPEC),
               "--set", f'train.offload="{MODES[mode]}"', "--set",
               f"rollout.num_rollout={rollouts}", "--set", f"experiment.name=breakdown-{mode}",
               *[arg for s in sets for arg in ("--set", s)], "--out", str(out)]
    # a fresh experiment (not a resume), whose checkpoint (~44 GB) is removed afterwards
    experiment = ROOT / "build" / "runs" / f"breakdown-{mode}"
    shutil.rmtree(experiment, ignore_errors=True)
    began = time.perf_counter()
    try:
        with log.open("w") as stream:
            code = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT, cwd=ROOT,
                                  timeout=limit_s).returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    shutil.rmtree(experiment, ignore_errors=True)
    if code != 0 or not out.exists():
        tail = log.read_text().splitlines()[-15:]
        return {"mode": mode, "error": f"exit {code}", "log_tail": tail}
    result = json.loads(out.read_text())
    rows = []
    for record in result["metrics"]:
        row = {p: round(record.get(f"time/{p}", 0.0), 3) for p in PHASES}
        # the rollout's time but the checkpoint's (the loop saves after the last rollout)
        row["total"] = round(record["time/rollout"] - record.get("time/save", 0.0), 3)
        for key in ("weight_sync/export_s", "offload/actor_out_s", "offload/actor_in_s",
                    "offload/actor_gb", "weight_sync/bytes", "response_len/mean",
                    "rollout/logprob_abs_diff"):
            if key in record:
                row[key] = round(record[key], 4)
        rows.append(row)
    return {"mode": mode, "seconds": round(time.perf_counter() - began, 1), "rows": rows,
            "sets": sets}


# ------------------------------------------------------------------------------------ sync

def sync_floor(repeats: int, utilization: float) -> dict:
    import torch
    from safetensors.torch import load_file
    from vllm import LLM

    llm = LLM(model=str(MODEL), gpu_memory_utilization=utilization, enforce_eager=True,
              max_model_len=2048, seed=1234,
              worker_extension_cls="runtime.backends.vllm_worker.VimeWorkerExtension")
    tensors = {}
    for path in sorted(MODEL.glob("*.safetensors")):
        tensors.update(load_file(str(path), device="cuda:0"))
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    bare, round_trip = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        began = time.perf_counter()
        llm.collective_rpc("vime_load", args=(tensors,))
        torch.cuda.synchronize()
        bare.append(time.perf_counter() - began)
    for _ in range(repeats):
        torch.cuda.synchronize()
        began = time.perf_counter()
        llm.collective_rpc("vime_start_update")
        llm.collective_rpc("vime_load", args=(tensors,))
        llm.collective_rpc("vime_finish_update")
        torch.cuda.synchronize()
        round_trip.append(time.perf_counter() - began)
    return {"gb": nbytes / 1e9, "tensors": len(tensors),
            "load_weights_s": [round(s, 3) for s in bare],
            "load_weights_gb_s": nbytes / min(bare) / 1e9,
            "reload_round_s": [round(s, 3) for s in round_trip],
            "reload_round_gb_s": nbytes / min(round_trip) / 1e9}


# ----------------------------------------------------------------------------------- print

def table(results: dict) -> list[str]:
    lines = []
    c = results.get("copies")
    if c:
        lines += ["copies (GB/s)   offload  onload  memcpy d2h  memcpy h2d  pageable d2h",
                  f"  {c['kept_gb']:.1f} GB kept  {c['offload_gb_s']:7.1f} {c['onload_gb_s']:7.1f} "
                  f"{c['memcpy_d2h_gb_s']:11.1f} {c['memcpy_h2d_gb_s']:11.1f} "
                  f"{c['pageable_d2h_gb_s']:13.1f}",
                  f"  offload/memcpy {c['offload_vs_memcpy']:.2f}, onload/memcpy "
                  f"{c['onload_vs_memcpy']:.2f}; buffers made once in {c['buffers_made_s']:.1f} s; "
                  f"bit for bit: {c['bit_for_bit']}"]
    for mode in MODES:
        run = results.get(f"loop-{mode}")
        if not run:
            continue
        if "error" in run:
            lines += [f"loop {mode}: {run['error']}", *run["log_tail"]]
            continue
        lines.append(f"loop {mode} ({run['seconds']} s): rollout " + " ".join(
            f"{p:>11}" for p in ("total", *PHASES)) + "   export  actor out/in")
        for i, row in enumerate(run["rows"]):
            lines.append(f"  {i:>17} " + " ".join(f"{row[p]:11.2f}" for p in ("total", *PHASES))
                         + f" {row.get('weight_sync/export_s', 0):8.2f}"
                         + f"  {row.get('offload/actor_out_s', 0):.2f}/"
                         f"{row.get('offload/actor_in_s', 0):.2f}")
    s = results.get("sync")
    if s:
        lines.append(f"sync floor: {s['gb']:.2f} GB, load_weights from device memory "
                     f"{s['load_weights_gb_s']:.1f} GB/s, inside a reload round "
                     f"{s['reload_round_gb_s']:.1f} GB/s")
    for mode in MODES:
        rows = (results.get(f"loop-{mode}") or {}).get("rows", [])[1:]  # the steady rollouts
        pushes = [r["weight_sync/bytes"] / r["weight_sync"] / 1e9 for r in rows
                  if r.get("weight_sync") and r.get("weight_sync/bytes")]
        if pushes:
            floor = f" (floor above: {s['load_weights_gb_s']:.1f})" if s else ""
            lines.append(f"weight sync {mode}: {min(pushes):.1f}-{max(pushes):.1f} GB/s{floor}")
        copies = [r["offload/actor_gb"] / r["offload/actor_out_s"] for r in rows
                  if r.get("offload/actor_out_s")]
        if copies:
            lines.append(f"actor offload {mode}: {min(copies):.1f}-{max(copies):.1f} GB/s of the "
                         "device bytes it held (gradients among them, freed not copied)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default="copies,loop,sync")
    parser.add_argument("--modes", default="resident,offload")
    parser.add_argument("--rollouts", type=int, default=3)
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--pieces", type=int, default=200,
                        help="storages per fp32 optimizer state in the copies part")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--params", type=int,
                        help="the copies part's parameter count (default: the slice's)")
    parser.add_argument("--loop-limit-s", type=int, default=540)
    parser.add_argument("--out", default="build/step-breakdown")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    results: dict = {"spec": str(SPEC.relative_to(ROOT)), "parts": parts}
    if "loop" in parts or "sync" in parts:
        ensure_model()
    if "copies" in parts:
        results["copies"] = copies(args.params or slice_params(), args.pieces, args.repeats)
        print("copies", json.dumps(results["copies"]), flush=True)
    if "loop" in parts:
        for mode in args.modes.split(","):
            results[f"loop-{mode}"] = loop(mode, args.rollouts, args.sets, out, args.loop_limit_s)
            print(f"loop-{mode}", json.dumps(results[f"loop-{mode}"]), flush=True)
    if "sync" in parts:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        results["sync"] = sync_floor(args.repeats, 0.4)
        print("sync", json.dumps(results["sync"]), flush=True)
    (out / "step-breakdown.json").write_text(json.dumps(results, indent=1))
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
