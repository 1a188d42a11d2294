"""The memory of vime's own Megatron backend step on a grid of shapes, one
H200, for benchmarks/memory_validation.py --grid to set against vime's plan.

Each case runs in a child process of its own (a timeout, an OOM or an error is recorded and
the grid goes on): runtime/backends/megatron_train.py's backend built from a TrainSlice of the
case (tp = ep = 1, distributed optimizer, GPU Adam), then what a rollout asks of it: the
log-probs of one sequence of `tokens` tokens, and two GRPO train_steps on it (the second with
Adam's state). Recorded: the memory resident after the build, the peaks of allocated and
reserved memory (over the whole process and from the end of the build), the device's used
memory after the steps (total − free: what is outside torch's allocator too), some of
torch.cuda.memory_stats(), the step times and the experts the backend chose (its `vime: MoE
experts:` line; VIME_MOE_EXPERTS is the case's, auto unless it says sequential). One JSON line
per case is appended to --out, holding the case's whole definition.

    python benchmarks/gpu/backend_memory_grid.py --out $OUT/backend-grid.jsonl   # one H200
    python benchmarks/gpu/backend_memory_grid.py --list
    python benchmarks/gpu/backend_memory_grid.py --dry-run    # on the CPU: every case plans

The weights are megatron-core's own random initialisation on the GPU, not the backend's
random_init path (which builds the HF model in fp32 on the host and copies it in: tens of
seconds per case, and no memory of the step); --load-weights takes that path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from vime.resolve.model import PRESETS  # noqa: E402

QWEN3_30B = PRESETS["qwen3-30b-a3b"]
QWEN3_4B = PRESETS["qwen3-4b"]


def _moe(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, experts: int, topk: int,
         vocab: int = 151936) -> dict:
    return {**QWEN3_30B, "num_hidden_layers": layers, "hidden_size": hidden,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "intermediate_size": 3 * ffn, "moe_intermediate_size": ffn, "num_experts": experts,
            "num_experts_per_tok": topk, "vocab_size": vocab}


SHAPES = {
    "h1024-e32-k4": _moe(8, 1024, 8, 4, 512, 32, 4),
    "h2048-e64-k8": _moe(8, 2048, 16, 4, 768, 64, 8),
    "h4096-e16-k2": _moe(4, 4096, 32, 4, 1536, 16, 2),
    "h1024-e32-k4-v32k": _moe(8, 1024, 8, 4, 512, 32, 4, vocab=32768),
    "dense-4b-l4": {**QWEN3_4B, "num_hidden_layers": 4},
    "30b-a3b-l4": {**QWEN3_30B, "num_hidden_layers": 4},
    "30b-a3b-l8": {**QWEN3_30B, "num_hidden_layers": 8},
}

# (shape, tokens, recompute): every shape and the two cases at the GPU's edge (vime: 128 of
# 139.8 GiB "tight", and 139.9: OOM) early, so that a grid cut short by --budget-s has them
GRID = [
    ("h1024-e32-k4", 8192, "none"),
    ("h2048-e64-k8", 16384, "selective"),
    ("dense-4b-l4", 8192, "none"),
    ("h4096-e16-k2", 16384, "full"),
    ("30b-a3b-l4", 16384, "none"),
    ("30b-a3b-l8", 24576, "selective"),
    ("30b-a3b-l8", 16384, "full"),
    ("h1024-e32-k4-v32k", 32768, "full"),
    ("h2048-e64-k8", 4096, "none"),
    ("dense-4b-l4", 32768, "selective"),
    ("h1024-e32-k4", 32768, "selective"),
    ("h4096-e16-k2", 24576, "selective"),
]


def cases() -> dict[str, dict]:
    out = {}
    for shape, tokens, recompute in GRID:
        name = f"{shape}-t{tokens // 1024}k-{recompute}"
        arch = dict(SHAPES[shape])
        out[name] = {"name": name, "shape": shape, "arch": arch, "tokens": tokens,
                     "recompute": recompute,
                     "experts": "auto" if arch.get("num_experts") else None}
    return out


# ------------------------------------------------------------------------------ the child

GiB = 1024 ** 3
STATS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
         "allocated_bytes.all.peak", "reserved_bytes.all.peak", "active_bytes.all.peak",
         "inactive_split_bytes.all.peak", "requested_bytes.all.peak")


def _memory(torch) -> dict:
    free, total = torch.cuda.mem_get_info()
    stats = torch.cuda.memory_stats()
    return {"allocated_gib": torch.cuda.memory_allocated() / GiB,
            "reserved_gib": torch.cuda.memory_reserved() / GiB,
            "max_allocated_gib": torch.cuda.max_memory_allocated() / GiB,
            "max_reserved_gib": torch.cuda.max_memory_reserved() / GiB,
            "device_used_gib": (total - free) / GiB, "device_total_gib": total / GiB,
            "stats": {k: stats.get(k) for k in STATS}}


def run_case(case: dict, load_weights: bool) -> dict:
    """The case in this process: what the result line's "result" holds."""
    import one_gpu
    import torch

    from runtime.backends.megatron_train import MegatronTrainingBackend
    from runtime.core import loss_head
    from runtime.core.interfaces import TrainBatch

    class Backend(MegatronTrainingBackend):
        def _load_initial_weights(self, model) -> None:
            if load_weights:
                super()._load_initial_weights(model)

    tokens, arch = case["tokens"], case["arch"]
    train_slice = one_gpu.train_slice(arch, tokens, case["recompute"])

    # how the loss head's backward ran (benchmarks/memory_validation.py plans the same)
    out: dict = {"phase": "build", "loss_head_backward": "by-columns"
                 if hasattr(loss_head, "PLAIN_WEIGHT_GRAD_BYTES") else "by-tokens"}
    try:  # whether the head's element-wise work ran in runtime/core/fused_head.py's kernels
        from runtime.core import fused_head

        out["loss_head_kernels"] = "triton" if fused_head.usable(torch.zeros(1).cuda()) \
            else "eager"
    except ImportError:
        out["loss_head_kernels"] = "eager"
    started = time.perf_counter()
    try:
        backend = Backend()
        backend.init(train_slice)
        torch.cuda.synchronize()
        out["build_s"] = time.perf_counter() - started
        out["after_build"] = _memory(torch)
        torch.cuda.reset_peak_memory_stats()
        # one sample of `tokens` tokens, a one-token prompt: the micro-batch is max_tokens_per_gpu
        ids = torch.randint(0, arch["vocab_size"], (tokens,)).tolist()
        out["phase"] = "log_probs"
        start = time.perf_counter()
        old = backend.log_probs(TrainBatch(tokens=[ids], prompt_lens=[1]))
        torch.cuda.synchronize()
        out["log_probs_s"] = time.perf_counter() - start
        out["after_log_probs"] = _memory(torch)
        batch = TrainBatch(tokens=[ids], prompt_lens=[1], advantages=[0.5], old_log_probs=old,
                           step_response_tokens=tokens - 1)
        out["step_s"] = []
        for step in (1, 2):
            out["phase"] = f"train_step {step}"
            start = time.perf_counter()
            stats = backend.train_step(batch)
            torch.cuda.synchronize()
            out["step_s"].append(time.perf_counter() - start)
            out[f"after_step{step}"] = _memory(torch)
        out["grad_norm"] = stats.get("step/grad_norm")
    except torch.OutOfMemoryError as err:
        out.update(oom=True, message=str(err)[:2000], at_oom=_memory(torch))
        return out
    build = out["after_build"]
    end = out["after_step2"]
    out.update(ok=True, phase="done",
               # the process's peaks (the build's own peak is in after_build)
               peak_allocated_gib=max(build["max_allocated_gib"], end["max_allocated_gib"]),
               peak_reserved_gib=max(build["max_reserved_gib"], end["max_reserved_gib"]),
               step_peak_allocated_gib=end["max_allocated_gib"],
               step_peak_reserved_gib=end["max_reserved_gib"],
               device_used_gib=end["device_used_gib"],
               outside_torch_gib=end["device_used_gib"] - end["reserved_gib"],
               resident_gib=build["allocated_gib"])
    return out


def child(name: str, result_file: Path, load_weights: bool) -> None:
    result = run_case(cases()[name], load_weights)
    result_file.write_text(json.dumps(result))


# ----------------------------------------------------------------------------- the parent

def run_grid(names: list[str], out: Path, timeout_s: float, budget_s: float,
             load_weights: bool) -> None:
    grid = cases()
    started = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        elapsed = time.perf_counter() - started
        if elapsed > budget_s:
            print(f"budget: {elapsed:.0f} s > {budget_s:.0f} s, not starting {name}", flush=True)
            record = {**grid[name], "result": {"skipped": "budget"}}
            with out.open("a") as fh:
                fh.write(json.dumps(record) + "\n")
            continue
        case = grid[name]
        result_file = out.with_name(f"{out.stem}.{name}.json")
        result_file.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if case["experts"]:
            env["VIME_MOE_EXPERTS"] = case["experts"]
        command = [sys.executable, __file__, "--child", name, "--out", str(result_file)] + \
            (["--load-weights"] if load_weights else [])
        start = time.perf_counter()
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True,
                                  timeout=timeout_s)
            stdout, stderr, rc = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as err:  # run() kills the child before raising
            stdout, stderr, rc = (err.stdout or b"", err.stderr or b"", None)
            stdout = stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout
            stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
        wall = time.perf_counter() - start
        result = json.loads(result_file.read_text()) if result_file.is_file() else {}
        if rc is None:
            result.update(timeout=True)
        elif rc and not result.get("oom"):
            result.update(error=stderr[-3000:], rc=rc)
        vime_lines = [line for line in stdout.splitlines() if line.startswith("vime:")]
        chosen = [line for line in vime_lines if line.startswith("vime: MoE experts:")]
        if chosen:
            result["experts_chosen"] = ("grouped" if "GroupedMLP" in chosen[0]
                                        else "sequential")
        result.update(process_s=wall, rc=rc, vime_log=vime_lines)
        with out.open("a") as fh:
            fh.write(json.dumps({**case, "result": result}) + "\n")
        verdict = ("ok" if result.get("ok") else "OOM" if result.get("oom")
                   else "timeout" if result.get("timeout") else f"error rc {rc}")
        peak = (f"allocated {result['peak_allocated_gib']:.1f} GiB, reserved "
                f"{result['peak_reserved_gib']:.1f} GiB, device {result['device_used_gib']:.1f}"
                f" GiB" if result.get("ok") else "")
        print(f"{name}: {verdict} in {wall:.0f} s {peak}", flush=True)


def dry_run(names: list[str]) -> None:
    """On the CPU: every case's architecture reads, and vime plans it (the same prediction
    memory_validation.py --grid makes), printed as a table."""
    from memory_validation import predict_grid

    from vime.resolve.model import arch_from_config

    print("| case | params B | tokens | recompute | vime allocated | vime reserved "
          "| vime total | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        case = cases()[name]
        arch_from_config(case["arch"])
        p = predict_grid(case)
        params = p["terms"]["weights"] / 2 * GiB / 1e9
        print(f"| {name} | {params:.2f} | {case['tokens']} | {case['recompute']} | "
              f"{p['allocated']:.1f} GiB | {p['reserved']:.1f} GiB | {p['total']:.1f} GiB "
              f"of {p['gpu']:.1f} | {p['verdict']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the JSONL file the cases' lines are appended to")
    parser.add_argument("--cases", help="comma list of case names (default: the whole grid)")
    parser.add_argument("--list", action="store_true", help="print the grid and stop")
    parser.add_argument("--dry-run", action="store_true",
                        help="on the CPU: validate and plan every case, build nothing")
    parser.add_argument("--timeout-s", type=float, default=75.0, help="per case")
    parser.add_argument("--budget-s", type=float, default=270.0,
                        help="no new case starts after this many seconds of the grid")
    parser.add_argument("--load-weights", action="store_true",
                        help="the backend's random_init weights (HF model built on the host)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, Path(args.out), args.load_weights)
        return
    grid = cases()
    names = args.cases.split(",") if args.cases else list(grid)
    unknown = [n for n in names if n not in grid]
    if unknown:
        parser.error(f"unknown cases {unknown}; --list prints the grid")
    if args.list:
        for name in names:
            case = grid[name]
            arch = case["arch"]
            print(f"{name}: layers {arch['num_hidden_layers']}, hidden {arch['hidden_size']}, "
                  f"experts {arch.get('num_experts', 0)} top-{arch.get('num_experts_per_tok', 0)}"
                  f", vocab {arch['vocab_size']}, tokens {case['tokens']}, "
                  f"recompute {case['recompute']}")
        return
    if args.dry_run:
        dry_run(names)
        return
    if not args.out:
        parser.error("--out is needed to run the grid")
    run_grid(names, Path(args.out), args.timeout_s, args.budget_s, args.load_weights)


if __name__ == "__main__":
    main()
