"""The two seams of the runtime: a training backend and a rollout backend.

The driver (runtime/rl/loop.py) talks to every backend through these methods only, inside a
Ray actor per training rank and per rollout engine (runtime/workers/host.py). Implementations:

    training  "torch"     runtime/backends/torch_train.py    (CPU or one GPU, DP over ranks)
              "megatron"  runtime/backends/megatron_train.py (GPUs, megatron-core)
    rollout   "torch"     runtime/backends/torch_rollout.py  (one device per engine)
              "vllm"      runtime/backends/vllm_rollout.py   (a vLLM engine per GPU group)

A backend receives its slice of the plan (runtime/core/slices.py) as frozen, typed data; it never
sees the whole spec. docs/runtime.md is the contract in prose, with the call order.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from runtime.core.slices import EngineSlice, TrainSlice

# ----------------------------------------------------------------------------------- rollout


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    top_p: float
    max_new_tokens: int
    stop_token_ids: tuple[int, ...]
    return_routed_experts: bool = False


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    seed: int  # per request, so a rollout replays exactly after a resume (vLLM: SamplingParams.seed)


@dataclass
class Generation:
    """One sampled response.

    token_ids: the response tokens, including the stop token when one ended it.
    log_probs: per response token, log p(token) under the distribution it was sampled from:
        softmax(logits / temperature), and with top_p < 1 cut to vLLM's top-p nucleus and
        renormalised (vLLM's processed log-probs; runtime/core/nucleus.py); greedy
        sampling applies no top-p.
    finish_reason: "stop" (a stop token) or "length" (max_new_tokens reached).
    routed_experts: when asked, an integer array [prompt + response tokens - 1, MoE layers,
        top-k]: the experts each token was routed to when it was fed to the model (the last
        token never is), slime's R3 layout and vLLM's (runtime/megatron/routing.py lays it out for
        Megatron's routers); None otherwise.
    loss_mask: from a rollout function (runtime/rl/custom_rollout.py), per token 1 where the
        policy wrote it, 0 for tool output between its turns (whose log_probs are 0.0);
        None: every token is the policy's.
    """

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: Literal["stop", "length"]
    routed_experts: np.ndarray | None = None
    loss_mask: list[int] | None = None


@dataclass(frozen=True)
class WeightBucket:
    """Part of a weight update: HF checkpoint names (model.layers.0.mlp.experts.3.up_proj.weight)
    to tensors. An update is a sequence of buckets of one version; the last has last=True,
    after which the engine generates with that version."""

    version: int
    tensors: dict = field(hash=False)
    last: bool


class RolloutBackend(abc.ABC):
    """One rollout engine (possibly several GPUs: vLLM's TP × DP inside it).

    States: started -> awake; sleep() frees device memory (level 1: weights to host, KV
    cache dropped; level 2: weights dropped too, an update must come before generating);
    wake(tags) brings back "weights" and/or "kv_cache". generate() needs both awake and
    weights present; calling it otherwise raises.

    Optional capabilities have defaults here: `transfer_backend`, `resident_bytes`,
    `healthy`, `where_ranks`, `stop`."""

    # vLLM's weight-transfer backend the engine started with ("nccl", "ipc"); None: the
    # engine takes the update_weights fallback (runtime/workers/weight_sync.py)
    transfer_backend: str | None = None

    @abc.abstractmethod
    def start(self, slice: EngineSlice) -> None:
        """Load the model (or build it from its architecture) on this engine's devices."""

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Generation]:
        """Generate one response per request, in order.

        Raises:
            RuntimeError: the engine is asleep or holds no weights (see the states above).
        """

    @abc.abstractmethod
    def update_weights(self, bucket: WeightBucket) -> None:
        """Copy the bucket's tensors into the engine's weights (HF names)."""

    @abc.abstractmethod
    def weight_version(self) -> int:
        """Return the version of the last complete update (0 before any)."""

    @abc.abstractmethod
    def sleep(self, level: int = 1) -> None:
        """Free device memory for the trainer (colocated runs)."""

    @abc.abstractmethod
    def wake(self, tags: Sequence[str] = ("weights", "kv_cache")) -> None:
        """Re-allocate what sleep() freed."""

    def resident_bytes(self) -> int:
        """Return the device bytes the engine holds now; -1 when the backend cannot tell."""
        return -1

    def healthy(self) -> bool:
        """Answer the supervisor's health check (runtime/workers/supervisor.py): True when
        every part of the engine answers; an engine of one process is healthy if it answers
        at all."""
        return True

    def where_ranks(self) -> list[dict] | None:
        """Return where each data-parallel rank of the engine runs (runtime/workers/
        dp_engine.py); None for an engine of one rank."""
        return None

    def stop(self) -> None:  # noqa: B027  (optional: most backends need nothing)
        """Release everything (the job is ending)."""


# ---------------------------------------------------------------------------------- training


@dataclass
class TrainBatch:
    """Samples for one call, columnar. Token lists hold prompt + response; every per-token
    list (log-probs, loss mask) covers the response tokens only. A rollout function's
    "response" is everything after the prompt: the turns the policy wrote and the tool
    output between them, which loss_mask marks 0 (context: fed to the model, not trained)."""

    tokens: list[list[int]]
    prompt_lens: list[int]
    advantages: list[float] | None = None
    rollout_log_probs: list[list[float]] | None = None
    old_log_probs: list[list[float]] | None = None
    ref_log_probs: list[list[float]] | None = None
    routed_experts: list[np.ndarray] | None = None
    # per response token, 1 where the policy wrote it (trained) and 0 for tool or environment
    # output (context); None: every response token trains
    loss_mask: list[list[int]] | None = None
    # response tokens of the whole optimizer step over every rank: the loss divides by it
    step_response_tokens: int | None = None
    # samples of the whole optimizer step over every rank: the sequence-level loss
    # aggregations divide by it (runtime/core/algorithm.py, token_weights)
    step_samples: int | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def response_lens(self) -> list[int]:
        return [len(t) - p for t, p in zip(self.tokens, self.prompt_lens, strict=True)]

    def trained_tokens(self) -> list[int]:
        """Per sample, the response tokens the loss counts (loss_mask's ones)."""
        if self.loss_mask is None:
            return self.response_lens()
        return [sum(row) for row in self.loss_mask]

    def select(self, indices: Sequence[int]) -> TrainBatch:
        def pick(column):
            return None if column is None else [column[i] for i in indices]

        return TrainBatch(
            tokens=pick(self.tokens), prompt_lens=pick(self.prompt_lens),
            advantages=pick(self.advantages), rollout_log_probs=pick(self.rollout_log_probs),
            old_log_probs=pick(self.old_log_probs), ref_log_probs=pick(self.ref_log_probs),
            routed_experts=pick(self.routed_experts), loss_mask=pick(self.loss_mask),
            step_response_tokens=self.step_response_tokens, step_samples=self.step_samples)


class TrainingBackend(abc.ABC):
    """One rank of the actor. The driver calls every method on every rank (SPMD), each with
    its share of the samples; collectives between ranks are the backend's business.

    States: init -> onloaded; offload() moves weights, gradients and optimizer state off the
    device (colocated runs, while the engines generate); onload() brings them back.
    log_probs and train_step need the onloaded state; export_weights, save and load work in
    both.

    Optional capabilities have defaults here: `exports_on_every_rank`, `resident_bytes`,
    `save_hf`, `begin_save` / `finish_save`, `stop`."""

    # True: export_weights(every_rank=True) yields every tensor on every rank (vLLM's IPC
    # transfer needs it); False: the ranks share the tensors and only together hold them all
    exports_on_every_rank: bool = False

    @abc.abstractmethod
    def init(self, slice: TrainSlice) -> None:
        """Join the rank's process groups, build or load the model, the reference model
        (when slice.needs_ref) and the optimizer."""

    @abc.abstractmethod
    def log_probs(self, batch: TrainBatch, model: Literal["actor", "ref"] = "actor"
                  ) -> list[list[float]]:
        """Return, per sample, the log-probs of its response tokens under the current actor weights
        (or the reference weights), at the rollout temperature."""

    @abc.abstractmethod
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """Take one optimizer step on this rank's share of the step's samples (old_log_probs and
        advantages filled in; ref_log_probs when a KL loss is on; rollout_log_probs for TIS).
        Returns sums over this rank's response tokens ("response_tokens", "pg_loss",
        "clipped_tokens", "ppo_kl", "kl", "entropy", ...) and per-step scalars prefixed
        with "step/" (grad_norm, lr), which the driver combines."""

    @abc.abstractmethod
    def export_weights(self, bucket_bytes: int, every_rank: bool = False,
                       on_device: bool = False) -> Iterator[dict]:
        """Yield the current weights under HF checkpoint names, in buckets of about bucket_bytes.
        Called on every rank (gathers may be collective); ranks holding nothing to send
        yield nothing. every_rank (for backends with `exports_on_every_rank`): every rank
        yields every tensor (vLLM's IPC transfer: each rank shares its copies with the
        engine worker on its GPU). on_device: copies on the backend's device instead of the
        host (vLLM's transfer engines send from the GPU)."""

    @abc.abstractmethod
    def offload(self) -> None:
        """Free the device for the rollout engines."""

    @abc.abstractmethod
    def onload(self) -> None:
        """Take the device back (what offload() moved away)."""

    @abc.abstractmethod
    def save(self, path: Path) -> None:
        """Write this rank's part of the model, optimizer and RNG state under path (a folder
        shared by all ranks, not yet visible as a checkpoint: the driver renames it when
        every rank is done)."""

    def begin_save(self, path: Path) -> None:
        """Start save(path) with the write in the background (checkpoint.async_save): copy
        what the next steps change to host memory, return, and write from that copy until
        finish_save. A write still running from the previous call is waited for first. The
        default writes everything before it returns (save)."""
        self.save(path)

    def finish_save(self) -> float:
        """Wait for the write begin_save started and return its seconds in the background
        (0.0 when none runs). Called on every rank at the same point of the loop (a
        backend's finish may be collective).

        Raises:
            Exception: what the background write raised (its folder is then incomplete).
        """
        return 0.0

    @abc.abstractmethod
    def load(self, path: Path) -> None:
        """Restore what save() wrote."""

    def save_hf(self, path: Path) -> None:
        """Write the current weights as an HF model folder into path (a folder that exists,
        shared by all ranks): model.safetensors and config.json, by
        runtime/core/hf_folder.py's write_weights, from one rank. Called on every rank (the
        gather may be collective); works in both states.

        Raises:
            NotImplementedError: the backend cannot export HF weights (V441 says so before
                the queue).
        """
        raise NotImplementedError(f"the {type(self).__name__} training backend cannot write "
                                  "HF checkpoints")

    def resident_bytes(self) -> int:
        """Return the device bytes this rank holds now; -1 when the backend cannot tell."""
        return -1

    def stop(self) -> None:  # noqa: B027  (optional: most backends need nothing)
        """Release everything (the job is ending)."""
