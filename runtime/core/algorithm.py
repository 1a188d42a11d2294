"""The GRPO arithmetic: advantages, the clipped policy loss, KL estimators, truncated
importance sampling, entropy. Pure torch functions on tensors, shared by every training
backend (the torch pair here, Megatron in issue 7), so each piece is tested once against
hand-computed numbers (tests/runtime/test_algorithm.py).

Conventions (the ones slime and verl use, noted where they differ):
- log-probabilities are of the sampled token under the distribution the rollout sampled
  from: softmax(logits / temperature), with top_p < 1 cut to vLLM's nucleus and renormalised
  (runtime/core/nucleus.py, issue 14); the rollout backend returns the same quantity, so the two
  can be compared (TIS, the mismatch metric). The entropy stays that of the whole
  softmax(logits / temperature);
- a loss is a sum over response tokens divided by the number of response tokens of the
  whole optimizer step across all data-parallel ranks (token-level mean, DAPO's choice and
  slime's --calculate-per-token-loss), so gradient accumulation and DP all-reduce (SUM)
  give exactly the mean over the step.
"""

from __future__ import annotations

import torch

from runtime.core.slices import LossConfig

KL_ESTIMATORS = ("k1", "k2", "k3")


def group_advantages(rewards: torch.Tensor, group_size: int, std_normalization: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """GRPO: each sample's reward minus its prompt group's mean, divided by the group's
    standard deviation (unbiased, as torch.std and slime) plus eps when std_normalization.

    rewards holds consecutive groups of group_size samples of the same prompt. A group of
    one has no baseline: its advantage is 0 (slime turns std normalisation off for n = 1)."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not form groups of {group_size}")
    grouped = rewards.float().reshape(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if std_normalization and group_size > 1:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1)


def kl_estimate(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy
    (J. Schulman, "Approximating KL divergence", 2020), with r = ref / policy:

    k1 = log policy - log ref                       (unbiased, high variance, can be < 0)
    k2 = (log policy - log ref)^2 / 2               (biased, low variance)
    k3 = (r - 1) - log r                            (unbiased, >= 0; slime's low_var_kl)

    k3 is clamped to [-10, 10] as slime and verl do, so one token whose reference
    probability collapsed cannot dominate the loss."""
    log_ratio = log_probs.float() - ref_log_probs.float()
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        neg = -log_ratio  # log r
        return (torch.exp(neg) - 1 - neg).clamp(min=-10.0, max=10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; one of {', '.join(KL_ESTIMATORS)}")


def tis_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, clip: float,
                clip_low: float = 0.0) -> torch.Tensor:
    """Truncated importance sampling (Yao et al., "Your efficient RL framework secretly brings
    you off-policy RL training", 2025): the rollout engine's sampling distribution differs
    slightly from the trainer's (kernels, precision, MoE routing), so each token's policy
    loss is weighted by pi_train_old / pi_rollout, truncated to [clip_low, clip]; the weights
    carry no gradient."""
    ratio = torch.exp(old_log_probs.float() - rollout_log_probs.float())
    return ratio.clamp(min=clip_low, max=clip).detach()


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dimension (pass logits / temperature). The
    definition on whole logits; the training backends compute it a chunk of tokens at a time
    from the hidden states (runtime/core/loss_head.py, issue 18)."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] per position; logits [..., V], targets [...]. The definition
    on whole logits; the training backends use runtime/core/loss_head.py (issue 18)."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, normalizer: float, config: LossConfig,
                ref_log_probs: torch.Tensor | None = None,
                rollout_log_probs: torch.Tensor | None = None,
                entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO loss of one micro-batch and the sums its metrics are built from.

    All tensors are per token, same shape; advantages already broadcast to tokens; mask is 1
    on response tokens. The clipped surrogate (PPO with DAPO's asymmetric clip-higher):

        ratio = exp(log_probs - old_log_probs)
        pg    = max(-A * ratio, -A * clamp(ratio, 1 - eps_clip, 1 + eps_clip_high))

    times the TIS weight when config.tis, plus kl_loss_coef * KL(policy || ref) with the
    chosen estimator, minus entropy_coef * entropy. Summed over masked tokens and divided by
    normalizer (the step's response tokens over every rank).

    The returned stats are sums over this micro-batch's tokens (the caller adds them over
    micro-batches and ranks, then divides by the token count): pg_loss, clipped tokens,
    ppo_kl (old - new), kl, entropy, tis weight, tis-truncated tokens. They are 0-d tensors
    on the loss's device: reading one (float()) waits for the GPU, which between a forward
    and its backward would hold back the launches of the backward; a step reads them once."""
    mask = mask.float()
    log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    pg_unclipped = -advantages * ratio
    pg_clipped = -advantages * ratio.clamp(1.0 - config.eps_clip, 1.0 + config.eps_clip_high)
    pg = torch.maximum(pg_unclipped, pg_clipped)
    stats = {"clipped_tokens": ((pg_clipped > pg_unclipped).float() * mask).sum(),
             "ppo_kl": (-log_ratio.detach() * mask).sum()}
    if config.tis:
        if rollout_log_probs is None:
            raise ValueError("algorithm.tis needs the rollout's log-probs")
        weights = tis_weights(old_log_probs, rollout_log_probs, config.tis_clip,
                              config.tis_clip_low)
        pg = pg * weights
        stats["tis_weight"] = (weights.detach() * mask).sum()
        raw = torch.exp(old_log_probs - rollout_log_probs)
        stats["tis_truncated_tokens"] = (
            ((raw > config.tis_clip) | (raw < config.tis_clip_low)).float() * mask).sum()
    stats["pg_loss"] = (pg.detach() * mask).sum()
    total = pg
    if ref_log_probs is not None:
        kl = kl_estimate(log_probs, ref_log_probs, config.kl_estimator)
        stats["kl"] = (kl.detach() * mask).sum()
        if config.kl_loss_coef:
            total = total + config.kl_loss_coef * kl
    if entropy is not None:
        stats["entropy"] = (entropy.detach() * mask).sum()
        if config.entropy_coef:
            total = total - config.entropy_coef * entropy
    loss = (total * mask).sum() / normalizer
    return loss, stats
