"""The GRPO pieces against numbers computed by hand (the comments show the arithmetic)."""

from __future__ import annotations

import math

import pytest
import torch

from runtime.core import algorithm
from runtime.core.slices import LossConfig

LN2 = math.log(2)


def close(tensor, expected, tol=1e-5):
    assert torch.allclose(torch.as_tensor(tensor, dtype=torch.float32),
                          torch.tensor(expected, dtype=torch.float32), atol=tol), tensor


def test_group_advantages_centre_and_scale_each_group():
    # group [1, 0]: mean 0.5, unbiased std sqrt(0.25 + 0.25) = 0.70711 -> ±0.5 / 0.70711
    # group [1, 2, 6] (n = 3 below): mean 3, deviations -2 -1 3, var (4 + 1 + 9) / 2 = 7
    close(algorithm.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2),
          [0.707106, -0.707106, -0.707106, 0.707106])
    close(algorithm.group_advantages(torch.tensor([1.0, 2.0, 6.0]), 3),
          [-2 / math.sqrt(7), -1 / math.sqrt(7), 3 / math.sqrt(7)])
    close(algorithm.group_advantages(torch.tensor([1.0, 2.0, 6.0]), 3, std_normalization=False),
          [-2.0, -1.0, 3.0])


def test_group_advantages_give_no_signal_without_variance():
    close(algorithm.group_advantages(torch.tensor([0.5, 0.5, 0.2, 0.2]), 2), [0, 0, 0, 0])
    close(algorithm.group_advantages(torch.tensor([1.0, 0.0]), 1), [0.0, 0.0])  # no baseline
    with pytest.raises(ValueError, match="groups of 4"):
        algorithm.group_advantages(torch.tensor([1.0, 0.0, 1.0]), 4)


def test_kl_estimators_by_hand():
    # policy 0.5, reference 0.25: log ratio ln 2; r = ref / policy = 0.5
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    close(algorithm.kl_estimate(logp, ref, "k1"), [LN2])
    close(algorithm.kl_estimate(logp, ref, "k2"), [LN2 ** 2 / 2])  # 0.240227
    close(algorithm.kl_estimate(logp, ref, "k3"), [0.5 - 1 + LN2])  # r - 1 - ln r = 0.193147
    # the other way round: r = 2 -> k1 = -ln 2 (negative), k3 = 2 - 1 - ln 2 = 0.306853
    close(algorithm.kl_estimate(ref, logp, "k1"), [-LN2])
    close(algorithm.kl_estimate(ref, logp, "k3"), [1 - LN2])
    # a collapsed reference would give exp(20): k3 is clamped at 10 as slime does
    close(algorithm.kl_estimate(torch.tensor([0.0]), torch.tensor([20.0]), "k3"), [10.0])
    with pytest.raises(ValueError, match="k1, k2, k3"):
        algorithm.kl_estimate(logp, ref, "low_var")


def test_tis_weights_are_truncated_ratios_without_gradient():
    old = torch.tensor([math.log(0.5), math.log(0.1), math.log(0.3)], requires_grad=True)
    rollout = torch.tensor([math.log(0.1), math.log(0.5), math.log(0.3)])
    close(algorithm.tis_weights(old, rollout, clip=2.0), [2.0, 0.2, 1.0])  # 5 -> 2
    weights = algorithm.tis_weights(old, rollout, clip=2.0, clip_low=0.5)
    close(weights, [2.0, 0.5, 1.0])  # 0.2 -> 0.5
    assert not weights.requires_grad


def test_entropy_and_token_log_probs():
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3)]])
    # uniform over 2: ln 2; p = (0.25, 0.75): -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.562335
    close(algorithm.entropy_from_logits(logits), [LN2, 0.562335])
    close(algorithm.token_log_probs(logits, torch.tensor([0, 1])), [math.log(0.5), math.log(0.75)])


# Four response tokens (and a fifth, masked, with absurd values):
#   advantage  +1    +1    -1    -1
#   ratio      1.5   0.9   0.5   1.1     eps_clip 0.2, eps_clip_high 0.28 -> [0.8, 1.28]
#   -A·r      -1.5  -0.9   0.5   1.1
#   -A·clip   -1.28 -0.9   0.8   1.1
#   max       -1.28 -0.9   0.8   1.1     sum -0.28; clipped: tokens 1 and 3
RATIOS = [1.5, 0.9, 0.5, 1.1, 50.0]
ADVANTAGES = [1.0, 1.0, -1.0, -1.0, 100.0]
MASK = [1, 1, 1, 1, 0]


def _loss(config: LossConfig, **extra):
    old = torch.full((5,), math.log(0.4))
    log_probs = (old + torch.log(torch.tensor(RATIOS))).clone().requires_grad_(True)
    loss, stats = algorithm.policy_loss(log_probs, old, torch.tensor(ADVANTAGES),
                                        torch.tensor(MASK), 4.0, config, **extra)
    loss.backward()
    return loss, {key: float(value) for key, value in stats.items()}, log_probs.grad


def test_clipped_policy_loss_by_hand():
    loss, stats, grad = _loss(LossConfig(eps_clip=0.2, eps_clip_high=0.28))
    assert loss.item() == pytest.approx(-0.28 / 4)
    assert stats["pg_loss"] == pytest.approx(-0.28)
    assert stats["clipped_tokens"] == 2
    # ppo_kl = sum(old - new) = -(ln 1.5 + ln 0.9 + ln 0.5 + ln 1.1) = 0.297733
    assert stats["ppo_kl"] == pytest.approx(0.297733, abs=1e-5)
    # clipped tokens carry no gradient; the others -A·r / 4; the masked one nothing
    close(grad, [0.0, -0.9 / 4, 0.0, 1.1 / 4, 0.0])


def test_truncated_importance_sampling_weights_the_loss():
    old = torch.full((5,), math.log(0.4))
    # pi_old / pi_rollout = 1, 3 (truncated to 2), 0.5, 1, 1
    rollout = old - torch.log(torch.tensor([1.0, 3.0, 0.5, 1.0, 1.0]))
    loss, stats, _ = _loss(LossConfig(tis=True, tis_clip=2.0), rollout_log_probs=rollout)
    # -1.28·1 - 0.9·2 + 0.8·0.5 + 1.1·1 = -1.58
    assert loss.item() == pytest.approx(-1.58 / 4)
    assert stats["tis_weight"] == pytest.approx(1 + 2 + 0.5 + 1)
    assert stats["tis_truncated_tokens"] == 1
    with pytest.raises(ValueError, match="rollout's log-probs"):
        _loss(LossConfig(tis=True))


def test_kl_loss_and_entropy_bonus_add_to_the_loss():
    old = torch.full((5,), math.log(0.4))
    log_probs_now = old + torch.log(torch.tensor(RATIOS))
    ref = log_probs_now - 0.1  # k1 = 0.1 on every token
    entropy = torch.tensor([1.0, 2.0, 3.0, 4.0, 99.0])
    loss, stats, _ = _loss(LossConfig(kl_loss_coef=0.1, kl_estimator="k1", entropy_coef=0.01),
                           ref_log_probs=ref, entropy=entropy)
    # -0.28 + 0.1 · (4 × 0.1) - 0.01 · (1 + 2 + 3 + 4) = -0.28 + 0.04 - 0.1 = -0.34
    assert loss.item() == pytest.approx(-0.34 / 4, abs=1e-6)
    assert stats["kl"] == pytest.approx(0.4, abs=1e-5)
    assert stats["entropy"] == pytest.approx(10.0)
    # with the coefficients at 0 both are still measured (k3, the default: 4 tokens of
    # e^-0.1 - 1 + 0.1 = 0.0048374) but leave the loss alone
    loss, stats, _ = _loss(LossConfig(), ref_log_probs=ref, entropy=entropy)
    assert loss.item() == pytest.approx(-0.28 / 4)
    assert stats["kl"] == pytest.approx(4 * (math.exp(-0.1) - 0.9), abs=1e-5)
