"""The Megatron backend's packed micro-batches (train.pack_sequences: every sample of a
micro-batch in one row of their summed length, megatron-core's THD format) against its padded
ones ([n, longest]) on the same samples: log-probs and one train step, tokens/s of each, and
how far the packed log-probs are from the padded ones. torch and megatron-core only (no vLLM,
no Ray).

    python benchmarks/gpu/packing_bench.py --shape qwen3-30b-a3b --layers 4 --out $OUT/packing.json
    python benchmarks/gpu/packing_bench.py --shape tiny --samples 16 --out /tmp/packing.json  # CPU

The model is benchmarks/gpu/tiny_moe.py's shape (qwen3-30b-a3b: Qwen3-30B-A3B's layers, bf16,
random seeded weights) built by the backend itself on one GPU (one_gpu.train_slice), dynamic
micro-batches of at most --max-tokens tokens: the sum of the lengths when packed, n × the
longest when padded, as the backend counts them. The samples: --samples of them, seeded,
prompts uniform in 64-512 tokens, responses lognormal (median 400) clipped to 64-2048.

Each path runs once on a few samples first (allocations, kernels), then log_probs over every
sample and one train_step (the GRPO loss, backward, Adam) over them, timed with the GPU
synchronised. On the CPU (no CUDA: --shape tiny, fp32) the backend is put together around the
model by hand (megatron-core's DDP and optimizer want CUDA), and the train step is the loss's
backward without the optimizer step, so that the script is known to run.

Prints `RESULT {json}` and writes it to --out: tokens/s of each path and phase, the speedup,
the packed log-probs' mean and max |Δ| from the padded ones, and the same for the padded path
run again in micro-batches of half the tokens (the noise floor of the precision: other shapes
and kernels round differently), peak memory (GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tiny_moe import SHAPES  # noqa: E402

from runtime.core.interfaces import TrainBatch  # noqa: E402


def samples(count: int, vocab: int, seed: int, scale: float = 1.0) -> TrainBatch:
    """`count` samples: prompt 64-512 tokens, response lognormal (median 400) in 64-2048, all
    lengths times `scale` (at least 2 and 1 tokens: the CPU's tiny run)."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(64, 513, count)
    responses = np.clip(rng.lognormal(np.log(400), 0.8, count), 64, 2048).astype(int)
    prompts = np.maximum((prompts * scale).astype(int), 2)
    responses = np.maximum((responses * scale).astype(int), 1)
    tokens = [rng.integers(0, vocab, p + r).tolist() for p, r in zip(prompts, responses,
                                                                      strict=True)]
    return TrainBatch(tokens=tokens, prompt_lens=prompts.tolist())


def _arch(shape: str, layers: int | None) -> dict:
    arch = {**SHAPES[shape], "model_type": "qwen3_moe", "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True, "tie_word_embeddings": False,
            "rope_theta": 10000.0, "rms_norm_eps": 1e-6}
    if layers:
        arch["num_hidden_layers"] = layers
    arch["max_position_embeddings"] = max(arch["max_position_embeddings"], 4096)
    return arch


def gpu_backend(arch: dict, max_tokens: int):
    import one_gpu

    from runtime.backends.megatron_train import MegatronTrainingBackend

    backend = MegatronTrainingBackend()
    backend.init(one_gpu.train_slice(arch, max_tokens))
    return backend


def cpu_backend(arch: dict, max_tokens: int):
    """The backend around a fp32 model on the CPU, gloo, without DDP or an optimizer: its
    batching, forward, loss head and loss are the GPU run's."""

    from megatron.core import parallel_state

    from runtime.backends.megatron_train import MegatronTrainingBackend
    from runtime.core.slices import LossConfig
    from runtime.megatron.model import build_gpt, transformer_config
    from vime.resolve.model import arch_from_config

    sys.path.insert(0, str(HERE.parents[1] / "tests"))
    from megatroncpu import cpu_streams, single_rank_parallel_state

    single_rank_parallel_state()
    cpu_streams()
    parsed = arch_from_config(arch)
    config = transformer_config(parsed, bf16=False, params_dtype=torch.float32,
                                pipeline_dtype=torch.float32, use_cpu_initialization=True,
                                calculate_per_token_loss=True)
    torch.manual_seed(1234)
    gpt = build_gpt(parsed, config, arch["max_position_embeddings"])

    class Call(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt = gpt

        def forward(self, *args, fp32_output=True, **kwargs):
            return self.gpt(*args, **kwargs)

    class OnTheCpu(MegatronTrainingBackend):
        def _begin_step(self):
            self.model.train()
            self.model.zero_grad(set_to_none=True)

        def _finish_step(self):
            return {}

    assert parallel_state.model_parallel_is_initialized()
    slice = types.SimpleNamespace(
        routing_replay=False, dynamic_batch=True, micro_batch_size=1,
        max_tokens_per_gpu=max_tokens, loss=LossConfig(), world_size=1, rank=0)
    return OnTheCpu.over(Call(), gpt, parsed, config, slice, packed=True)


def _with_budget(slice, tokens: int):
    """The slice with max_tokens_per_gpu = tokens (a TrainSlice, or the CPU's namespace)."""
    if dataclasses.is_dataclass(slice):
        return dataclasses.replace(slice, max_tokens_per_gpu=tokens)
    return types.SimpleNamespace(**{**vars(slice), "max_tokens_per_gpu": tokens})


def _subset(batch: TrainBatch, count: int) -> TrainBatch:
    return TrainBatch(tokens=batch.tokens[:count], prompt_lens=batch.prompt_lens[:count])


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(call):
    _synchronize()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    out = call()
    _synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if torch.cuda.is_available() else None
    return out, seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=16384,
                        help="train.max_tokens_per_gpu: a micro-batch's tokens (dynamic_batch)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    arch = _arch(args.shape, args.layers)
    on_gpu = torch.cuda.is_available()
    # the CPU's tiny model: lengths a tenth of the GPU run's, so that it runs in seconds
    scale = 1.0 if on_gpu else 0.1
    batch = samples(args.samples, arch["vocab_size"], args.seed, scale)
    max_tokens = max(args.max_tokens if on_gpu else int(args.max_tokens * scale),
                     max(len(t) for t in batch.tokens))
    backend = (gpu_backend if on_gpu else cpu_backend)(arch, max_tokens)
    real = sum(len(t) for t in batch.tokens)
    response = sum(len(t) - p for t, p in zip(batch.tokens, batch.prompt_lens, strict=True))
    paths = {"padded": False, "packed": True}
    result: dict = {"shape": args.shape, "layers": arch["num_hidden_layers"],
                    "samples": args.samples, "tokens": real, "response_tokens": response,
                    "max_tokens_per_gpu": max_tokens,
                    "device": torch.cuda.get_device_name() if on_gpu else "cpu",
                    "dtype": "bf16" if on_gpu else "fp32"}
    log_probs = {}
    for packed in paths.values():  # warm-up: allocations and kernels of each path
        backend.packed = packed
        backend.log_probs(_subset(batch, 8))
    for name, packed in paths.items():
        backend.packed = packed
        groups = backend._micro_batches(batch)
        forwarded = sum(len(g) * max(len(batch.tokens[i]) for i in g) for g in groups) \
            if not packed else real
        log_probs[name], seconds, peak = _timed(lambda: backend.log_probs(batch))
        result[name] = {"micro_batches": len(groups), "forwarded_tokens": forwarded,
                        "log_probs_s": seconds, "log_probs_tokens_per_s": real / seconds,
                        "log_probs_peak_gib": peak}
        print(f"{name}: {len(groups)} micro-batches, log-probs {seconds:.2f} s", flush=True)
    # the noise floor: the padded path again, its micro-batches of half the tokens (other
    # shapes, other kernels' rounding), against the first padded pass
    whole = backend.slice
    backend.packed, backend.slice = False, _with_budget(whole, max_tokens // 2)
    log_probs["padded_half"] = backend.log_probs(batch)
    backend.slice = whole
    for key, (a, b) in {"log_prob_abs_diff": ("packed", "padded"),
                        "padded_noise_abs_diff": ("padded_half", "padded")}.items():
        gaps = np.concatenate([np.abs(np.array(x) - np.array(y)) for x, y in
                               zip(log_probs[a], log_probs[b], strict=True)])
        result[f"{key}_mean"], result[f"{key}_max"] = float(gaps.mean()), float(gaps.max())
    rng = np.random.default_rng(args.seed + 1)
    training = TrainBatch(tokens=batch.tokens, prompt_lens=batch.prompt_lens,
                          advantages=rng.normal(size=len(batch)).tolist(),
                          old_log_probs=log_probs["padded"], step_response_tokens=response,
                          step_samples=len(batch))
    for name, packed in paths.items():
        backend.packed = packed
        warm = TrainBatch(tokens=batch.tokens[:8], prompt_lens=batch.prompt_lens[:8],
                          advantages=training.advantages[:8],
                          old_log_probs=training.old_log_probs[:8],
                          step_response_tokens=response, step_samples=len(batch))
        backend.train_step(warm)
        stats, seconds, peak = _timed(lambda: backend.train_step(training))
        result[name].update(train_s=seconds, train_tokens_per_s=real / seconds,
                            train_peak_gib=peak, pg_loss=float(stats["pg_loss"]))
        print(f"{name}: train step {seconds:.2f} s", flush=True)
    for phase in ("log_probs", "train"):
        result[f"{phase}_speedup"] = (result["packed"][f"{phase}_tokens_per_s"]
                                      / result["padded"][f"{phase}_tokens_per_s"])
    result["padding_share"] = 1 - real / result["padded"]["forwarded_tokens"]
    print("RESULT " + json.dumps(result), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
