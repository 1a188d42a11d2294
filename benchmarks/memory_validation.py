"""Compare GPU measurements with vime's memory plan.

    python benchmarks/memory_validation.py docs/data/h200-megatron-memory-2026-11-29.jsonl
    python benchmarks/memory_validation.py --grid backend-grid.jsonl

Without --grid the file is benchmarks/gpu/megatron_memory.py's (the plain megatron-core loop);
with --grid it is benchmarks/gpu/backend_memory_grid.py's (vime's own Megatron backend step),
whose lines each carry the case's whole definition: see predict_grid.

For each measured case it plans the same spec (Qwen3-30B-A3B layer shapes with the measured
layer count, one H200, tp = ep = 1, SequentialMLP experts as then, the measured tokens and
recompute) and prints a Markdown table: the terms torch's allocator sees (all but the
allowance) against max_memory_allocated, and the same plus fragmentation against
max_memory_reserved. The memory outside torch's allocator (CUDA context, NCCL) is outside both
torch counters and is left out of both sides.

The measured loop's loss is a whole-vocabulary fp32 log-softmax (megatron_memory.py's
grpo_step), not the runtime's chunked loss head (runtime/core/loss_head.py) that the
planner's "logits" term follows; for those measurements the table uses a whole-vocabulary
term in its place, WHOLE_VOCABULARY_BYTES per token per vocabulary entry.
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
    HEADROOM_WARNING,
    LOSS_HEAD_PLAIN_HIDDEN_GRAD_BYTES,
    LOSS_HEAD_PLAIN_WEIGHT_GRAD_BYTES,
    LOSS_HEAD_WEIGHT_GRAD_BYTES,
    GiB,
    actor_outside_torch,
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
# bf16 gradient; 14.9 measured), the planner's loss head before the chunked one
WHOLE_VOCABULARY_BYTES = 16
# what ran on 2026-11-29: SequentialMLP experts (before the grouped ones)
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


def grid_sets(case: dict) -> list[str]:
    """`--set`s on specs/qwen3_30b.toml for one grid case: one H200 of a two-GPU node, the actor
    alone on it (not colocated: the grid runs no engine), tp = ep = 1, GPU Adam, the case's
    architecture written out key by key as [model.arch] over the preset of its family (a
    dense case needs the dense preset: [model.arch] keys override, they cannot remove the MoE
    preset's num_experts), its tokens and recompute, and the experts the backend chose."""
    arch = case["arch"]
    preset = "qwen3-30b-a3b" if arch.get("num_experts") else "qwen3-4b"
    sets = ["cluster.nodes=1", "cluster.gpus_per_node=2", "cluster.gpu=H200", "train.num_gpus=1",
            "train.colocate=false", "train.parallel.tp=1", "train.parallel.ep=1",
            "train.parallel.sequence_parallel=false", "train.optimizer.cpu_offload=false",
            "train.optimizer.overlap_cpu_optimizer_d2h_h2d=false",
            "train.optimizer.precision_aware=false", "inference.gpus_per_engine=1",
            "inference.expert_parallel=false", "train.routing_replay=false",
            "rollout.batch_size=1", "rollout.n_samples_per_prompt=1", "train.global_batch_size=1",
            f'model.preset="{preset}"', f"train.max_tokens_per_gpu={case['tokens']}",
            f'train.recompute="{case["recompute"]}"']
    sets += [f"model.arch.{key}={json.dumps(value)}" for key, value in sorted(arch.items())]
    # what the backend printed it built, else what the case asked for
    if (case.get("result", {}).get("experts_chosen") or case.get("experts")) == "sequential":
        sets.append(SEQUENTIAL)
    return sets


def predict_grid(case: dict) -> dict:
    """vime's plan of one backend-grid case: the allocator-visible terms (as predict), the same
    with fragmentation, and the verdict of V801 (an error: vime says OOM)."""
    spec_path = ROOT / "specs" / "qwen3_30b.toml"
    result = pipeline.run(Source(str(spec_path), spec_path.read_text()), grid_sets(case),
                          spec_path.parent)
    bad = [(d.code, d.message) for d in result.diagnostics
           if d.severity == "error" and d.code != "V801"]
    if bad:
        raise ValueError(f"{case['name']}: the spec does not plan: {bad}")
    v801 = [d.severity for d in result.diagnostics if d.code == "V801"]
    spec = result.spec
    phase = memory_plan(spec).train
    terms = {t.name: t.bytes for t in phase.terms}
    verdict = "OOM" if "error" in v801 else "fits" + (" (tight)" if v801 else "")
    total = phase.peak
    if case.get("result", {}).get("loss_head_backward") == "by-tokens" and \
            spec.rollout.top_p >= 1:
        # the run's loss head went by tokens in its backward too (until 93b79b3): its weight
        # gradient summed in fp32 (6 B per entry), no fp32 sum of the hidden states' gradient
        h, vocab = spec.arch.hidden_size, padded_vocab(spec.arch.vocab_size, 1)
        terms["logits"] += ((LOSS_HEAD_WEIGHT_GRAD_BYTES - LOSS_HEAD_PLAIN_WEIGHT_GRAD_BYTES)
                            * vocab * h
                            - LOSS_HEAD_PLAIN_HIDDEN_GRAD_BYTES * h * case["tokens"])
        backward = sum(terms.get(name, 0.0) for name in BACKWARD_TERMS)
        terms["optimizer step"] = max(adam_step_transient(spec) - backward, 0.0)
        allocated = sum(v for name, v in terms.items() if name not in NOT_ALLOCATED)
        total = allocated * (1 + FRAGMENTATION) + actor_outside_torch(spec).bytes
        headroom = 1 - total / phase.capacity
        verdict = ("OOM" if total > phase.capacity else
                   "fits" + (" (tight)" if headroom < HEADROOM_WARNING else ""))
    allocated = sum(v for name, v in terms.items() if name not in NOT_ALLOCATED)
    return {"allocated": allocated / GiB, "reserved": allocated * (1 + FRAGMENTATION) / GiB,
            "total": total / GiB, "gpu": phase.capacity / GiB, "verdict": verdict,
            "terms": {k: v / GiB for k, v in terms.items()}}


def _error(predicted: float, measured: float | None) -> str:
    return f"{(predicted - measured) / measured:+.1%}" if measured else "–"


def main_grid(path: str) -> None:
    print("| case | tokens | recompute | experts | measured allocated | vime | error "
          "| measured reserved | vime | error | device used | vime verdict | measured |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for line in Path(path).read_text().splitlines():
        case = json.loads(line)
        measured = case.get("result", {})
        p = predict_grid(case)
        head = (f"| {case['name']} | {case['tokens']} | {case['recompute']} | "
                f"{measured.get('experts_chosen') or case.get('experts') or 'dense'} |")
        if not measured.get("ok"):
            what = ("OOM" if measured.get("oom") else "timeout" if measured.get("timeout")
                    else "not run (budget)" if measured.get("skipped") else "error")
            print(f"{head} – | {p['allocated']:.1f} GiB | – | – | {p['reserved']:.1f} GiB | – "
                  f"| – | {p['verdict']} | {what} |")
            continue
        a, r = measured["peak_allocated_gib"], measured["peak_reserved_gib"]
        print(f"{head} {a:.1f} GiB | {p['allocated']:.1f} GiB | {_error(p['allocated'], a)} | "
              f"{r:.1f} GiB | {p['reserved']:.1f} GiB | {_error(p['reserved'], r)} | "
              f"{measured['device_used_gib']:.1f} GiB | {p['verdict']} | ran |")


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
            continue  # a record without per-phase peaks
        print(f"| {case['layers']} | {case['recompute']} | {case['tokens']} | {a:.1f} GiB | "
              f"{p['allocated']:.1f} GiB | {(p['allocated'] - a) / a:+.1%} | {r:.1f} GiB | "
              f"{p['reserved']:.1f} GiB | {(p['reserved'] - r) / r:+.1%} | "
              f"{case['tokens_per_s']:.0f} |")


if __name__ == "__main__":
    if sys.argv[1] == "--grid":
        main_grid(sys.argv[2])
    else:
        main(sys.argv[1])
