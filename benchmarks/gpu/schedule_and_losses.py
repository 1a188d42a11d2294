"""On a GPU: vime's Megatron backend (runtime/backends/megatron_train.py) training under a
warmup + cosine learning-rate schedule with each advantage estimator's loss path and each loss
aggregation. Checks that the rate of every step is runtime/core/lr_schedule.py's (the torch
backend's curve) under megatron-core's own scheduler and DistributedOptimizer, that every loss
and gradient norm is finite, and that a checkpoint resumes the schedule where it stopped.

    python benchmarks/gpu/schedule_and_losses.py --out $OUT/schedule.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
from pathlib import Path

import one_gpu
import torch

from runtime.backends.megatron_train import MegatronTrainingBackend
from runtime.core import lr_schedule
from runtime.core.interfaces import TrainBatch
from vime.resolve.model import PRESETS

CASES = [("grpo", "token-mean"), ("gspo", "seq-mean-token-mean"),
         ("rloo", "seq-mean-token-sum-norm"), ("reinforce_plus_plus", "token-mean")]


def _batch(vocab: int, generator: torch.Generator) -> TrainBatch:
    lengths, prompt = (40, 56, 33, 48), 8
    tokens = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]
    batch = TrainBatch(tokens=tokens, prompt_lens=[prompt] * 4, advantages=[1.0, -0.5, 0.3, -0.8])
    batch.step_response_tokens = sum(batch.response_lens())
    batch.step_samples = len(batch)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    arch = {**PRESETS["qwen3-30b-a3b"], "num_hidden_layers": 2, "num_experts": 8,
            "max_position_embeddings": 4096}
    base = one_gpu.train_slice(arch, 4096)
    optimizer = dataclasses.replace(base.optimizer, lr=1e-5, lr_warmup_iters=2,
                                    lr_decay_style="cosine", lr_decay_iters=8, min_lr=1e-6)
    generator = torch.Generator().manual_seed(0)
    results = {"cases": [], "curve": [lr_schedule.learning_rate(s, optimizer)
                                      for s in range(2 * args.steps)]}
    backend = None
    for estimator, aggregation in CASES:
        loss = dataclasses.replace(base.loss, advantage_estimator=estimator,
                                   loss_aggregation=aggregation, max_response_len=64,
                                   eps_clip=3e-4 if estimator == "gspo" else 0.2,
                                   eps_clip_high=4e-4 if estimator == "gspo" else 0.28)
        slice_ = dataclasses.replace(base, optimizer=optimizer, loss=loss)
        if backend is None:
            backend = MegatronTrainingBackend()
            backend.init(slice_)
        else:  # the same model and optimizer, the schedule restarted at step 0
            backend.slice = slice_
            backend.lr_scheduler.num_steps = 0
            backend.lr_scheduler.step(0)
        batch = _batch(arch["vocab_size"], generator)
        batch.old_log_probs = backend.log_probs(batch)
        steps = [backend.train_step(batch) for _ in range(args.steps)]
        lrs = [s["step/lr"] for s in steps]
        results["cases"].append({
            "estimator": estimator, "aggregation": aggregation, "lr": lrs,
            "lr_matches": all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-15)
                              for a, b in zip(lrs, results["curve"], strict=False)),
            "pg_loss": [s["pg_loss"] / s["response_tokens"] for s in steps],
            "clipped_fraction": [s["clipped_tokens"] / s["response_tokens"] for s in steps],
            "grad_norm": [s["step/grad_norm"] for s in steps],
            "finite": all(math.isfinite(s["pg_loss"]) and math.isfinite(s["step/grad_norm"])
                          for s in steps)})
        print(json.dumps(results["cases"][-1]), flush=True)
    # resume: save after the last case's steps, restore into the same backend after more steps
    with tempfile.TemporaryDirectory() as folder:
        backend.save(Path(folder) / "train")
        saved_at = backend.lr_scheduler.num_steps
        batch = _batch(arch["vocab_size"], generator)
        batch.old_log_probs = backend.log_probs(batch)
        for _ in range(2):
            backend.train_step(batch)
        backend.load(Path(folder) / "train")
        resumed = backend.train_step(batch)["step/lr"]
    results["resume"] = {"saved_at": saved_at, "lr_after_load": resumed,
                         "expected": lr_schedule.learning_rate(saved_at, optimizer)}
    results["resume"]["matches"] = math.isclose(resumed, results["resume"]["expected"],
                                                rel_tol=1e-6)
    print(json.dumps(results["resume"]), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
