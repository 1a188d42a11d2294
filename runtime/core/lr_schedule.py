"""The learning rate of each optimizer step: linear warmup from 0, then constant, linear or
cosine decay to min_lr, Megatron's curve (megatron/core/optimizer_param_scheduler.py,
OptimizerParamScheduler.get_lr, with lr_warmup_init 0 and one scheduler step per optimizer
step). The torch backend sets it before each step; the Megatron backend runs megatron-core's
scheduler itself, and tests/runtime/test_lr_schedule.py checks the two agree at every step.
"""

from __future__ import annotations

import math

from runtime.core.slices import OptimizerSlice

LR_DECAY_STYLES = ("constant", "linear", "cosine")


def learning_rate(step: int, optimizer: OptimizerSlice) -> float:
    """The learning rate of optimizer step `step` (0 for the first step of the run).

    Raises:
        ValueError: an unknown decay style.
    """
    max_lr, min_lr = optimizer.lr, optimizer.min_lr
    warmup, decay = optimizer.lr_warmup_iters, optimizer.lr_decay_iters
    if warmup > 0 and step <= warmup:
        return max_lr * float(step) / float(warmup)
    style = optimizer.lr_decay_style
    if style not in LR_DECAY_STYLES:
        raise ValueError(f"unknown lr_decay_style {style!r}; one of {', '.join(LR_DECAY_STYLES)}")
    if style == "constant":
        return max_lr
    if step > decay:
        return min_lr
    ratio = float(step - warmup) / float(decay - warmup)
    coeff = 1.0 - ratio if style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
    return min_lr + coeff * (max_lr - min_lr)
