"""The loss head's peak memory on one GPU: the chunked log-probs and entropy of
runtime/core/loss_head.py against the whole-vocabulary fp32 log-softmax the training backends
computed before the chunked head, at 16k tokens of Qwen3's 151,936-entry vocabulary by default.

Run on a GPU machine from the repository root (torch with CUDA; nothing of megatron-core):

    python benchmarks/gpu/loss_head_memory.py --out $OUT/loss-head.jsonl
    python benchmarks/gpu/loss_head_memory.py --top-p 0.9 --out $OUT/loss-head.jsonl
    python benchmarks/gpu/loss_head_memory.py --entropy-coef 0.01 --out $OUT/loss-head.jsonl

Each run measures both heads, each in a fresh process, on the same inputs: bf16 final hidden
states [tokens, hidden] and a bf16 output weight [vocab, hidden] (a parameter), a forward and
backward of a GRPO-shaped loss (per-token weights on the log-probs, minus entropy_coef × the
entropy when it is in the loss; otherwise the entropy is a metric, as the backends log it).
"whole" is the whole-vocabulary computation the chunked head replaces, kept here for comparison: the logits
hidden @ W.T in bf16, their fp32 copy (as Megatron's Float16Module returned them), / T, one
log-softmax (or the nucleus of runtime/core/nucleus.py), the entropy metric in blocks of 2048
rows without gradients. "chunked" is runtime/core/loss_head.token_terms with its default chunk.

Recorded per head, one JSON line each: peak allocated and reserved bytes over the inputs'
(torch.cuda.max_memory_allocated / max_memory_reserved after reset_peak_memory_stats), in GiB
and as bytes per token per vocabulary entry, the seconds of the last of --steps steps, and
the largest difference of the log-probs and of the gradients from the whole head's (the
chunked run recomputes the whole head's numbers after its own measurement, so that the check
does not change its peak). The planner's figures for the same shape are printed alongside
(vime/plan/memory.py: chunk temporaries, the weight's gradient, per-token bytes).

On a machine without a GPU, --device cpu measures the same at a small size with the CPU
allocator's reports to torch's profiler (the CPU allocator keeps no peak; reserved is not
known there):

    python benchmarks/gpu/loss_head_memory.py --device cpu --tokens 1024 --vocab 8192 \\
        --hidden 256 --chunk-rows 128 --out /tmp/loss-head.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from runtime.core import loss_head, nucleus  # noqa: E402
from runtime.core.memprobe import peak_bytes  # noqa: E402

GiB = 1024**3


def inputs(args, device):
    generator = torch.Generator(device="cpu").manual_seed(args.seed)
    hidden = torch.randn(args.tokens, args.hidden, generator=generator)
    weight = torch.randn(args.vocab, args.hidden, generator=generator) * args.hidden ** -0.5
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=generator)
    hidden = hidden.to(device, torch.bfloat16).requires_grad_()
    weight = torch.nn.Parameter(weight.to(device, torch.bfloat16))
    weights = torch.linspace(-1.0, 2.0, args.tokens, device=device)
    return hidden, weight, targets.to(device), weights


def entropy_metric(log_p, rows: int = 2048):
    """The whole-vocabulary entropy metric (torch_train.entropy_metric before the chunked head)."""
    with torch.no_grad():
        return torch.cat([-(block.exp() * block).sum(dim=-1) for block in log_p.split(rows)])


def whole_head(hidden, weight, targets, temperature, top_p, entropy_in_loss):
    logits = (hidden @ weight.t()).float()  # Float16Module's fp32 copy of the bf16 logits
    if temperature != 1.0:
        logits = logits / temperature
    if top_p < 1.0:
        log_probs = nucleus.log_probs(logits, targets, top_p)
        log_p = torch.log_softmax(logits if entropy_in_loss else logits.detach(), dim=-1)
    else:
        log_p = torch.log_softmax(logits, dim=-1)
        log_probs = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if entropy_in_loss:
        return log_probs, -(log_p.exp() * log_p).sum(dim=-1)
    return log_probs, entropy_metric(log_p)


def chunked_head(hidden, weight, targets, temperature, top_p, entropy_in_loss, rows=None):
    log_probs, entropy = loss_head.token_terms(hidden, weight, targets, temperature=temperature,
                                               top_p=top_p, rows=rows)
    return log_probs, entropy if entropy_in_loss else entropy.detach()


HEADS = {"whole": whole_head, "chunked": chunked_head}


def step(head, hidden, weight, targets, weights, args):
    hidden.grad = weight.grad = None
    options = {"rows": args.chunk_rows} if head == "chunked" else {}
    log_probs, entropy = HEADS[head](hidden, weight, targets, args.temperature, args.top_p,
                                     bool(args.entropy_coef), **options)
    loss = (log_probs * weights).sum()
    if args.entropy_coef:
        loss = loss - args.entropy_coef * entropy.sum()
    loss.backward()
    return log_probs.detach(), entropy.detach()


def measure(args) -> dict:
    """One head in this process: its peaks over the inputs and the last step's seconds."""
    device = torch.device(args.device)
    hidden, weight, targets, weights = inputs(args, device)
    for _ in range(args.steps - 1):  # warm-up steps: kernels chosen, allocator pools made
        step(args.head, hidden, weight, targets, weights, args)
    hidden.grad = weight.grad = None
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base_allocated, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        values = step(args.head, hidden, weight, targets, weights, args)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        allocated = torch.cuda.max_memory_allocated() - base_allocated
        reserved = torch.cuda.max_memory_reserved() - base_reserved
    else:
        out = {}
        start = time.perf_counter()
        allocated = peak_bytes(lambda: out.update(v=step(args.head, hidden, weight, targets,
                                                       weights, args)))
        seconds = time.perf_counter() - start
        values, reserved = out["v"], None
    grads = (hidden.grad.float(), weight.grad.float())
    diff = {}
    if args.head != "whole":  # against the whole head, after the measurement
        want = step("whole", hidden, weight, targets, weights, args)
        want_grads = (hidden.grad.float(), weight.grad.float())
        diff = {"max_abs_diff_log_probs": float((values[0] - want[0]).abs().max()),
                "max_abs_diff_entropy": float((values[1] - want[1]).abs().max()),
                **{f"max_rel_diff_grad_{name}": float((g - w).abs().max() / w.abs().max())
                   for name, g, w in zip(("hidden", "weight"), grads, want_grads, strict=True)}}
    entries = args.tokens * args.vocab
    return {"head": args.head, "device": torch.cuda.get_device_name() if device.type == "cuda"
            else "cpu", "torch": torch.__version__, "tokens": args.tokens, "vocab": args.vocab,
            "hidden": args.hidden, "dtype": "bf16", "temperature": args.temperature,
            "top_p": args.top_p, "entropy_coef": args.entropy_coef,
            "chunk_rows": rows(args),
            "peak_allocated_gib": allocated / GiB,
            "peak_reserved_gib": None if reserved is None else reserved / GiB,
            "allocated_bytes_per_token_per_vocab_entry": allocated / entries,
            "seconds": seconds, **diff}


def rows(args) -> int:
    """Tokens per chunk of the chunked head (--chunk-rows, or the runtime's default)."""
    return min(args.chunk_rows or loss_head.chunk_rows(args.vocab, args.top_p < 1), args.tokens)


def planned(args) -> float:
    """vime/plan/memory.py's loss head for this shape and chunk, tp 1, bf16."""
    from vime.plan import memory

    cut = args.top_p < 1
    per_entry = memory.LOSS_HEAD_NUCLEUS_CHUNK_BYTES if cut else memory.LOSS_HEAD_CHUNK_BYTES
    return (rows(args) * args.vocab * per_entry
            + memory.LOSS_HEAD_WEIGHT_GRAD_BYTES * args.vocab * args.hidden
            + args.tokens * (memory.LOSS_HEAD_HIDDEN_BYTES * args.hidden
                             + memory.LOSS_HEAD_TOKEN_BYTES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--entropy-coef", type=float, default=0.0)
    parser.add_argument("--chunk-rows", type=int, default=None,
                        help="tokens per chunk (default: the runtime's, loss_head.chunk_rows)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", required=True)
    parser.add_argument("--head", choices=sorted(HEADS), help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if args.head:
        print(json.dumps(measure(args)))
        return
    records = []
    for head in ("whole", "chunked"):  # a fresh process each: one allocator's peak
        child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--head", head],
                               capture_output=True, text=True)
        if child.returncode:
            record = {"head": head, "error": child.stderr.strip().splitlines()[-1:]}
        else:
            record = json.loads(child.stdout.strip().splitlines()[-1])
        record["planned_chunked_gib"] = planned(args) / GiB
        records.append(record)
        print(json.dumps(record))
    with open(args.out, "a") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
