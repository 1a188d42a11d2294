"""Measure a real megatron-core training step of a Qwen3-MoE slice on one GPU.

Run on a GPU machine (torch with CUDA and megatron-core 0.19 installed):
    python benchmarks/gpu/megatron_memory.py --case 4:full:16384 --out measurements.jsonl

For each case: build GPTModel with Qwen3-30B-A3B's layer shapes and `layers` decoder layers
(random initialisation), wrap it in megatron-core's DDP with the distributed optimizer, and
run forward + backward + optimizer steps on `tokens` tokens whose loss is the GRPO shape
(fp32 log-softmax of the logits, gathered at the targets, times an advantage). Records peak
allocated and reserved memory of the last step and its tokens/s. vime's prediction for the
same spec is computed on the CPU side (benchmarks/memory_validation.py), so this script
needs nothing of vime.

The model comes from runtime/megatron/model.py (local layer spec, flash core attention);
run from the repository root so that `runtime` and `vime` import.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from runtime.megatron.model import build_gpt, transformer_config
from vime.resolve.model import PRESETS, arch_from_config


def qwen3_30b_slice(layers: int):
    """Qwen3-30B-A3B's published shapes with `layers` decoder layers."""
    return arch_from_config({**PRESETS["qwen3-30b-a3b"], "num_hidden_layers": layers})


def build(layers: int, recompute: str, seq_len: int):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module

    arch = qwen3_30b_slice(layers)
    config = transformer_config(arch, recompute)
    model = Float16Module(config, build_gpt(arch, config, seq_len).cuda())
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                               use_distributed_optimizer=True)
    model = DistributedDataParallel(config, ddp_config, model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-6, weight_decay=0.1, adam_beta1=0.9,
                        adam_beta2=0.98, bf16=True, params_dtype=torch.bfloat16,
                        use_distributed_optimizer=True), [model])
    return model, optimizer, sum(p.numel() for p in model.parameters())


def grpo_step(model, optimizer, tokens: int, vocab: int) -> dict:
    """One step; returns the peak allocated bytes of each phase (forward, backward, step)."""
    input_ids = torch.randint(0, vocab, (1, tokens), device="cuda")
    targets = torch.roll(input_ids, -1, dims=1)
    position_ids = torch.arange(tokens, device="cuda").unsqueeze(0)
    advantages = torch.randn(1, tokens, device="cuda")
    model.zero_grad_buffer()
    optimizer.zero_grad()
    peaks = {}
    torch.cuda.reset_peak_memory_stats()
    logits = model(input_ids, position_ids, None)  # [b, s, V] bf16
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    loss = -(logp * advantages).mean()
    peaks["forward"] = torch.cuda.max_memory_allocated()
    peaks["forward_reserved"] = torch.cuda.max_memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    del logits, logp, loss
    model.finish_grad_sync()
    peaks["backward"] = torch.cuda.max_memory_allocated()
    peaks["backward_reserved"] = torch.cuda.max_memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    optimizer.step()
    peaks["step"] = torch.cuda.max_memory_allocated()
    peaks["step_reserved"] = torch.cuda.max_memory_reserved()
    return peaks


def run_case(case: dict) -> dict:
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model_parallel_cuda_manual_seed(1234)
    model, optimizer, params = build(case["layers"], case["recompute"], case["tokens"])
    torch.cuda.synchronize()
    after_build = torch.cuda.memory_allocated()
    times = []
    for _ in range(case.get("steps", 3)):
        torch.cuda.synchronize()
        resident = torch.cuda.memory_allocated()
        start = time.perf_counter()
        peaks = grpo_step(model, optimizer, case["tokens"], PRESETS["qwen3-30b-a3b"]["vocab_size"])
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    result = dict(case, params=params, after_build_gib=after_build / 2**30,
                  resident_before_step_gib=resident / 2**30,
                  **{f"peak_{phase}_gib": value / 2**30 for phase, value in peaks.items()},
                  peak_allocated_gib=max(peaks[p] for p in ("forward", "backward", "step")) / 2**30,
                  peak_reserved_gib=max(peaks[p + "_reserved"] for p in ("forward", "backward", "step")) / 2**30,
                  resident_gib=torch.cuda.memory_allocated() / 2**30,
                  step_s=times[-1], tokens_per_s=case["tokens"] / times[-1])
    return result


def main() -> None:
    """One case per process (a fresh allocator each time); results are appended as JSON lines."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--case", required=True, help="layers:recompute:tokens, e.g. 4:full:16384")
    args = parser.parse_args()
    torch.distributed.init_process_group("nccl", init_method="tcp://127.0.0.1:29511",
                                         world_size=1, rank=0)
    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel(1, 1)
    layers, recompute, tokens = args.case.split(":")
    case = dict(layers=int(layers), recompute=recompute, tokens=int(tokens))
    try:
        result = run_case(case)
    except torch.OutOfMemoryError as err:
        result = dict(case, error=f"OOM: {str(err)[:300]}")
    result.update(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  total_gib=torch.cuda.get_device_properties(0).total_memory / 2**30)
    print(json.dumps(result), flush=True)
    with open(args.out, "a") as fh:
        fh.write(json.dumps(result) + "\n")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
