"""On a GPU: training tokens/s of vime's Megatron backend (runtime/backends/megatron_train.py,
train_step with the GRPO loss) against a plain megatron-core loop on the same model and batch
(benchmarks/gpu/megatron_memory.py's step: forward, fp32 log-softmax, gather, backward,
optimizer step). Qwen3-30B-A3B layer shapes, `--layers` layers, one sequence of `--tokens`.

    python benchmarks/gpu/megatron_backend_speed.py --layers 2 --tokens 8192 --out $OUT/speed.json

With `--rounds N` the two loops alternate N times in one process (`--repeats` steps each per
round) and the ratio of each round is kept: the plain loop's own speed varied by ±15% between
separate calls, so one call of each says little. `--profile DIR` writes the CUDA kernel
time table of one step of each (torch.profiler) to DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import one_gpu
import torch

from runtime.backends.megatron_train import MegatronTrainingBackend
from runtime.core import fused_head
from runtime.core.interfaces import TrainBatch
from vime.resolve.model import PRESETS


def timed(step, repeats: int, warm_up: bool = True) -> float:
    if warm_up:
        step()  # allocations, Adam state
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--profile", help="a folder for the kernel tables of one step of each")
    parser.add_argument("--eager-head", action="store_true",
                        help="each round also times the backend with VIME_LOSS_HEAD=eager (the "
                        "loss head's chunks without runtime/core/fused_head.py's kernels)")
    parser.add_argument("--impl", default="local", choices=("local", "transformer_engine"),
                        help="the layer spec (train.transformer_impl) of both loops' model")
    args = parser.parse_args()
    arch = {**PRESETS["qwen3-30b-a3b"], "num_hidden_layers": args.layers,
            "max_position_embeddings": max(args.tokens, 4096)}
    backend = MegatronTrainingBackend()
    backend.init(one_gpu.train_slice(arch, args.tokens, transformer_impl=args.impl))
    vocab = arch["vocab_size"]
    tokens = torch.randint(0, vocab, (args.tokens,)).tolist()
    response = args.tokens - 1
    batch = TrainBatch(tokens=[tokens], prompt_lens=[1], advantages=[0.5],
                       old_log_probs=[[-2.0] * response], step_response_tokens=response)

    def backend_step():
        backend.train_step(batch)

    # the plain megatron-core loop on the same module, optimizer and tokens
    ids = torch.tensor([tokens], device="cuda")
    targets = torch.roll(ids, -1, dims=1)
    positions = torch.arange(args.tokens, device="cuda").unsqueeze(0)
    advantages = torch.full((1, args.tokens), 0.5, device="cuda")

    def plain_step():
        backend.model.zero_grad_buffer()
        backend.optimizer.zero_grad()
        logits = backend.model(ids, positions, None)
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        (-(logp * advantages).mean()).backward()
        backend.model.finish_grad_sync()
        backend.optimizer.step()

    def eager_step():
        os.environ["VIME_LOSS_HEAD"] = "eager"
        try:
            backend.train_step(batch)
        finally:
            os.environ.pop("VIME_LOSS_HEAD")

    backend_step(), plain_step()  # warm-up
    if args.eager_head:
        eager_step()
    pairs, eager = [], []
    for _ in range(args.rounds):
        pairs.append((timed(backend_step, args.repeats, False),
                      timed(plain_step, args.repeats, False)))
        if args.eager_head:
            eager.append(timed(eager_step, args.repeats, False))
    backend_s = statistics.median(b for b, _ in pairs)
    plain_s = statistics.median(p for _, p in pairs)
    ratios = [p / b for b, p in pairs]
    result = {"layers": args.layers, "tokens": args.tokens, "device": torch.cuda.get_device_name(),
              "impl": backend.impl,
              "repeats": args.repeats, "rounds": args.rounds,
              "backend_step_s": backend_s, "plain_step_s": plain_s,
              "backend_tokens_per_s": args.tokens / backend_s,
              "plain_tokens_per_s": args.tokens / plain_s,
              "ratio": statistics.median(ratios), "ratio_per_round": ratios,
              "fused_head": fused_head.usable(torch.zeros(1, device="cuda")),
              "adam": sorted({"fused" if g.get("fused") else "foreach"
                              for inner in backend._torch_adams() for g in inner.param_groups})}
    if eager:
        eager_ratios = [p / e for (_, p), e in zip(pairs, eager, strict=True)]
        result.update(eager_step_s=statistics.median(eager),
                      eager_tokens_per_s=args.tokens / statistics.median(eager),
                      eager_ratio=statistics.median(eager_ratios),
                      eager_ratio_per_round=eager_ratios)
    if args.profile:
        from pathlib import Path

        from torch.profiler import ProfilerActivity, profile

        folder = Path(args.profile)
        folder.mkdir(parents=True, exist_ok=True)
        for name, step in (("backend", backend_step), ("plain", plain_step)):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            (folder / f"{name}_kernels.txt").write_text(prof.key_averages().table(
                sort_by="cuda_time_total", row_limit=40))
            # the host side: where Python spends a step (the step is launch-bound when the
            # GPU time of the two loops agrees and their wall time does not)
            import cProfile
            import io
            import pstats

            host = cProfile.Profile()
            host.enable()
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            host.disable()
            text = io.StringIO()
            pstats.Stats(host, stream=text).sort_stats("cumulative").print_stats(45)
            (folder / f"{name}_host.txt").write_text(text.getvalue())
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
