"""slime's TIS levels and modes (algorithm.tis_level, algorithm.tis_mode) in the loss: the
weights against numpy's direct formula on hand-made ratios (slime's MIS example,
examples/train_infer_mismatch_helper/mis.py: token exp(d), sequence exp(sum d), geometric
exp(mean d) over a sample's loss-mask tokens; truncate clamps, mask gives 0 outside the bounds
and leaves the token out of every term), and the torch backend's train_step on a padded batch
of two samples of different lengths, whose sequence weight is each sample's own."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from runtimekit import job_config

from runtime.backends.torch_train import TorchTrainingBackend
from runtime.core import algorithm
from runtime.core.interfaces import TrainBatch
from runtime.core.slices import LossConfig

# two samples of 4 and 2 response tokens (the second padded to 4, its padding absurd);
# d = log pi_old - log pi_rollout per token
LOG_RATIOS = np.array([[0.3, -0.1, 0.5, 0.2], [-0.4, -0.3, 9.0, 9.0]])
MASK = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=float)


def _expected(level: str) -> np.ndarray:
    """The level's ratio per token, straight from the definitions."""
    if level == "token":
        return np.exp(LOG_RATIOS)
    sums = (LOG_RATIOS * MASK).sum(axis=1, keepdims=True)
    if level == "geometric":
        sums = sums / MASK.sum(axis=1, keepdims=True)
    return np.broadcast_to(np.exp(sums), LOG_RATIOS.shape)


def _tensors():
    old = torch.full(LOG_RATIOS.shape, math.log(0.3), dtype=torch.float64)
    return old, old - torch.from_numpy(LOG_RATIOS), torch.from_numpy(MASK)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_ratios_are_the_levels_formula(level):
    old, rollout, mask = _tensors()
    ratios = algorithm.tis_ratios(old, rollout, mask, level).numpy()
    # sequence: exp(0.9) = 2.4596 and exp(-0.7) = 0.4966; geometric: exp(0.225), exp(-0.35)
    np.testing.assert_allclose(ratios * MASK, _expected(level) * MASK, rtol=1e-6)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_truncate_and_mask_bound_the_ratios(level):
    old, rollout, mask = _tensors()
    expected = _expected(level)
    truncated = algorithm.tis_weights(old, rollout, 2.0, 0.5, mask, level, "truncate")
    np.testing.assert_allclose(truncated.numpy() * MASK, np.clip(expected, 0.5, 2.0) * MASK,
                               rtol=1e-6)
    masked = algorithm.tis_weights(old, rollout, 2.0, 0.5, mask, level, "mask")
    inside = (expected >= 0.5) & (expected <= 2.0)
    np.testing.assert_allclose(masked.numpy() * MASK, np.where(inside, expected, 0.0) * MASK,
                               rtol=1e-6)


def test_a_sequence_sum_beyond_floats_range_is_bounded_not_infinite():
    old = torch.zeros(1, 200)
    weights = algorithm.tis_weights(old, old - 1.0, 2.0, 0.0, torch.ones(1, 200), "sequence",
                                    "mask")  # exp(200) is inf in float32
    assert torch.isfinite(weights).all() and weights.eq(0).all()


def _policy_loss(level: str, mode: str, aggregation: str = "token-mean"):
    old, rollout, mask = _tensors()
    log_probs = old.clone().requires_grad_(True)  # ratio 1: pg = -A
    advantages = torch.tensor([[1.0] * 4, [-2.0] * 4], dtype=torch.float64)
    config = LossConfig(tis=True, tis_clip=2.0, tis_clip_low=0.5, tis_level=level,
                        tis_mode=mode, loss_aggregation=aggregation, entropy_coef=0.1)
    entropy = torch.full(LOG_RATIOS.shape, 1.0, dtype=torch.float64)
    loss, stats = algorithm.policy_loss(log_probs, old, advantages, mask, 6.0, config,
                                        rollout_log_probs=rollout, entropy=entropy,
                                        step_samples=2)
    return loss.item(), {k: float(v) for k, v in stats.items()}


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_the_loss_weighs_each_token_by_its_samples_weight(level):
    expected = _expected(level)
    advantages = np.array([[1.0], [-2.0]])
    for mode in ("truncate", "mask"):
        inside = (expected >= 0.5) & (expected <= 2.0)
        if mode == "truncate":
            weights, kept = np.clip(expected, 0.5, 2.0), MASK
        else:  # a rejected token leaves the entropy term too; the denominator stays 6
            weights, kept = np.where(inside, expected, 0.0), MASK * inside
        loss, stats = _policy_loss(level, mode)
        want = ((-advantages * weights * MASK).sum() - 0.1 * kept.sum()) / 6.0
        assert loss == pytest.approx(want, rel=1e-6), mode
        assert stats["tis_weight"] == pytest.approx((weights * MASK).sum(), rel=1e-6)
        assert stats["tis_truncated_tokens"] == ((~inside) * MASK).sum()
        if level == "token":
            assert "tis_samples" not in stats
        else:
            assert stats["tis_samples"] == 2
            assert stats["tis_truncated_samples"] == ((~inside) * MASK).any(axis=1).sum()


def test_seq_mean_aggregation_keeps_each_samples_own_token_count_when_masking():
    # sequence level: sample 0's ratio 2.46 is rejected, sample 1's 0.50 is not (0.4966 < 0.5:
    # rejected too) -> at the geometric level, both kept: exp(0.225) = 1.25, exp(-0.35) = 0.70
    loss, _ = _policy_loss("geometric", "mask", "seq-mean-token-mean")
    weights = np.exp([0.225, -0.35])
    want = ((-1.0 * weights[0] - 0.1) * 4 / 4 + (2.0 * weights[1] - 0.1) * 2 / 2) / 2
    assert loss == pytest.approx(want, rel=1e-6)
    loss, _ = _policy_loss("sequence", "mask", "seq-mean-token-mean")
    assert loss == pytest.approx(0.0, abs=1e-12)  # both samples rejected: nothing trained


# ------------------------------------------------------------- through the torch backend

class GradientsKept(TorchTrainingBackend):
    """The torch backend, its gradients kept before its optimizer step."""

    def _finish_step(self):
        self.grads = {n: p.grad.clone() for n, p in self.model.named_parameters()
                      if p.grad is not None}
        return super()._finish_step()


def _trainer(config, loss: LossConfig) -> GradientsKept:
    backend = GradientsKept()
    backend.init(dataclasses.replace(config.train_slice(0, "127.0.0.1", 0, 1), loss=loss,
                                     micro_batch_size=2, dynamic_batch=False))
    return backend


def test_a_train_step_weighs_each_sample_of_a_micro_batch_by_its_own_ratio(tmp_path):
    _, _, config = job_config(tmp_path)
    tokens = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14]]  # responses of 4 and 2 tokens, one micro-batch
    prompt_lens = [2, 2]
    trainer = _trainer(config, LossConfig(tis=True, tis_clip=2.0, tis_clip_low=0.5,
                                          tis_level="sequence"))
    old = trainer.log_probs(TrainBatch(tokens=tokens, prompt_lens=prompt_lens))
    rollout = [[v - d for v, d in zip(row, LOG_RATIOS[i], strict=False)]
               for i, row in enumerate(old)]
    stats = trainer.train_step(TrainBatch(
        tokens=tokens, prompt_lens=prompt_lens, advantages=[1.0, -2.0], old_log_probs=old,
        rollout_log_probs=rollout, step_response_tokens=6, step_samples=2))
    # sample 0: exp(0.9) = 2.46 truncated to 2 on its 4 tokens; sample 1: exp(-0.7) = 0.497
    # truncated to 0.5 on its 2: each sample's own weight, not one for the micro-batch
    assert stats["tis_weight"] == pytest.approx(4 * 2.0 + 2 * 0.5, rel=1e-5)
    assert (stats["tis_samples"], stats["tis_truncated_samples"]) == (2, 2)
    # the gradient is the untruncated loss's with each sample's weight in its advantage
    reference = _trainer(config, LossConfig())
    reference.train_step(TrainBatch(tokens=tokens, prompt_lens=prompt_lens,
                                    advantages=[2.0, -1.0], old_log_probs=old,
                                    step_response_tokens=6, step_samples=2))
    assert trainer.grads.keys() == reference.grads.keys() and trainer.grads
    for name, grad in trainer.grads.items():
        torch.testing.assert_close(grad, reference.grads[name], rtol=1e-5, atol=1e-7,
                                   msg=name)


def test_the_spec_keys_reach_the_loss_and_the_metrics(tmp_path):
    from runtimekit import in_process_loop, metrics

    _, _, config = job_config(tmp_path, rollout__num_rollout="1", eval__at_start="false",
                              eval__at_end="false", algorithm__tis_level='"geometric"',
                              algorithm__tis_mode='"mask"', algorithm__tis_clip="1.0001",
                              algorithm__tis_clip_low="0.9999")
    loss = config.train_slice(0, "127.0.0.1", 0, 1).loss
    assert (loss.tis, loss.tis_level, loss.tis_mode) == (True, "geometric", "mask")
    in_process_loop(config).run()
    [record] = metrics(config.job_dir)
    # the torch engine's and actor's log-probs agree to ~1e-7 on the CPU, so a sample's
    # geometric ratio is kept (weight ~1) or masked (0): the numbers' values are the tests above
    share = record["train/tis_truncated_sample_fraction"]
    assert 0.0 <= share <= 1.0
    assert record["train/tis_weight"] == pytest.approx(1.0 - record[
        "train/tis_truncated_fraction"], abs=2e-4)
