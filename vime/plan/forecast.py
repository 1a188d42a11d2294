"""A step-time forecast per rollout: generate, log-probs, train, weight sync and overhead, from
the spec's batch and lengths and a small model of each phase calibrated on one H200.

Every sample is taken at max_prompt_len + max_response_len (an upper bound). A spec of the
calibration slice's shape on one H200 is forecast from its own measurements (● in `vime
plan`); any other is the model's extrapolation (○). Each phase's model and its calibration
data: docs/design.md, "The step-time forecast"; the derivation: docs/forecast.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from vime.plan.colocation import RESIDENT, Colocation
from vime.plan.evidence import Basis
from vime.plan.memory import MemoryPlan, max_num_seqs, vllm_weight_params
from vime.plan.stages import bubble_fraction, pipeline
from vime.resolve.spec import Spec

STEP_DATA = ("docs/data/h200-step-breakdown-resident-32x8-2026-12-02.json",
             "docs/data/h200-step-breakdown-offload-32x8-2026-12-02.json",
             "docs/data/h200-step-breakdown-resident-16x8-2026-12-02.json")
ROLLOUT_DATA = "docs/data/h200-vllm-rollout-2026-12-01.json"

# generate: seconds per decode step = base + running sequences × (per sequence + per sequence
# per layer). 256 and 128 sequences of the 4-layer slice: 17.61 and 12.21 ms a step (18.03 and
# 12.50 s for 1,024 steps, the mean of the steady rollouts); 512 sequences of the 48-layer
# Qwen3-30B-A3B shape: 36.0 ms (36.9 s for 1,024 steps).
DECODE_BASE_S = 6.81e-3
DECODE_PER_SEQUENCE_S = 4.09e-5
DECODE_PER_SEQUENCE_LAYER_S = 3.37e-7
# log-probs: forward FLOP/s of one actor GPU (270k and 135k tokens in 1.31 and 0.705 s)
FORWARD_FLOPS_PER_S = 2.2e14
# train: forward + backward (3 × the forward FLOPs) per second, and the optimizer step per
# parameter of the GPU's shard (3.57 and 1.85 s for 270k and 135k tokens: 0.125 s at 0 tokens)
TRAIN_FLOPS_PER_S = 2.62e14
OPTIMIZER_S_PER_PARAM = 4.0e-11
# weight sync: bytes per second of a whole push (export, IPC hand-over, vLLM's reload round),
# 6.23 GB in 0.78 s resident and 0.90 s taking turns (the export then brings the weights back
# from the pinned host buffers first)
SYNC_BYTES_PER_S = {RESIDENT: 8.0e9, "offload": 6.9e9}
# overhead: the actor's copies at the pinned rate the loop reached (43.6 GB in 0.95-1.00 s out,
# 0.97 s in), the engines' sleep (level 2) and wake (2.09 s of offload phase less 1.95 s of
# copies), and the rest of the loop outside the phases (the toy reward, batches: 0.03-0.05 s)
OFFLOAD_BYTES_PER_S = 44.7e9
ENGINE_SLEEP_WAKE_S = 0.14
LOOP_REST_S = 0.04


@dataclass(frozen=True)
class Line:
    name: str
    seconds: float
    note: str
    basis: Basis


# rollout.async = "one_step": the phases of rollout k that run beside the generation of
# rollout k+1 (runtime/rl/asynchrony.py)
BESIDE_GENERATION = ("log-probs", "train")


@dataclass(frozen=True)
class Forecast:
    mode: str  # resident | offload | disaggregated
    lines: tuple[Line, ...]
    asynchronous: str = "off"  # rollout.async

    @property
    def total(self) -> float:
        """Seconds per rollout, phase after phase (the synchronous loop)."""
        return sum(line.seconds for line in self.lines)

    def seconds(self, *names: str) -> float:
        return sum(line.seconds for line in self.lines if line.name in names)

    @property
    def overlapped(self) -> bool:
        """Generation beside training on GPUs of their own: one-step async, disaggregated.
        Resident on shared GPUs both phases compete for the same GPUs: no overlap counted."""
        return self.asynchronous == "one_step" and self.mode == "disaggregated"

    @property
    def step(self) -> float:
        """Seconds per rollout as the loop runs: with the overlap, max(generate, log-probs +
        train) + weight sync + overhead; else the total."""
        if not self.overlapped:
            return self.total
        beside = self.seconds(*BESIDE_GENERATION)
        return max(self.seconds("generate"), beside) + self.total - self.seconds(
            "generate", *BESIDE_GENERATION)


def _calibrated(spec: Spec) -> bool:
    """Whether the spec is the measured slice's shape on one H200 (the calibration's scope)."""
    arch = spec.arch
    return (spec.cluster.gpu == "H200" and spec.derived.world_size == 1 and arch.is_moe
            and (arch.num_layers, arch.hidden_size, arch.num_experts, arch.topk,
                 arch.moe_ffn_hidden_size, arch.vocab_size) == (4, 2048, 128, 8, 768, 151936)
            and spec.rollout.max_response_len == 1024
            and spec.derived.samples_per_rollout in (128, 256))


def forward_flops_per_token(spec: Spec) -> float:
    """2 × the active parameters but the input embedding's (a lookup), plus causal attention
    over half the sequence on average."""
    arch = spec.arch
    length = spec.rollout.max_prompt_len + spec.rollout.max_response_len
    attention = 4 * arch.num_layers * arch.num_attention_heads * arch.head_dim * length / 2
    return 2 * (arch.params_active - arch.embedding_params) + attention


def _pipeline_busy(spec: Spec) -> tuple[float, str]:
    """The share of a step a pipeline stage computes, m ÷ (m + pp − 1) under 1F1B for m
    micro-batches (with dynamic_batch, every sample at full length as the forecast takes
    them), and the note that says so; 1 without a pipeline. Not measured: the calibration
    ran no pipeline."""
    pipe = pipeline(spec)
    if pipe is None:
        return 1.0, ""
    count = pipe.micro_batches or pipe.full_length_micro_batches or pipe.most_micro_batches
    busy = 1 - bubble_fraction(pipe.pp, count)
    return busy, f"; pp {pipe.pp}: {busy:.0%} busy, {count} micro-batches"


def step_forecast(spec: Spec, memory: MemoryPlan | None, colocation: Colocation | None
             ) -> Forecast | None:
    """None where memory is not planned (no model, the torch backends, an unknown GPU)."""
    if memory is None:
        return None
    measured = _calibrated(spec)
    sources = (*STEP_DATA, ROLLOUT_DATA, "docs/forecast.md")

    def basis(what: str) -> Basis:
        if measured:
            return Basis("gpu", f"{what}: measured at this shape (a 4-layer Qwen3-30B-A3B slice, "
                         "one H200), the mean of the steady rollouts; in-sample", sources)
        return Basis("estimate", f"{what}: the model calibrated on a 4-layer Qwen3-30B-A3B "
                     "slice on one H200, extrapolated to this spec", sources)

    arch, d, roll = spec.arch, spec.derived, spec.rollout
    length = roll.max_prompt_len + roll.max_response_len
    tokens = d.samples_per_rollout * length
    lines = []
    # generate
    running = max(min(memory.rollout.samples_per_engine, max_num_seqs(spec, memory.gpu_bytes),
                      max(memory.rollout.sequences_at_once, 1)), 1)
    waves = ceil(memory.rollout.samples_per_engine / running)
    step = DECODE_BASE_S + running * (DECODE_PER_SEQUENCE_S
                                      + DECODE_PER_SEQUENCE_LAYER_S * arch.num_layers)
    lines.append(Line("generate", waves * roll.max_response_len * step,
                      f"{waves} × {roll.max_response_len} steps of {running} sequences, "
                      f"{step * 1e3:.1f} ms a step", basis("generate")))
    # log-probs and train
    gpus = spec.train.num_gpus
    flops = forward_flops_per_token(spec) * tokens
    passes = 2 if spec.algorithm.kl_loss_coef > 0 else 1  # the reference model's too
    busy, idle_note = _pipeline_busy(spec)
    lines.append(Line("log-probs", passes * flops / gpus / FORWARD_FLOPS_PER_S / busy,
                      f"{tokens:,} tokens × {forward_flops_per_token(spec) / 1e9:.2f} GFLOP "
                      f"÷ {gpus} GPU(s) at {FORWARD_FLOPS_PER_S / 1e12:.0f} TFLOP/s"
                      + (", actor and reference" if passes == 2 else "") + idle_note,
                      basis("log-probs")))
    shard = sum(t.bytes for t in memory.train.terms if t.name == "weights") / 2
    trained = min(tokens, spec.train.global_batch_size * spec.train.steps_per_rollout * length)
    lines.append(Line("train", 3 * forward_flops_per_token(spec) * trained / gpus
                      / TRAIN_FLOPS_PER_S / busy
                      + spec.train.steps_per_rollout * OPTIMIZER_S_PER_PARAM * shard,
                      f"3 × forward at {TRAIN_FLOPS_PER_S / 1e12:.0f} TFLOP/s + "
                      f"{spec.train.steps_per_rollout} optimizer step(s) of {shard / 1e9:.2f} B "
                      "params" + idle_note, basis("train")))
    # weight sync
    mode = colocation.mode if colocation is not None else "disaggregated"
    rate = SYNC_BYTES_PER_S[RESIDENT if mode != "offload" else "offload"]
    pushed = 2 * vllm_weight_params(spec)
    lines.append(Line("weight sync", pushed / rate,
                      f"{pushed / 1e9:.2f} GB per engine GPU at {rate / 1e9:.1f} GB/s",
                      basis("weight sync")))
    # overhead
    if mode == "offload":
        kept = sum(t.bytes for t in memory.train.terms if t.name in ("weights", "optimizer"))
        seconds = 2 * kept / OFFLOAD_BYTES_PER_S + ENGINE_SLEEP_WAKE_S + LOOP_REST_S
        note = (f"taking turns: {kept / 1e9:.1f} GB out and back at "
                f"{OFFLOAD_BYTES_PER_S / 1e9:.1f} GB/s, engines' sleep and wake, the loop")
    else:
        seconds, note = LOOP_REST_S, f"{mode}: no offload, no sleep; the loop"
    lines.append(Line("overhead", seconds, note, basis("overhead")))
    return Forecast(mode, tuple(lines), spec.rollout.async_mode)
