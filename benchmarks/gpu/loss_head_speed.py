"""On a GPU: the loss head alone, forward + backward, side by side in one process:

- `plain`: what a plain megatron-core loop does (logits = hidden @ W.T in bf16, an fp32
  log-softmax over the vocabulary, gather, backward);
- `eager`: runtime/core/loss_head.py's chunks with torch's element-wise kernels
  (VIME_LOSS_HEAD=eager);
- `fused`: the same chunks with runtime/core/fused_head.py's Triton kernels.

Per variant: the median time of `--repeats` forward + backward passes after a warm-up, the peak
of CUDA memory above the inputs, and against `plain` the largest differences of the log-probs
and of the two gradients. The loss is the GRPO shape's: sum of log-probs × a per-token weight,
with the entropy (detached, as a metric) unless --no-entropy.

    python benchmarks/gpu/loss_head_speed.py --tokens 16384 --out $OUT/head.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from runtime.core import fused_head, loss_head


def plain(hidden, weight, targets, entropy):
    log_p = torch.log_softmax((hidden @ weight.t()).float(), dim=-1)
    log_probs = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if entropy:
        with torch.no_grad():
            metric = -(log_p.exp() * log_p).sum(-1)
        del metric
    return log_probs


def chunked(hidden, weight, targets, entropy):
    log_probs, metric = loss_head.token_terms(hidden, weight, targets, entropy=entropy)
    if metric is not None:
        metric.detach()
    return log_probs


def run(variant, fn, inputs, weights, repeats, entropy):
    os.environ["VIME_LOSS_HEAD"] = "eager" if variant == "eager" else ""
    hidden, weight, targets = inputs
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()

    def once():
        h.grad = w.grad = None
        log_probs = fn(h, w, targets, entropy)
        (log_probs * weights).sum().backward()
        return log_probs

    once()  # warm-up: kernels built, allocations
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        log_probs = once()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() - base
    return {"median_s": statistics.median(times), "times_s": times,
            "peak_above_inputs_gib": peak / 2**30,
            "fused_ran": variant == "fused" and fused_head.usable(h)}, (
        log_probs.detach().float(), h.grad.float(), w.grad.float())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="the variants alternate")
    parser.add_argument("--no-entropy", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    inputs = (torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16),
              torch.randn(args.vocab, args.hidden, device="cuda", dtype=torch.bfloat16) * 0.02,
              torch.randint(0, args.vocab, (args.tokens,), device="cuda"))
    weights = torch.linspace(-1.0, 1.0, args.tokens, device="cuda")
    entropy = not args.no_entropy
    variants = {"plain": plain, "eager": chunked, "fused": chunked}
    rounds, outputs = [], {}
    for _ in range(args.rounds):
        this = {}
        for name, fn in variants.items():
            this[name], outputs[name] = run(name, fn, inputs, weights, args.repeats, entropy)
            torch.cuda.empty_cache()
        rounds.append(this)
        print({k: round(v["median_s"] * 1e3, 2) for k, v in this.items()}, flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": getattr(fused_head.triton, "__version__", None),
              "tokens": args.tokens, "hidden": args.hidden, "vocab": args.vocab,
              "entropy_metric": entropy, "repeats": args.repeats, "rounds": rounds}
    for name in variants:
        result[f"{name}_ms"] = statistics.median(r[name]["median_s"] for r in rounds) * 1e3
        result[f"{name}_peak_gib"] = max(r[name]["peak_above_inputs_gib"] for r in rounds)
    result["fused_ran"] = rounds[-1]["fused"]["fused_ran"]
    for name in ("eager", "fused"):
        result[f"{name}_vs_plain"] = {
            what: float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)
            for what, a, b in zip(("log_probs", "grad_hidden", "grad_weight"), outputs[name],
                                  outputs["plain"], strict=True)}
    result["fused_vs_eager"] = {
        what: float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)
        for what, a, b in zip(("log_probs", "grad_hidden", "grad_weight"), outputs["fused"],
                              outputs["eager"], strict=True)}
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
