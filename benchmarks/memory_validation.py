"""Compare GPU measurements (benchmarks/gpu/megatron_memory.py) with vime's memory plan.

    python benchmarks/memory_validation.py docs/data/h200-megatron-memory-2026-11-29.jsonl

For each measured case it plans the same spec (Qwen3-30B-A3B layer shapes with the measured
layer count, one H200, tp = ep = 1, SequentialMLP experts as then, the measured tokens and
recompute) and prints a Markdown table: the terms torch's allocator sees (all but the
allowance) against max_memory_allocated, and the same plus fragmentation against
max_memory_reserved. The memory outside torch's allocator (CUDA context, NCCL) is outside both
torch counters and is left out of both sides.

The measured loop's loss is a whole-vocabulary fp32 log-softmax (megatron_memory.py's
grpo_step), not the runtime's chunked loss head (runtime/core/loss_head.py, issue 18) that the
planner's "logits" term now follows; for those measurements the table puts back the term the
planner had for it, WHOLE_VOCABULARY_BYTES per token per vocabulary entry.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vime import pipeline
from vime.parse import Source
from vime.plan.memory import (
    BACKWARD_TERMS,
    FRAGMENTATION,
    GiB,
    adam_step_transient,
    memory_plan,
    padded_vocab,
)

ROOT = Path(__file__).resolve().parent.parent
# what neither of torch's counters sees: the actor's memory outside its allocator (in the
# allowance with the fragmentation) and the colocated vLLM engine's
NOT_ALLOCATED = ("allowance", "sleeping engine")
# the whole-vocabulary log-softmax's bytes per token per vocabulary entry (bf16 logits, the fp32
# log-softmax kept for the backward, the backward's fp32 gradients of its output and input and a
# bf16 gradient; 14.9 measured), the planner's loss head until issue 18
WHOLE_VOCABULARY_BYTES = 16
# what ran on 2026-11-29: SequentialMLP experts (the grouped ones came with issue 19)
SEQUENTIAL = 'cluster.env.VIME_MOE_EXPERTS="sequential"'


def predict(case: dict) -> dict:
    sets = ["cluster.nodes=1", "cluster.gpus_per_node=1", "cluster.gpu=H200",
            "train.parallel.tp=1", "train.parallel.ep=1", "train.parallel.sequence_parallel=false",
            "train.optimizer.cpu_offload=false", "train.optimizer.overlap_cpu_optimizer_d2h_h2d=false",
            "train.optimizer.precision_aware=false", "inference.gpus_per_engine=1",
            "inference.expert_parallel=false", "train.routing_replay=false",
            f"model.arch.num_hidden_layers={case['layers']}",
            f"train.max_tokens_per_gpu={case['tokens']}", f'train.recompute="{case["recompute"]}"',
            "rollout.batch_size=1", "rollout.n_samples_per_prompt=1", "train.global_batch_size=1",
            SEQUENTIAL]
    spec_path = ROOT / "specs" / "qwen3_30b.toml"
    result = pipeline.run(Source(str(spec_path), spec_path.read_text()), sets, spec_path.parent)
    bad = [d for d in result.diagnostics if d.severity == "error" and d.code != "V801"]
    assert not bad, [(d.code, d.message) for d in bad]
    spec = result.spec
    terms = {t.name: t.bytes for t in memory_plan(spec).train.terms}
    if case.get("loss_head", "whole") == "whole":  # megatron_memory.py's loss
        vocab = padded_vocab(spec.arch.vocab_size, 1)
        terms["logits"] = case["tokens"] * vocab * WHOLE_VOCABULARY_BYTES
        # the step's transient beyond the backward's working set, with that loss head
        backward = sum(terms.get(name, 0.0) for name in BACKWARD_TERMS)
        terms["optimizer step"] = max(adam_step_transient(spec) - backward, 0.0)
    allocated = sum(v for name, v in terms.items() if name not in NOT_ALLOCATED)
    return {"allocated": allocated / GiB, "reserved": allocated * (1 + FRAGMENTATION) / GiB,
            "terms": {k: v / GiB for k, v in terms.items()}}


def main(path: str) -> None:
    print("| layers | recompute | tokens | measured allocated | vime | error | measured reserved "
          "| vime | error | tokens/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for line in Path(path).read_text().splitlines():
        case = json.loads(line)
        if "error" in case:
            print(f"| {case['layers']} | {case['recompute']} | {case['tokens']} | {case['error']} |")
            continue
        p = predict(case)
        a, r = case["peak_allocated_gib"], case["peak_reserved_gib"]
        if "peak_backward_gib" not in case:
            continue  # first run, before peaks were taken per phase
        print(f"| {case['layers']} | {case['recompute']} | {case['tokens']} | {a:.1f} GiB | "
              f"{p['allocated']:.1f} GiB | {(p['allocated'] - a) / a:+.1%} | {r:.1f} GiB | "
              f"{p['reserved']:.1f} GiB | {(p['reserved'] - r) / r:+.1%} | "
              f"{case['tokens_per_s']:.0f} |")


if __name__ == "__main__":
    main(sys.argv[1])
