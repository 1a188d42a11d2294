"""vLLM's top-p nucleus, so that the actor's log-probs are of the distribution the engine
sampled from.

With top_p < 1 vLLM samples from softmax(logits / T) truncated to a nucleus and renormalised,
and reports the sampled token's log-prob under that distribution (`--logprobs-mode
processed_logprobs`). A row's cut is its smallest kept logit (`threshold`) and how many tokens
at exactly that logit are kept. Greedy sampling (temperature 0) applies no top-p in vLLM;
top_p >= 1 is never cut here. vLLM's rule, its Triton kernel, ties and why a target at the
threshold counts as kept: docs/design.md, "vLLM's top-p nucleus".
"""

from __future__ import annotations

import torch

# rows sorted at once: a sort of [rows, V] holds fp32 values and int64 indices (12 bytes an
# entry, 1.9 GB for 1024 rows of Qwen3's 152k vocabulary)
SORT_ROWS = 1024


def cut(logits: torch.Tensor, top_p: float):
    """(threshold, kept, tied) per row of logits [..., V], each [..., 1]: the smallest logit the
    nucleus keeps, how many tokens at exactly that logit it keeps, and how many there are.
    No gradient."""
    vocab = logits.shape[-1]
    # vLLM compares with 1 - p computed in float32; a Python float in the comparison below
    # is taken in the tensor's float32, where this value is exact
    dropped_mass = float(torch.tensor(1.0) - torch.tensor(top_p))
    with torch.no_grad():
        flat = logits.detach().float().reshape(-1, vocab)
        parts = []
        for rows in flat.split(SORT_ROWS):
            ascending = rows.sort(dim=-1).values
            mass = ascending.softmax(dim=-1).cumsum(dim=-1)
            dropped = (mass <= dropped_mass).sum(dim=-1, keepdim=True).clamp(max=vocab - 1)
            threshold = ascending.gather(-1, dropped)
            above = (rows > threshold).sum(dim=-1, keepdim=True)
            parts.append((threshold, vocab - dropped - above,
                          (rows == threshold).sum(dim=-1, keepdim=True)))
        if not parts:  # no rows
            empty = flat.new_empty(0, 1)
            parts = [(empty, empty.long(), empty.long())]
        shape = (*logits.shape[:-1], 1)
        return tuple(torch.cat(column).view(shape) for column in zip(*parts, strict=True))


def mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The tokens of each row's nucleus, a bool [..., V]; of the tokens at the threshold the
    lowest ids, as vLLM's Triton kernel keeps them (for sampling: which tied token is kept
    changes no probability)."""
    threshold, kept, _tied = cut(logits, top_p)
    logits = logits.float()
    at = logits == threshold
    return (logits > threshold) | (at & (at.cumsum(dim=-1) <= kept))


def log_probs(logits: torch.Tensor, targets: torch.Tensor, top_p: float) -> torch.Tensor:
    """log p(target) per position under softmax(logits) cut to the nucleus and renormalised;
    logits [..., V], targets [...]. Differentiable in the logits (the cut is not).

    A target below the threshold, which the engine did sample, is one its numbers put inside
    the nucleus and the actor's (a last-bit difference at the boundary) do not: its log-prob is
    taken under nucleus ∪ {target}, finite and close to the engine's, rather than -inf."""
    x = logits.float()
    flat = x.reshape(-1, x.shape[-1])
    index = targets.reshape(-1, 1)
    threshold, kept, tied = cut(flat, top_p)
    share = kept.to(flat.dtype) / tied.to(flat.dtype)
    target_logit = flat.gather(-1, index).squeeze(-1)
    normaliser = _LogNucleusMass.apply(flat, threshold, share, index)
    return (target_logit - normaliser).view(targets.shape)


def _weights(rows, threshold, share, index):
    """Each token's part in the nucleus mass: 1 above the threshold, the kept share of the
    tied group at it (vLLM keeps `kept` of `tied` equal tokens: spread over all of them, so the
    gradient does not depend on a sort's order), 0 below; and 1 for a target below it."""
    weights = (rows > threshold).to(rows.dtype) + share * (rows == threshold)
    outside = (rows.gather(-1, index) < threshold).to(rows.dtype)
    return weights.scatter_add(-1, index, outside)


class _LogNucleusMass(torch.autograd.Function):
    """log sum_v w_v exp(x_v) per row of x [N, V], w from _weights (no gradient in w).
    SORT_ROWS rows at a time, saving only x: autograd through masked copies of the logits
    would keep several [N, V] tensors where a log-softmax keeps one."""

    @staticmethod
    def forward(ctx, x, threshold, share, index):
        out = x.new_empty(x.shape[0])
        for start in range(0, x.shape[0], SORT_ROWS):
            part = slice(start, start + SORT_ROWS)
            rows = x[part]
            peak = rows.max(dim=-1, keepdim=True).values  # always kept: the mass is >= exp(peak)
            weighted = _weights(rows, threshold[part], share[part], index[part]) * (rows - peak).exp()
            out[part] = peak.squeeze(-1) + weighted.sum(dim=-1).log()
        ctx.save_for_backward(x, threshold, share, index, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, threshold, share, index, out = ctx.saved_tensors
        grad_x = torch.empty_like(x)
        for start in range(0, x.shape[0], SORT_ROWS):
            part = slice(start, start + SORT_ROWS)
            rows = x[part]
            weights = _weights(rows, threshold[part], share[part], index[part])
            grad_x[part] = grad[part, None] * weights * (rows - out[part, None]).exp()
        return grad_x, None, None, None
