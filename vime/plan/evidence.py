"""What each term of the memory plan has been checked against.

Every Term of vime/plan/memory.py carries one Basis ("gpu", "cpu" or "estimate"): the
strongest thing it has been compared with, the error seen and where the raw data are;
`vime plan` marks each term with it (vime/render.py). tests/test_memory_validation.py
recomputes the numbers quoted here from the data files. What each kind means:
docs/design.md, "What each memory term is checked against".
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("gpu", "cpu", "estimate")  # strongest first
MARKS = {"gpu": "●", "cpu": "◐", "estimate": "○"}
LEGEND = {"gpu": "checked against a GPU measurement", "cpu": "measured on the CPU only",
          "estimate": "the model's estimate"}

H200_MEMORY = "docs/data/h200-megatron-memory-2026-11-29.jsonl"
VALIDATION = "docs/memory-validation.md"


@dataclass(frozen=True)
class Basis:
    kind: str  # one of KINDS
    evidence: str  # what was compared, the error seen, and the scope
    sources: tuple[str, ...] = ()

    @property
    def mark(self) -> str:
        return MARKS[self.kind]


def weakest(bases) -> Basis:
    """The basis of a sum of parts: its weakest part's kind, every part's evidence."""
    bases = list(bases)
    kind = max((b.kind for b in bases), key=KINDS.index)
    sources = tuple(dict.fromkeys(s for b in bases for s in b.sources))
    return Basis(kind, "; ".join(b.evidence for b in bases), sources)


# -- training ------------------------------------------------------------------------------

STATIC_STATE = Basis(
    "gpu",
    "weights, gradients and optimizer state after a step measured on one H200 (Qwen3-30B-A3B "
    "slices of 1.87 and 3.11 B parameters: 31.40 and 52.31 GiB resident), planned 0.2-1.7% "
    "lower; within 0.1-2.6% on other shapes, one and two H200s, tp/ep/etp up to 2 (raw data "
    "not in the repository)",
    (H200_MEMORY, VALIDATION))

CPU_ADAM = Basis(
    "estimate",
    "CPU Adam keeps the fp32 state on the host: ran on two H200s at tp 2 with a tiny model "
    "(0.48 GiB per rank against 0.60 with Adam on the GPU), not compared term by term",
    ("docs/data/h200x2-megatron-parallel-tp2-cpu-adam-2026-11-29.json", "docs/gpu-runs.md"))

_OTHER_SHAPES = ("on other shapes (hidden 1024 and 2048, 32 and 64 experts, tp/ep/etp up to "
                 "2) activations and the loss head of then were over-predicted by 34% on "
                 "average, 61% at worst (raw data not in the repository)")
_MOE_ON_CPU = ("the MoE layer's saved bytes per token (router, alltoall dispatch, experts) "
               "counted from megatron-core's code and measured equal on the CPU for both expert "
               "paths")
_ORACLE = "tests/oracle/test_megatron_moe_activations.py"

ACTIVATIONS_SEQUENTIAL = Basis(
    "gpu",
    "Qwen3-30B-A3B layers with SequentialMLP experts at tp = cp = ep = 1 on one H200 (2 and 4 "
    "layers, 2k-24k tokens, recompute none/selective/full): the allocated peaks within "
    "-0.8%..+3.3% (table of docs/memory-validation.md, with the loss head of then); "
    + _MOE_ON_CPU, (H200_MEMORY, VALIDATION, _ORACLE))

ACTIVATIONS_GROUPED = Basis(
    "cpu",
    "estimate, CPU-measured, GPU pending: the grouped experts (the default where torch's "
    "grouped GEMM runs) keep the same bytes per token as SequentialMLP, whose layers were "
    "measured on an H200 (Qwen3-30B-A3B, tp = cp = ep = 1); " + _MOE_ON_CPU,
    (_ORACLE, H200_MEMORY, VALIDATION))

ACTIVATIONS_UNMEASURED = Basis(
    "estimate",
    "measured only for Qwen3-30B-A3B's layer shapes at tp = cp = ep = etp = 1 (one H200); "
    + _OTHER_SHAPES + "; " + _MOE_ON_CPU + ", the dense MLP's too",
    (H200_MEMORY, VALIDATION, _ORACLE))

UNEVEN_ROUTING = Basis(
    "estimate",
    "a margin: train.routing_imbalance × the mean routed rows on the busiest expert-parallel "
    "rank; its default 1.8 is the most measured at ep 2 with random routing (1.5-1.8×, raw "
    "data not in the repository); a trained router's imbalance differs",
    (VALIDATION,))

EXPERT_STACKS = Basis(
    "cpu",
    "estimate, CPU-measured, GPU pending: the grouped experts stack one projection's weights "
    "for each grouped GEMM and its weight gradient in the backward; on the CPU the peak over "
    "SequentialMLP's was 0.83-0.92 of one copy of the local fc1 weights",
    (_ORACLE, "runtime/megatron/grouped_experts.py"))

LOSS_HEAD = Basis(
    "cpu",
    "estimate, CPU-measured, GPU pending: the chunked loss head's temporaries measured on the "
    "CPU (8.0 bytes per entry of a chunk, 4.3-5.7 of the 6 charged for the weight gradient); "
    "benchmarks/gpu/loss_head_memory.py not yet run on a GPU",
    ("tests/runtime/test_loss_head.py", VALIDATION))

ADAM_STEP = Basis(
    "gpu",
    "torch's foreach AdamW: 4.00 bytes per parameter above the resident state during the step "
    "on one H200 (6.96 and 11.60 GiB for 1.87 and 3.11 B parameters), one optimizer at ep 1",
    (H200_MEMORY, VALIDATION))

ADAM_STEP_CHAINED = Basis(
    "estimate",
    "4.00 bytes per parameter measured on one H200 with one optimizer (ep 1); with ep > 1 or "
    "etp ≠ tp megatron-core steps the dense and the expert optimizers one after the other "
    "(ChainedOptimizer): the larger shard's transient, from the code, not measured",
    (H200_MEMORY, VALIDATION))

NO_ADAM_STEP = Basis("estimate", "CPU Adam steps on the host: no device transient, not measured")

TE_ADAM_STEP = Basis(
    "estimate",
    "train.transformer_impl = transformer_engine: megatron-core steps with Transformer Engine's "
    "FusedAdam, which updates the parameters and moments in place (multi_tensor_adam): no "
    "transient charged, from the code, not measured",
    ("transformer_engine/pytorch/optimizers/fused_adam.py",))

OUTSIDE_TORCH_ONE_GPU = Basis(
    "gpu",
    "memory outside torch's allocator: 2.06 GiB on every case of vime's own backend step on one "
    "H200 (seven shapes, 4k-24k tokens; raw data not in the repository)",
    (VALIDATION,))

OUTSIDE_TORCH_TWO_GPUS = Basis(
    "gpu",
    "memory outside torch's allocator: 2.06 GiB with vime's backend on one H200; a stand-in "
    "megatron-core loop held 2.4 GiB on one GPU and 3.8-4.4 GiB on each of two, so NCCL's "
    "groups add up to 2.0 GiB (raw data not in the repository)",
    (VALIDATION,))

OUTSIDE_TORCH_MORE_GPUS = Basis(
    "estimate",
    "memory outside torch's allocator measured on one and two H200s only (2.06 GiB with vime's "
    "backend on one; up to 2.0 GiB more for NCCL on two); more GPUs and groups hold more "
    "NCCL buffers, not measured",
    (VALIDATION,))

FRAGMENTATION = Basis(
    "gpu",
    "reserved over allocated 3-15% on one H200 (stand-in loop); with vime's backend one case "
    "peaked at 138.3 of 139.8 GiB on the device with reserved under-predicted",
    (H200_MEMORY, VALIDATION))

SLEEPING_ENGINE = Basis(
    "estimate",
    "vLLM's context and CUDA graphs while asleep: both measured awake at start-up "
    "(docs/memory-validation.md), what sleep keeps of them not measured", (VALIDATION,))

# -- rollout and host ------------------------------------------------------------------------

VLLM = Basis(
    "estimate",
    "vLLM's terms follow its KV-cache budget code; compared with the live engine's start-up "
    "log for one-GPU engines only (tp 1, vLLM 0.26.0 on an H200): with tp > 1 NCCL's buffers "
    "and the sharded shapes are not measured")

# one-GPU engines: the start-up log of vLLM 0.26.0 on an H200 (a Qwen3-30B-A3B-shaped engine,
# 48 layers, max_num_seqs 512, and a tiny Qwen3-MoE), docs/memory-validation.md
VLLM_STARTUP = "docs/data/h200-vllm-30b-startup-2026-12-01.log"
_TINY_ENGINE = "docs/data/h200-vllm-engine-own-process-2026-12-01.log"
VLLM_WEIGHTS = Basis(
    "gpu", "'Model loading took 56.88 GiB' for the Qwen3-30B-A3B shape on one H200: -0.0%",
    (VLLM_STARTUP, VALIDATION))
VLLM_ACTIVATIONS = Basis(
    "gpu", "the profile run's peak activation, 2.48 GiB for the Qwen3-30B-A3B shape (16,384 "
    "batched tokens, a sampler of 512 sequences) and 0.09 GiB for a tiny Qwen3-MoE: +1.6% "
    "and +11% (0.01 GiB)", (VLLM_STARTUP, _TINY_ENGINE, VALIDATION))
VLLM_GRAPHS = Basis(
    "gpu", "fitted to the two engines' CUDA graph pools (0.80 GiB for the Qwen3-30B-A3B "
    "shape, largest size 512; 0.04 GiB for a tiny model): from these two only",
    (VLLM_STARTUP, _TINY_ENGINE, VALIDATION))
VLLM_OUTSIDE = Basis(
    "gpu", "the context 0.51 GiB in use before vLLM takes its budget and 0.22-0.24 GiB outside "
    "torch inside it, both engines at tp 1", (VLLM_STARTUP, _TINY_ENGINE, VALIDATION))
VLLM_KV = Basis(
    "gpu", "'Available KV cache memory: 65.58 GiB' (716,288 tokens) for the Qwen3-30B-A3B "
    "shape at gpu_memory_utilization 0.9: -0.3% with the terms above",
    (VLLM_STARTUP, VALIDATION))

HOST = Basis("estimate", "host memory terms are not measured")

UNMEASURED = Basis("estimate", "not measured")
