"""The learning-rate schedule: runtime/core/lr_schedule.py's curve against numbers by hand and
against megatron-core's own OptimizerParamScheduler (what the Megatron backend steps) at every
step, and the torch backend training on it and resuming where it stopped."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from runtimekit import job_config

from runtime.backends.torch_train import TorchTrainingBackend
from runtime.core import lr_schedule
from runtime.core.interfaces import TrainBatch
from runtime.core.slices import OptimizerSlice


def _optimizer(**schedule) -> OptimizerSlice:
    return OptimizerSlice(lr=1.0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.98,
                          clip_grad=1.0, **schedule)


def test_the_curve_by_hand():
    # warmup 2 from 0: steps 0, 1, 2 -> 0, 0.5, 1; then decay over steps 2..6 to min_lr 0.1
    linear = _optimizer(lr_warmup_iters=2, lr_decay_style="linear", lr_decay_iters=6, min_lr=0.1)
    # step 3: ratio (3 - 2) / (6 - 2) = 0.25 -> 0.1 + 0.75 * 0.9 = 0.775; step 7 > 6: min_lr
    assert [lr_schedule.learning_rate(s, linear) for s in range(8)] == pytest.approx(
        [0.0, 0.5, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1])
    cosine = dataclasses.replace(linear, lr_decay_style="cosine")
    # step 3: 0.1 + 0.5 * (cos(pi / 4) + 1) * 0.9 = 0.868198; step 4: ratio 0.5 -> 0.55
    assert [lr_schedule.learning_rate(s, cosine) for s in (3, 4, 6, 9)] == pytest.approx(
        [0.868198, 0.55, 0.1, 0.1], abs=1e-6)
    constant = dataclasses.replace(linear, lr_decay_style="constant")
    assert [lr_schedule.learning_rate(s, constant) for s in (0, 1, 2, 9)] == [0.0, 0.5, 1.0, 1.0]
    assert lr_schedule.learning_rate(0, _optimizer()) == 1.0  # the default: constant, no warmup
    with pytest.raises(ValueError, match="constant, linear, cosine"):
        lr_schedule.learning_rate(5, dataclasses.replace(linear, lr_decay_style="WSD"))


SCHEDULES = [dict(lr_warmup_iters=w, lr_decay_style=style, lr_decay_iters=12, min_lr=m)
             for style in lr_schedule.LR_DECAY_STYLES for w in (0, 3) for m in (0.0, 0.25)]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: "-".join(map(str, s.values())))
def test_megatron_cores_scheduler_gives_the_same_lr_at_every_step(schedule):
    pytest.importorskip("megatron.core")
    from runtime.backends.megatron_train import lr_scheduler

    opt = _optimizer(**schedule)
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
    adam = torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:]}], lr=123.0)
    scheduler = lr_scheduler(adam, opt)  # sets step 0's lr at once, as in the backend's init
    for step in range(16):
        for group in adam.param_groups:
            assert group["lr"] == pytest.approx(lr_schedule.learning_rate(step, opt),
                                                abs=1e-12), step
        scheduler.step(1)  # after each optimizer step, as the backend's _finish_step


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return job_config(tmp_path_factory.mktemp("lr"))[2]


def _trainer(config, optimizer: OptimizerSlice) -> TorchTrainingBackend:
    backend = TorchTrainingBackend()
    backend.init(dataclasses.replace(config.train_slice(0, "127.0.0.1", 0, 1),
                                     optimizer=optimizer))
    return backend


def _step(trainer: TorchTrainingBackend) -> float:
    batch = TrainBatch(tokens=[[1, 2, 3, 4, 5], [1, 2, 3, 6]], prompt_lens=[2, 2],
                       advantages=[1.0, -1.0])
    batch.old_log_probs = trainer.log_probs(batch)
    batch.rollout_log_probs = batch.old_log_probs  # the tiny spec's TIS reads them
    batch.step_response_tokens = sum(batch.response_lens())
    return trainer.train_step(batch)["step/lr"]


def test_the_torch_backend_steps_on_the_curve_and_resumes_on_it(config, tmp_path):
    optimizer = dataclasses.replace(config.optimizer, lr=1e-3, lr_warmup_iters=2,
                                    lr_decay_style="cosine", lr_decay_iters=6, min_lr=1e-4)
    first = _trainer(config, optimizer)
    curve = [lr_schedule.learning_rate(s, optimizer) for s in range(8)]
    assert [_step(first) for _ in range(3)] == curve[:3]
    first.save(tmp_path / "train")
    second = _trainer(config, optimizer)
    second.load(tmp_path / "train")
    assert [_step(second) for _ in range(5)] == curve[3:]
    assert [_step(first) for _ in range(5)] == curve[3:]
    for name, param in first.params.items():
        assert torch.equal(param, second.params[name]), name
