"""Micro-batches through megatron-core's pipeline schedule, with vime's loss head and GRPO loss
on the last stage (the backend does not call it: it refuses pp > 1, V905).

`forward_step_func(data_iterator, model)` is what megatron-core's schedule
(pipeline_parallel.get_forward_backward_func) calls per micro-batch on every stage; on the
last stage its `loss_func` makes log-probs and entropies (runtime/core/loss_head.py) and the
GRPO loss (runtime/core/algorithm.py). Run on the CPU only
(tests/runtime/test_megatron_pipeline.py). The schedule's contract, the loss's normalisation
and what is not handled (cp, routing replay): docs/design.md, "The pipeline schedule".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from runtime.core import algorithm, loss_head
from runtime.core.slices import LossConfig


@dataclass(frozen=True)
class MicroBatch:
    """One forward of the schedule: every stage reads it (the first for the tokens, the last for
    what the loss needs); tensors on the training device.

    ids, positions: [n, width] token ids and their rotary positions (the first stage's input);
    rows [n, 1], picks [n, R]: where in [n, width] the hidden state that predicts each response
    token sits; targets, mask [n, R]: those tokens and which of them count. The GRPO loss's
    per-token inputs, [n, R]: None in a log-prob pass (and ref/rollout where unused)."""

    ids: torch.Tensor
    positions: torch.Tensor
    rows: torch.Tensor
    picks: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    old_log_probs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    rollout_log_probs: torch.Tensor | None = None


@dataclass(frozen=True)
class Head:
    """How the last stage makes log-probs: the rollout's temperature and top-p, the group the
    output weight's vocabulary is split over (None: not split), whether the entropy is computed
    and whether it carries gradients (only when it is part of the loss: entropy_coef)."""

    temperature: float = 1.0
    top_p: float = 1.0
    vocabulary_group: Any = None
    entropy: bool = False
    entropy_in_loss: bool = False


def forward_step(head: Head, output_processor: Callable, loss: LossConfig | None = None,
                 normalizer: float | None = None,
                 model_kwargs: Mapping[str, Any] | None = None,
                 step_samples: int | None = None) -> Callable:
    """megatron-core's forward_step_func. `output_processor` is GPTModel's hook that returns
    (final hidden states [n, width, h], output weight [V / tp, h]) on the last stage (the
    backend's _head_inputs); `loss` and `normalizer` (the step's response tokens over every
    data-parallel rank) make it a training pass, without them a log-prob pass; `model_kwargs`
    go to the model's call (the backend's Float16Module takes fp32_output=False);
    `step_samples` (the step's samples) is what the sequence-level loss aggregations need."""
    if (loss is None) != (normalizer is None):
        raise ValueError("a training pass needs both the loss config and its normalizer")
    extra = dict(model_kwargs or {})

    def step(data_iterator, model):
        micro = next(data_iterator)
        output = model(micro.ids, micro.positions, None, output_processor=output_processor,
                       **extra)
        return output, functools.partial(_last_stage, micro, head, loss, normalizer,
                                         step_samples)

    return step


def _last_stage(micro: MicroBatch, head: Head, loss: LossConfig | None,
                normalizer: float | None, step_samples: int | None, output):
    """The schedule's loss_func, on the last stage: (loss, response tokens, kept values)."""
    hidden, weight = output
    picked = hidden[micro.rows, micro.picks]
    log_probs, entropy = loss_head.token_terms(
        picked, weight, micro.targets, temperature=head.temperature, top_p=head.top_p,
        entropy=head.entropy, group=head.vocabulary_group)
    if entropy is not None and not (head.entropy_in_loss and torch.is_grad_enabled()):
        entropy = entropy.detach()
    tokens = micro.mask.sum().to(torch.int)
    kept = {"log_probs": log_probs.detach(), "mask": micro.mask}
    if entropy is not None:
        kept["entropy"] = entropy.detach()
    if loss is None:
        # nothing to differentiate: the schedule runs forward only
        return log_probs.new_zeros(()), tokens, kept
    value, stats = algorithm.policy_loss(
        log_probs, micro.old_log_probs, micro.advantages, micro.mask, normalizer, loss,
        ref_log_probs=micro.ref_log_probs, rollout_log_probs=micro.rollout_log_probs,
        entropy=entropy, step_samples=step_samples)
    return value, tokens, {**kept, **stats}


def run(model, micro_batches: Iterable[MicroBatch], step: Callable, *,
        forward_only: bool) -> list[dict]:
    """Every micro-batch through megatron-core's schedule for this rank's pipeline layout; on
    the last stage the kept values of each micro-batch, in order (elsewhere an empty list).
    Training passes leave the gradients in the parameters (or DDP's buffers) for the caller's
    finalize_model_grads and optimizer step, as at pp = 1."""
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.utils import get_model_config

    config = get_model_config(model)
    if not config.calculate_per_token_loss:
        raise ValueError("the pipeline schedule would divide each micro-batch's loss by its "
                         "tokens and micro-batches: vime's loss is divided already "
                         "(calculate_per_token_loss = True)")
    if not config.variable_seq_lengths:
        raise ValueError("vime's micro-batches have their own lengths: the stages exchange "
                         "shapes first (variable_seq_lengths = True)")
    micro_batches = list(micro_batches)
    schedule = get_forward_backward_func()
    # seq_length and micro_batch_size are unused with variable_seq_lengths: each micro-batch's
    # shape goes to the next stage before its hidden states (p2p_communication)
    return schedule(forward_step_func=step, data_iterator=iter(micro_batches), model=[model],
                    num_microbatches=len(micro_batches), seq_length=0, micro_batch_size=0,
                    forward_only=forward_only)


def response_values(kept: list[dict], key: str = "log_probs") -> list[list[float]]:
    """The last stage's per-token values of each sample, micro-batch by micro-batch and row by
    row, its response tokens only (the mask)."""
    out = []
    for values in kept:
        for row, mask in zip(values[key], values["mask"], strict=True):
            out.append(row[mask.bool()].tolist())
    return out


def from_last_stage(value, pipeline_group):
    """`value` of the last stage (any picklable object; ignored elsewhere) on every stage of
    the pipeline group: a collective, every stage calls it."""
    if dist.get_world_size(pipeline_group) == 1:
        return value
    last = dist.get_process_group_ranks(pipeline_group)[-1]
    box = [value if dist.get_rank() == last else None]
    dist.broadcast_object_list(box, src=last, group=pipeline_group)
    return box[0]
