"""The MoE experts as grouped GEMMs (runtime/megatron/grouped_experts.py's
GroupedMLP) against megatron-core's SequentialMLP, before and after, on one GPU.

Two parts, one JSON:

- `experts`: one Qwen3-30B-A3B MoE layer's experts alone (hidden 2048, ffn 768, gate+up, SiLU,
  down) on `--tokens` tokens × top-8 routed rows (random balanced routes), forward + backward
  in bf16, for 128 local experts (ep 1) and 16 (ep 8): median time, the expert GEMMs' TFLOP/s
  (18·rows·hidden·ffn FLOPs), and the same with the experts held as stacked [E, out, in]
  parameters (`stacked_reference`, torch's own autograd of `_grouped_mm`: the floor of the
  stack-per-call design) and the stack copy alone. Plus the GPU check of GroupedMLP's numbers:
  output and gradients (tokens, probs, every expert weight) of GroupedMLP against
  SequentialMLP on the same weights and tokens, relative gaps, bf16 tolerance.
- `step`: the 4-layer (`--layers`) Qwen3-30B-A3B slice at `--tokens` tokens through vime's
  Megatron backend's `train_step` (as benchmarks/gpu/megatron_backend_speed.py), once with
  VIME_MOE_EXPERTS=sequential and once with grouped, each in its own process (a backend of the
  slice holds ~55 GB), alternating `--alternations` times: tokens/s, the step's wall time
  against its GPU kernel time (torch.profiler, one step: host-bound when the kernels take much
  less than the wall), and the `_grouped_mm` kernels' share and TFLOP/s within the step.

    python benchmarks/gpu/grouped_experts_bench.py --out $OUT/grouped.json          # one H200
    python benchmarks/gpu/grouped_experts_bench.py --tiny --out /tmp/grouped.json   # CPU dry run
    python benchmarks/gpu/grouped_experts_bench.py --parts experts --tokens 2048 \
        --local-experts 16 --repeats 3 --out /tmp/grouped-cpu.json   # real shapes, on a CPU

`--tiny` (on the CPU: no GPU is needed) runs both parts at a toy size; the backend is CUDA and
NCCL only, so its step part there is the plain megatron-core loop on the model the backend
builds (runtime/megatron/model.py), forward + log-softmax + backward, no optimizer. The CPU's
numbers say nothing of the GPU's; they check the script and give the CPU's own ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TINY_ARCH = {
    "model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
    "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 8,
    "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "tie_word_embeddings": False, "max_position_embeddings": 4096, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6, "norm_topk_prob": True,
}


def _device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _world_of_one() -> None:
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                                             world_size=1, rank=0)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    if not torch.cuda.is_available():  # megatron's rotary embedding asks for it
        torch.cuda.current_device = lambda: "cpu"


def _arch(tiny: bool, layers: int, tokens: int) -> dict:
    from vime.resolve.model import PRESETS

    if tiny:
        return {**TINY_ARCH, "num_hidden_layers": layers}
    return {**PRESETS["qwen3-30b-a3b"], "num_hidden_layers": layers,
            "max_position_embeddings": max(tokens, 4096)}


def _timed(step, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        _sync()
        start = time.perf_counter()
        step()
        _sync()
        times.append(time.perf_counter() - start)
    return times


def _gap(a, b) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) if b.numel() else 0.0


# ------------------------------------------------------------------------------ experts part

def experts_part(arch_config: dict, tokens: int, local_counts: list[int], repeats: int) -> dict:
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import SequentialMLP
    from megatron.core.transformer.moe.moe_utils import get_default_pg_collection

    from runtime.megatron.grouped_experts import GroupedMLP
    from runtime.megatron.model import transformer_config
    from vime.resolve.model import arch_from_config

    _world_of_one()
    device = _device()
    arch = arch_from_config(arch_config)
    config = transformer_config(arch, use_cpu_initialization=True,
                                moe_token_dispatcher_type="allgather", variable_seq_lengths=False)
    h, f, topk = arch.hidden_size, arch.moe_ffn_hidden_size, arch.topk
    out = {"hidden": h, "ffn": f, "topk": topk, "tokens": tokens, "cases": []}
    for experts in local_counts:
        rows = tokens * topk * experts // arch.num_experts  # this rank's share of the routes
        generator = torch.Generator().manual_seed(0)
        routes = torch.randint(0, experts, (rows,), generator=generator)
        counts = torch.bincount(routes, minlength=experts)
        hidden = torch.randn(rows, h, generator=generator).to(device, torch.bfloat16)
        probs = torch.rand(rows, generator=generator).to(device)
        grad_out = torch.randn(rows, h, generator=generator).to(device, torch.bfloat16)
        modules = {}
        for name, cls in (("sequential", SequentialMLP), ("grouped", GroupedMLP)):
            torch.manual_seed(1)
            modules[name] = cls(experts, config, MLPSubmodules(
                linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
                pg_collection=get_default_pg_collection()).to(device)
        modules["grouped"].load_state_dict(modules["sequential"].state_dict())
        flops = 18 * rows * h * f  # fc1 (2f wide) + fc2, forward and two backward GEMMs each
        case = {"local_experts": experts, "rows": rows, "empty_experts": int((counts == 0).sum()),
                "gemm_tflop": flops / 1e12}
        results = {}
        for name, module in modules.items():
            x = hidden.clone().requires_grad_(True)
            p = probs.clone().requires_grad_(True)

            def step(module=module, x=x, p=p, counts=counts, grad_out=grad_out):
                module.zero_grad(set_to_none=True)
                y, _ = module(x, counts, p)
                y.backward(grad_out)
                return y

            y = step()  # warm-up, and the gradients compared below
            results[name] = (y.detach(), x.grad.clone(), p.grad.clone(),
                             {n: q.grad.clone() for n, q in module.named_parameters()})
            x.grad = p.grad = None
            times = _timed(step, repeats)
            case[name] = {"median_s": statistics.median(times), "min_s": min(times),
                          "tflops": flops / statistics.median(times) / 1e12}
        case["speedup"] = case["sequential"]["median_s"] / case["grouped"]["median_s"]
        (ys, xs, ps, ws), (yg, xg, pg, wg) = results["sequential"], results["grouped"]
        case["gaps"] = {"output": _gap(yg, ys), "tokens_grad": _gap(xg, xs),
                        "probs_grad": _gap(pg, ps),
                        "weight_grad_max": max(_gap(wg[n], ws[n]) for n in ws)}
        case["gaps_within_bf16"] = max(case["gaps"].values()) <= 2 ** -6
        case.update(_stacked_reference(modules["grouped"], hidden, counts, probs, grad_out,
                                       config, repeats, flops))
        out["cases"].append(case)
        del modules, results
    return out


def _stacked_reference(grouped, hidden, counts, probs, grad_out, config, repeats, flops) -> dict:
    """The same experts with their weights held as two stacked parameters, torch's own autograd
    of _grouped_mm (no copy per call), and the two stacks of our design alone."""
    import torch.nn.functional as F

    w1 = torch.nn.Parameter(torch.stack([e.linear_fc1.weight.detach()
                                         for e in grouped.local_experts]))
    w2 = torch.nn.Parameter(torch.stack([e.linear_fc2.weight.detach()
                                         for e in grouped.local_experts]))
    offs = torch.cumsum(counts.to(hidden.device), 0, dtype=torch.int32)
    x = hidden.clone().requires_grad_(True)

    def step():
        w1.grad = w2.grad = x.grad = None
        fc1 = torch._grouped_mm(x, w1.transpose(1, 2), offs=offs)
        gate, up = fc1.chunk(2, dim=-1)
        act = (F.silu(gate) * up * probs.unsqueeze(-1)).to(fc1.dtype)
        torch._grouped_mm(act, w2.transpose(1, 2), offs=offs).backward(grad_out)

    step()
    times = _timed(step, repeats)
    weights = [e.linear_fc1.weight for e in grouped.local_experts]
    weights2 = [e.linear_fc2.weight for e in grouped.local_experts]

    def stacks():  # forward stacks both, backward both again
        for _ in range(2):
            torch.stack(weights), torch.stack(weights2)

    stacks()
    stack_times = _timed(stacks, repeats)
    return {"stacked_reference": {"median_s": statistics.median(times),
                                  "tflops": flops / statistics.median(times) / 1e12},
            "stack_copies_s": statistics.median(stack_times),
            "stacked_weight_bytes": sum(w.numel() * w.element_size() for w in weights + weights2)}


# --------------------------------------------------------------------------------- step part

def step_child(args) -> dict:
    """One experts kind (VIME_MOE_EXPERTS, set by the parent): the step's speed."""
    from runtime.megatron.grouped_experts import GroupedMLP

    arch = _arch(args.tiny, args.layers, args.tokens)
    if torch.cuda.is_available():
        step, gpt = _backend_step(arch, args.tokens, args.impl)
    else:
        step, gpt = _plain_cpu_step(arch, args.tokens)
    kinds = sorted({type(m).__name__ for m in gpt.modules()
                    if type(m).__name__ in EXPERT_MODULES})
    step()  # warm-up: allocations, Adam state
    times = _timed(step, args.repeats)
    median = statistics.median(times)
    result = {"experts": os.environ.get("VIME_MOE_EXPERTS"), "impl": args.impl, "modules": kinds,
              "grouped": kinds == [GroupedMLP.__name__], "layers": args.layers,
              "tokens": args.tokens, "step_s": times, "median_step_s": median,
              "tokens_per_s": args.tokens / median}
    result.update(_profiled(step, arch, args.tokens))
    return result


EXPERT_MODULES = ("SequentialMLP", "GroupedMLP", "TEGroupedMLP")


def _backend_step(arch: dict, tokens: int, impl: str = "local"):
    import one_gpu

    from runtime.backends.megatron_train import MegatronTrainingBackend
    from runtime.core.interfaces import TrainBatch

    backend = MegatronTrainingBackend()
    backend.init(one_gpu.train_slice(arch, tokens, transformer_impl=impl))
    ids = torch.randint(0, arch["vocab_size"], (tokens,)).tolist()
    batch = TrainBatch(tokens=[ids], prompt_lens=[1], advantages=[0.5],
                       old_log_probs=[[-2.0] * (tokens - 1)], step_response_tokens=tokens - 1)
    return (lambda: backend.train_step(batch)), backend.gpt


def _plain_cpu_step(arch_config: dict, tokens: int):
    from runtime.megatron.model import build_gpt, transformer_config
    from vime.resolve.model import arch_from_config

    _world_of_one()
    arch = arch_from_config(arch_config)
    config = transformer_config(arch, use_cpu_initialization=True,
                                moe_token_dispatcher_type="allgather", variable_seq_lengths=False)
    torch.manual_seed(0)
    gpt = build_gpt(arch, config, arch.max_position_embeddings)
    ids = torch.randint(0, arch.vocab_size, (1, tokens))
    positions = torch.arange(tokens).unsqueeze(0)
    targets = torch.roll(ids, -1, dims=1)

    def step():
        gpt.zero_grad(set_to_none=True)
        logits = gpt(ids, positions, None)
        logp = torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1))
        (-logp.mean()).backward()

    return step, gpt


def _profiled(step, arch_config: dict, tokens: int) -> dict:
    """One step under torch.profiler: its wall time, the kernels' total time, the grouped
    GEMMs' time and their TFLOP/s (every MoE layer's expert GEMMs are _grouped_mm's)."""
    from torch.profiler import ProfilerActivity, profile

    from vime.resolve.model import arch_from_config

    arch = arch_from_config(arch_config)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if torch.cuda.is_available() else [])
    _sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        step()
        _sync()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    # the kernels themselves (as torch.profiler's table totals them: device events only)
    device_us = sum(e.self_device_time_total for e in events
                    if e.device_type == torch.autograd.DeviceType.CUDA
                    and not e.is_user_annotation)
    grouped = [e for e in events if e.key == "aten::_grouped_mm"]
    grouped_us = sum(e.device_time_total for e in grouped)  # its kernels, under the op
    grouped_host_us = sum(e.cpu_time_total for e in grouped)
    flops = 18 * tokens * arch.topk * arch.hidden_size * arch.moe_ffn_hidden_size \
        * arch.num_moe_layers
    return {"profiled_wall_s": wall, "gpu_kernel_s": device_us / 1e6,
            "gpu_busy_share": device_us / 1e6 / wall,
            "grouped_mm_calls": sum(e.count for e in grouped),
            "grouped_mm_gpu_s": grouped_us / 1e6, "grouped_mm_host_s": grouped_host_us / 1e6,
            "expert_gemm_tflop": flops / 1e12,
            "expert_gemm_tflops_in_step": (flops / (grouped_us / 1e6) / 1e12) if grouped_us
            else None}


def step_part(args) -> dict:
    """The step of each experts kind in its own process, alternating: SequentialMLP and
    GroupedMLP under the local spec, then Transformer Engine's spec (TEGroupedMLP, TE
    attention and norms) where transformer_engine imports. The speedup is grouped over
    sequential; te's tokens/s stands beside them."""
    from runtime.megatron.model import choose_transformer_impl

    runs = []
    kinds = args.kinds.split(",") if args.kinds else ["sequential", "grouped"]
    if not args.kinds and choose_transformer_impl("auto")[0] == "transformer_engine":
        kinds.append("te")
    for _ in range(args.alternations):
        for kind in kinds:
            result_file = Path(args.out).with_suffix(f".{kind}.{len(runs)}.json")
            impl = "transformer_engine" if kind == "te" else "local"
            command = [sys.executable, __file__, "--child", "--out", str(result_file),
                       "--layers", str(args.layers), "--tokens", str(args.tokens),
                       "--repeats", str(args.repeats), "--impl", impl] \
                + (["--tiny"] if args.tiny else [])
            started = time.perf_counter()
            env = {**os.environ, "VIME_MOE_EXPERTS": kind} if kind != "te" else dict(os.environ)
            done = subprocess.run(command, env=env,
                                  capture_output=True, text=True)
            vime_lines = [line for line in done.stdout.splitlines() if line.startswith("vime:")]
            if done.returncode:
                runs.append({"experts": kind, "error": done.stderr[-3000:]})
                continue
            runs.append({**json.loads(result_file.read_text()), "vime_log": vime_lines,
                         "process_s": time.perf_counter() - started})
    out = {"runs": runs}
    ok = [r for r in runs if "error" not in r]
    for run in ok:
        run["kind"] = "te" if run.get("impl") == "transformer_engine" else run["experts"]
    by_kind = {k: [r["tokens_per_s"] for r in ok if r["kind"] == k] for k in kinds}
    out["tokens_per_s"] = {k: statistics.median(v) for k, v in by_kind.items() if v}
    if by_kind.get("sequential") and by_kind.get("grouped"):
        out["speedup"] = out["tokens_per_s"]["grouped"] / out["tokens_per_s"]["sequential"]
    if by_kind.get("sequential") and by_kind.get("te"):
        out["te_speedup"] = out["tokens_per_s"]["te"] / out["tokens_per_s"]["sequential"]
    return out


def main() -> None:
    warnings.simplefilter("ignore")
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiny", action="store_true", help="a toy size, for a CPU dry run")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--alternations", type=int, default=2)
    parser.add_argument("--parts", default="experts,step")
    parser.add_argument("--local-experts", help="comma list for the experts part (default: all "
                        "the experts, and an eighth of them: ep 1 and ep 8)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", default="local", help=argparse.SUPPRESS)  # the child's
    parser.add_argument("--kinds", help="comma list of the step part's kinds: sequential, "
                        "grouped, te (default: the first two, and te where TE imports)")
    args = parser.parse_args()
    if args.tokens is None:
        args.tokens = 256 if args.tiny else 16384
    if args.child:
        Path(args.out).write_text(json.dumps(step_child(args), indent=1))
        return
    arch = _arch(args.tiny, args.layers, args.tokens)
    result = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "tiny": args.tiny, "threads": torch.get_num_threads()}
    parts = args.parts.split(",")
    if "experts" in parts:
        local = ([int(n) for n in args.local_experts.split(",")] if args.local_experts
                 else [arch["num_experts"], arch["num_experts"] // 8])  # ep 1, ep 8
        result["experts"] = experts_part(arch, args.tokens, local, args.repeats)
    if "step" in parts:
        result["step"] = step_part(args)
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
