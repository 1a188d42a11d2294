"""The RL arithmetic: advantage estimators, the clipped policy loss (token- or sequence-level
ratio), loss aggregation, KL estimators, truncated importance sampling (token, sequence and
geometric levels; truncated or masked), entropy. Pure torch
functions on tensors, shared by every training backend (torch and Megatron), so each piece is
tested once against hand-computed numbers and a reference implementation's formula
(tests/runtime/test_algorithm.py, tests/runtime/test_estimators.py).

Conventions (log-probabilities, loss aggregation over a step, tensor shapes; the ones slime
and verl use): docs/design.md, "The RL arithmetic"; the algorithm's keys: docs/runtime.md,
"The algorithm".
"""

from __future__ import annotations

import torch

from runtime.core.slices import LossConfig

KL_ESTIMATORS = ("k1", "k2", "k3")
# slime's --advantage-estimator names (gspo: GRPO's advantages, the sequence-level ratio)
ADVANTAGE_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                        "rloo")
# estimators whose baseline is the prompt's group: nothing to learn from a group of one
GROUP_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus_baseline", "rloo")
# verl's loss_agg_mode names
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# exp of a sequence's mean log-ratio is capped at exp(10), as verl's GSPO loss caps it
MAX_SEQUENCE_LOG_RATIO = 10.0
# whitening's variance floor (verl's masked_whiten, slime's distributed_masked_whiten)
WHITEN_EPS = 1e-8
# algorithm.tis_level and algorithm.tis_mode: the --tis-level and --tis-mode of slime's MIS
# example (examples/train_infer_mismatch_helper/mis.py; its clip mode is truncate with a
# tis_clip_low above 0)
TIS_LEVELS = ("token", "sequence", "geometric")
TIS_MODES = ("truncate", "mask")
# a TIS log-ratio is clamped to [-20, 20] before exp (slime's mis.py SAFETY_BOUND): a
# sequence's summed log-ratio overflows float32's exp from 89
MAX_TIS_LOG_RATIO = 20.0


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


def leave_one_out_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO: each sample's reward minus the mean reward of the other samples of its group,
    which is n / (n - 1) times its deviation from the whole group's mean. A group of one has
    no other sample: its advantage is 0."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not form groups of {group_size}")
    grouped = rewards.float().reshape(-1, group_size)
    if group_size == 1:
        return torch.zeros_like(grouped).reshape(-1)
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - others).reshape(-1)


def whiten(values: torch.Tensor, token_counts: torch.Tensor) -> torch.Tensor:
    """Per-sample values standardised over every response token of the batch: each sample's
    value stands for its token_counts tokens; mean and unbiased variance are over those
    tokens, and (value - mean) / sqrt(variance + 1e-8) is returned (REINFORCE++'s global
    advantage normalisation: verl's masked_whiten on values broadcast to tokens)."""
    values, counts = values.float(), token_counts.float()
    tokens = counts.sum()
    if tokens <= 0:
        return torch.zeros_like(values)
    mean = (values * counts).sum() / tokens
    variance = ((values - mean).square() * counts).sum() / tokens
    if tokens > 1:
        variance = variance * tokens / (tokens - 1)
    return (values - mean) * torch.rsqrt(variance + WHITEN_EPS)


def advantages(rewards: torch.Tensor, group_size: int, estimator: str = "grpo",
               std_normalization: bool = True,
               response_lens: list[int] | torch.Tensor | None = None) -> torch.Tensor:
    """One advantage per sample of a rollout (consecutive groups of group_size samples of the
    same prompt; a single-turn reward at the last token, no discount), by the estimator:

    grpo, gspo                    group_advantages (gspo differs in the loss, not here)
    rloo                          reward minus the mean of the group's other rewards
    reinforce_plus_plus           the rewards whitened over the rollout's response tokens
    reinforce_plus_plus_baseline  reward minus its group's mean, then whitened the same way

    The REINFORCE++ pair need response_lens (tokens per sample), which weight the whitening.

    Raises:
        ValueError: an unknown estimator, rewards not in whole groups, or REINFORCE++
            without response_lens.
    """
    if estimator in ("grpo", "gspo"):
        return group_advantages(rewards, group_size, std_normalization)
    if estimator == "rloo":
        return leave_one_out_advantages(rewards, group_size)
    if estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        if response_lens is None:
            raise ValueError(f"{estimator} whitens over response tokens: pass response_lens")
        counts = torch.as_tensor(response_lens, dtype=torch.float32)
        if estimator == "reinforce_plus_plus_baseline":
            rewards = group_advantages(rewards, group_size, std_normalization=False)
        elif rewards.numel() % group_size:
            raise ValueError(f"{rewards.numel()} rewards do not form groups of {group_size}")
        return whiten(rewards, counts)
    raise ValueError(f"unknown advantage estimator {estimator!r}; one of "
                     f"{', '.join(ADVANTAGE_ESTIMATORS)}")


def token_weights(mask: torch.Tensor, config: LossConfig, step_tokens: float,
                  step_samples: int | None) -> torch.Tensor:
    """What each response token's loss is multiplied by before the sum (config's
    loss_aggregation; mask [samples, tokens] or one sample's [tokens]):

    token-mean               1 / step_tokens
    seq-mean-token-mean      1 / (its sample's tokens x step_samples)
    seq-mean-token-sum-norm  1 / (config.max_response_len x step_samples)   (Dr.GRPO)

    step_tokens and step_samples count the whole optimizer step over every rank.

    Raises:
        ValueError: an unknown aggregation, or a sequence-level one without step_samples.
    """
    mask = mask.float()
    aggregation = config.loss_aggregation
    if aggregation == "token-mean":
        return mask / step_tokens
    if aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {aggregation!r}; one of "
                         f"{', '.join(LOSS_AGGREGATIONS)}")
    if not step_samples:
        raise ValueError(f"loss aggregation {aggregation} needs the step's sample count")
    if aggregation == "seq-mean-token-mean":
        return mask / (mask.sum(dim=-1, keepdim=True).clamp(min=1.0) * step_samples)
    if config.max_response_len < 1:
        raise ValueError("seq-mean-token-sum-norm divides by max_response_len; it is not set")
    return mask / (float(config.max_response_len) * step_samples)


def sequence_log_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor:
    """GSPO's per-token log-ratio: its value on every token of a sample is the sample's
    length-normalised sequence log-ratio mean_t(log pi - log pi_old) (the log of the geometric
    mean of its token ratios), capped at 10; its gradient is each token's own d log pi
    (GSPO-token with sg[s_i], arXiv 2507.18071 eq. 13, verl's compute_policy_loss_gspo)."""
    mask = mask.float()
    token_log_ratio = (log_probs - old_log_probs).detach()
    per_sample = (token_log_ratio * mask).sum(dim=-1, keepdim=True) / \
        mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
    return (log_probs - log_probs.detach() + per_sample).clamp(max=MAX_SEQUENCE_LOG_RATIO)


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


def tis_ratios(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
               mask: torch.Tensor | None = None, level: str = "token") -> torch.Tensor:
    """pi_train_old / pi_rollout on every token at the TIS level (slime's MIS example's
    compute_mis_weights), from the log-ratio d_t = log pi_old(t) - log pi_rollout(t):

    token      exp(d_t), each token's own
    sequence   exp(sum of its sample's d_t): the product of the sample's token ratios
    geometric  exp(mean of its sample's d_t): their geometric mean

    A sample is a row of the last dimension ([samples, tokens], or one sample's [tokens]);
    its sum and mean are over the tokens of `mask` (its response tokens the policy wrote),
    and every token of the sample gets the sample's ratio. The log-ratio is clamped to
    [-20, 20] first. No gradient.

    Raises:
        ValueError: an unknown level, or a sample level without the mask.
    """
    log_ratio = (old_log_probs.float() - rollout_log_probs.float()).detach()
    if level != "token":
        if level not in TIS_LEVELS:
            raise ValueError(f"unknown TIS level {level!r}; one of {', '.join(TIS_LEVELS)}")
        if mask is None:
            raise ValueError(f"the {level} TIS level sums over a sample's tokens: pass the mask")
        mask = mask.float()
        per_sample = (log_ratio * mask).sum(dim=-1, keepdim=True)
        if level == "geometric":
            per_sample = per_sample / mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
        log_ratio = per_sample.expand_as(log_ratio)
    return torch.exp(log_ratio.clamp(min=-MAX_TIS_LOG_RATIO, max=MAX_TIS_LOG_RATIO))


def bounded_tis_weights(ratios: torch.Tensor, clip: float, clip_low: float = 0.0,
                        mode: str = "truncate") -> torch.Tensor:
    """TIS weights from tis_ratios by the mode: truncate clamps each ratio to [clip_low,
    clip] (slime's --tis-mode truncate, and clip with a lower bound); mask keeps a ratio
    inside [clip_low, clip] and gives 0 outside, so that the token (at the sample levels,
    every token of the sample) adds nothing to the loss (slime's --tis-mode mask)."""
    if mode == "truncate":
        return ratios.clamp(min=clip_low, max=clip)
    if mode == "mask":
        return torch.where((ratios >= clip_low) & (ratios <= clip), ratios,
                           torch.zeros_like(ratios))
    raise ValueError(f"unknown TIS mode {mode!r}; one of {', '.join(TIS_MODES)}")


def tis_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, clip: float,
                clip_low: float = 0.0, mask: torch.Tensor | None = None, level: str = "token",
                mode: str = "truncate") -> torch.Tensor:
    """Truncated importance sampling (Yao et al., "Your efficient RL framework secretly brings
    you off-policy RL training", 2025): the rollout engine's sampling distribution differs
    slightly from the trainer's (kernels, precision, MoE routing), so each token's policy
    loss is weighted by pi_train_old / pi_rollout at the level (tis_ratios), truncated to
    [clip_low, clip] or masked outside it (bounded_tis_weights); the weights carry no
    gradient."""
    return bounded_tis_weights(tis_ratios(old_log_probs, rollout_log_probs, mask, level),
                               clip, clip_low, mode)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dimension (pass logits / temperature). The
    definition on whole logits; the training backends compute it a chunk of tokens at a time
    from the hidden states (runtime/core/loss_head.py)."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] per position; logits [..., V], targets [...]. The definition
    on whole logits; the training backends use runtime/core/loss_head.py."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, normalizer: float, config: LossConfig,
                ref_log_probs: torch.Tensor | None = None,
                rollout_log_probs: torch.Tensor | None = None,
                entropy: torch.Tensor | None = None,
                step_samples: int | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss of one micro-batch and the sums its metrics are built from.

    All tensors are per token, same shape ([samples, tokens], or one sample's [tokens]);
    advantages already broadcast to tokens; mask is 1 on response tokens. The clipped
    surrogate (PPO with DAPO's asymmetric clip-higher):

        ratio = exp(log_probs - old_log_probs)       (gspo: exp(sequence_log_ratio))
        pg    = max(-A * ratio, -A * clamp(ratio, 1 - eps_clip, 1 + eps_clip_high))

    times the TIS weight when config.tis (config.tis_level, tis_mode: tis_weights; a token
    that mask mode rejects leaves every term of the loss, as slime's rejection does), plus kl_loss_coef * KL(policy || ref) with the
    chosen estimator, minus entropy_coef * entropy. Each token's term is multiplied by its
    token_weights (config.loss_aggregation; normalizer is the step's response tokens and
    step_samples its samples, over every rank) and summed.

    The returned stats are sums over this micro-batch's tokens (the caller adds them over
    micro-batches and ranks, then divides by the token count): pg_loss, clipped tokens,
    ppo_kl (old - new), kl, entropy, tis weight, tis-truncated tokens (weights truncated or
    masked) and, at the sample levels, samples and tis-truncated samples. They are 0-d tensors
    on the loss's device: reading one (float()) waits for the GPU, which between a forward
    and its backward would hold back the launches of the backward; a step reads them once."""
    mask = mask.float()
    log_ratio = log_probs - old_log_probs
    if config.advantage_estimator == "gspo":
        ratio = torch.exp(sequence_log_ratio(log_probs, old_log_probs, mask))
    else:
        ratio = torch.exp(log_ratio)
    pg_unclipped = -advantages * ratio
    pg_clipped = -advantages * ratio.clamp(1.0 - config.eps_clip, 1.0 + config.eps_clip_high)
    pg = torch.maximum(pg_unclipped, pg_clipped)
    stats = {"clipped_tokens": ((pg_clipped > pg_unclipped).float() * mask).sum(),
             "ppo_kl": (-log_ratio.detach() * mask).sum()}
    kept = mask  # the tokens the loss sums: mask-mode TIS drops the rejected ones
    if config.tis:
        if rollout_log_probs is None:
            raise ValueError("algorithm.tis needs the rollout's log-probs")
        ratios = tis_ratios(old_log_probs, rollout_log_probs, mask, config.tis_level)
        weights = bounded_tis_weights(ratios, config.tis_clip, config.tis_clip_low,
                                      config.tis_mode)
        pg = pg * weights
        outside = ((ratios > config.tis_clip) | (ratios < config.tis_clip_low)).float()
        if config.tis_mode == "mask":
            kept = mask * (1.0 - outside)
        stats["tis_weight"] = (weights * mask).sum()
        stats["tis_truncated_tokens"] = (outside * mask).sum()
        if config.tis_level != "token":  # one weight per sample: count the samples too
            has_tokens = mask.sum(dim=-1) > 0
            stats["tis_samples"] = has_tokens.float().sum()
            stats["tis_truncated_samples"] = (has_tokens & (outside.amax(dim=-1) > 0)).float(
                ).sum()
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
    # the denominators are the whole mask's (slime keeps them when it rejects tokens)
    if config.loss_aggregation == "token-mean":
        loss = (total * kept).sum() / normalizer
    else:
        loss = (total * token_weights(mask, config, normalizer, step_samples) * kept).sum()
    return loss, stats
