"""Advantage estimators, GSPO's sequence-level ratio and the loss aggregations, against numbers
written out from each reference implementation's formula on the same small inputs.

The rollout below: two prompts, four samples each, with these rewards and response lengths.
"""

from __future__ import annotations

import math

import pytest
import torch

from runtime.core import algorithm
from runtime.core.slices import LossConfig

REWARDS = [1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 1.0]
LENGTHS = [2, 4, 1, 3, 2, 2, 5, 1]  # 20 response tokens


def close(tensor, expected, tol=1e-5):
    assert torch.allclose(torch.as_tensor(tensor, dtype=torch.float32),
                          torch.tensor(expected, dtype=torch.float32), atol=tol), tensor


def _advantages(estimator, **extra):
    return algorithm.advantages(torch.tensor(REWARDS), 4, estimator, response_lens=LENGTHS,
                                **extra)


def test_rloo_is_the_reward_minus_the_mean_of_the_other_samples():
    # verl/trainer/ppo/core_algos.py, compute_rloo_outcome_advantage:
    #   r * n / (n - 1) - mean(group) * n / (n - 1), n = 4
    # group 1, mean 0.375: (1 - 0.375) * 4/3 = 0.833333, (0 - 0.375) * 4/3 = -0.5,
    #                      (0.5 - 0.375) * 4/3 = 0.166667
    # group 2, mean 0.75:  (1 - 0.75) * 4/3 = 0.333333, (0 - 0.75) * 4/3 = -1
    close(_advantages("rloo"),
          [0.833333, -0.5, 0.166667, -0.5, 0.333333, 0.333333, -1.0, 0.333333])
    close(algorithm.advantages(torch.tensor([1.0, 0.0]), 1, "rloo"), [0.0, 0.0])  # no others


def test_reinforce_plus_plus_whitens_the_rewards_over_response_tokens():
    # verl/trainer/ppo/core_algos.py, compute_reinforce_plus_plus_outcome_advantage, gamma 1:
    # every token of a sample returns its reward; verl_F.masked_whiten over the batch's tokens:
    #   mean = sum(L * r) / sum(L) = 7.5 / 20 = 0.375
    #   var  = sum(L * (r - 0.375)^2) / 20 * 20/19 = 4.4375 / 19 = 0.233553 (unbiased)
    #   (r - 0.375) / sqrt(var + 1e-8): 1 -> 1.293265, 0 -> -0.775959, 0.5 -> 0.258653
    close(_advantages("reinforce_plus_plus"),
          [1.293265, -0.775959, 0.258653, -0.775959, 1.293265, 1.293265, -0.775959, 1.293265])


def test_reinforce_plus_plus_baseline_centres_on_the_group_then_whitens():
    # verl/trainer/ppo/core_algos.py, compute_rf_baseline_outcome_advantage (slime's
    # reinforce_plus_plus_baseline with --normalize-advantages): rewards minus the group mean
    #   0.625 -0.375 0.125 -0.375 | 0.25 0.25 -0.75 0.25
    # then whitened over tokens: mean -3.75 / 20 = -0.1875, unbiased variance 0.218750 * 20/19
    close(_advantages("reinforce_plus_plus_baseline"),
          [1.727484, -0.39865, 0.664417, -0.39865, 0.930184, 0.930184, -1.19595, 0.930184])


def test_grpo_and_gspo_share_the_group_advantages():
    grpo = algorithm.group_advantages(torch.tensor(REWARDS), 4)
    close(_advantages("gspo"), grpo.tolist())
    close(_advantages("grpo"), grpo.tolist())


def test_estimators_refuse_what_they_cannot_compute():
    with pytest.raises(ValueError, match="response_lens"):
        algorithm.advantages(torch.tensor(REWARDS), 4, "reinforce_plus_plus")
    with pytest.raises(ValueError, match="groups of 3"):
        algorithm.advantages(torch.tensor(REWARDS), 3, "reinforce_plus_plus", response_lens=LENGTHS)
    with pytest.raises(ValueError, match="one of grpo"):
        algorithm.advantages(torch.tensor(REWARDS), 4, "ppo")


# Two samples of three token slots, the second with two tokens (its third slot masked, with an
# absurd value). Token log-ratios log pi - log pi_old:
#   sample 1 (A = +1): 0.1, -0.2, 0.4        mean 0.1     -> s = exp(0.1) = 1.105171
#   sample 2 (A = -1): 0.001, 0.0002, (5)    mean 0.0006  -> s = exp(0.0006) = 1.000600
# GSPO's clip range [1 - 3e-4, 1 + 4e-4] = [0.9997, 1.0004] (the paper's):
#   sample 1: max(-1.105171, -1.0004) = -1.0004        clipped: no gradient
#   sample 2: max(1.000600, 1.0004)   = 1.000600       unclipped
# Per token: -1.0004 x 3 and 1.000600 x 2: sum -3.0012 + 2.001200 = -1.000000 (to 1e-6)
GSPO = LossConfig(eps_clip=3e-4, eps_clip_high=4e-4, advantage_estimator="gspo",
                  max_response_len=4)
LOG_RATIOS = [[0.1, -0.2, 0.4], [0.001, 0.0002, 5.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
S2 = math.exp(0.0006)


def _gspo(config: LossConfig, **extra):
    old = torch.full((2, 3), math.log(0.5))
    log_probs = (old + torch.tensor(LOG_RATIOS)).requires_grad_(True)
    advantages = torch.tensor([[1.0] * 3, [-1.0] * 3])
    loss, stats = algorithm.policy_loss(log_probs, old, advantages, torch.tensor(MASK), 5.0,
                                        config, step_samples=2, **extra)
    loss.backward()
    return loss.item(), {k: float(v) for k, v in stats.items()}, log_probs.grad


def test_gspo_ratio_is_the_length_normalised_sequence_ratio():
    # verl/trainer/ppo/core_algos.py, compute_policy_loss_gspo: every token of a sample
    # carries s_i = exp(mean_t log ratio) as its value, and d log pi_t as its gradient
    ratio = torch.exp(algorithm.sequence_log_ratio(
        torch.tensor(LOG_RATIOS), torch.zeros(2, 3), torch.tensor(MASK)))
    close(ratio, [[math.exp(0.1)] * 3, [S2] * 3], tol=1e-6)
    loss, stats, grad = _gspo(GSPO)
    # token-mean: -1.000000 / 5 tokens
    assert loss == pytest.approx((-3 * 1.0004 + 2 * S2) / 5, abs=1e-6)
    assert stats["clipped_tokens"] == 3  # all of sample 1
    # sample 2's tokens: -A * s / 5 = 1.000600 / 5; the masked slot and sample 1 nothing
    close(grad, [[0.0, 0.0, 0.0], [S2 / 5, S2 / 5, 0.0]], tol=1e-6)


def test_gspo_differs_from_the_token_ratio_on_the_same_tokens():
    token_loss, token_stats, _ = _gspo(LossConfig(eps_clip=3e-4, eps_clip_high=4e-4))
    # token ratios, each clipped alone (pessimistic max of -A·r and -A·clip(r)):
    #   A = +1: exp(0.1) -> -1.0004 (clipped), exp(-0.2) = 0.818731 -> -0.818731,
    #           exp(0.4) -> -1.0004 (clipped)
    #   A = -1: exp(0.001) = 1.001001 -> 1.001001, exp(0.0002) = 1.0002 -> 1.0002
    expected = (-1.0004 - math.exp(-0.2) - 1.0004 + math.exp(0.001) + math.exp(0.0002)) / 5
    assert token_loss == pytest.approx(expected, abs=1e-6)
    assert token_stats["clipped_tokens"] == 2


@pytest.mark.parametrize("aggregation, expected, grad_token", [
    # verl/trainer/ppo/core_algos.py, agg_loss, with global_batch_size = 2 samples:
    # seq-mean-token-mean: (mean of sample 1, -1.0004, + mean of sample 2, 1.000600) / 2
    ("seq-mean-token-mean", (-1.0004 + S2) / 2, S2 / 2 / 2),
    # seq-mean-token-sum-norm (Dr.GRPO; loss_scale_factor = max_response_len = 4):
    #   (sum of sample 1 + sum of sample 2) / 4 / 2
    ("seq-mean-token-sum-norm", (-3 * 1.0004 + 2 * S2) / 4 / 2, S2 / 4 / 2),
])
def test_sequence_level_aggregations(aggregation, expected, grad_token):
    from dataclasses import replace

    loss, _stats, grad = _gspo(replace(GSPO, loss_aggregation=aggregation))
    assert loss == pytest.approx(expected, abs=1e-6)
    close(grad, [[0.0, 0.0, 0.0], [grad_token, grad_token, 0.0]], tol=1e-6)


def test_tis_and_kl_work_with_every_aggregation():
    from dataclasses import replace

    old = torch.full((2, 3), math.log(0.5))
    rollout = old - math.log(2.0)  # pi_old / pi_rollout = 2 on every token: TIS weight 2
    ref = old + torch.tensor(LOG_RATIOS) - 0.1  # k1 = 0.1 on every token
    plain = {}
    for aggregation in algorithm.LOSS_AGGREGATIONS:
        config = replace(GSPO, loss_aggregation=aggregation)
        plain[aggregation] = _gspo(config)[0]
        weighted, stats, _ = _gspo(replace(config, tis=True, tis_clip=3.0),
                                   rollout_log_probs=rollout)
        assert weighted == pytest.approx(2 * plain[aggregation], abs=1e-6)
        assert stats["tis_weight"] == pytest.approx(2 * 5)
        with_kl, stats, _ = _gspo(replace(config, kl_loss_coef=0.5, kl_estimator="k1"),
                                  ref_log_probs=ref)
        # the KL term 0.5 * 0.1 per token, aggregated as the policy term is: a constant per
        # token adds 0.05 under token-mean and seq-mean-token-mean, and 0.05 * 5 / 4 / 2 under
        # the constant norm (5 tokens over max_response_len 4 and 2 samples)
        added = 0.05 * 5 / 8 if aggregation == "seq-mean-token-sum-norm" else 0.05
        assert with_kl == pytest.approx(plain[aggregation] + added, abs=1e-6)
        assert stats["kl"] == pytest.approx(0.1 * 5, abs=1e-5)


def test_sequence_aggregations_need_the_step_sample_count():
    from dataclasses import replace

    with pytest.raises(ValueError, match="sample count"):
        algorithm.token_weights(torch.ones(2, 3), replace(GSPO, loss_aggregation="seq-mean-token-mean"),
                                6.0, None)
    with pytest.raises(ValueError, match="one of token-mean"):
        algorithm.token_weights(torch.ones(2, 3), replace(GSPO, loss_aggregation="sum"), 6.0, 2)
