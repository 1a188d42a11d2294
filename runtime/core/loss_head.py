"""The loss head: each token's log-prob and the entropy of its distribution, from the last
hidden states and the output layer's weight, a chunk of tokens at a time, with no [tokens,
vocab] tensor kept for the backward (`token_terms`, called by the training backends:
runtime/backends/torch_train.py, runtime/megatron/pipeline.py). Without top-p a chunk's
element-wise work runs in runtime/core/fused_head.py's Triton kernels where they run.

vime/plan/memory.py charges the memory constants below (tests/test_memory.py keeps its copies
equal); tests/runtime/test_loss_head.py measures them on the CPU. The formulas, tensor
parallelism, the backward by columns and the memory model: docs/design.md, "The loss head".
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from runtime.core import fused_head, nucleus

# logits entries per chunk: 64 Mi without top-p (441 tokens of a 151,936-entry vocabulary,
# 0.25 GiB per fp32 [rows, vocab] temporary), 16 Mi with it (110 tokens: its sort holds more)
CHUNK_ENTRIES = 2**26
NUCLEUS_CHUNK_ENTRIES = 2**24
# bytes per entry of a chunk's [rows, width] temporaries at their largest. Without top-p: fp32
# logits and their exponentials (forward), log p and p (backward): 8, measured on the CPU
# (tests/runtime/test_loss_head.py); with fused_head's kernels only the logits in their dtype
# (2 in bf16), still charged as 8: the eager chunks run where the kernels do not, and on the
# H200's grid the head is not at the step's peak (docs/memory-validation.md: the backend step
# with the loss head's Triton kernels, one H200, 2026-12-02).
# With top-p, the cut on the whole row: the fp32 logits, the
# sort's values, softmax and cumulative sum, the masks: 21 measured on the CPU; on CUDA the
# segmented sort also holds double buffers of its keys and int64 indices (12 more), not measured.
CHUNK_BYTES_PER_ENTRY = 8
NUCLEUS_CHUNK_BYTES_PER_ENTRY = 34
# while the backward runs, per output-weight entry: with top-p, the fp32 sum of its gradient over
# chunks of tokens and the bf16 chunk product added to it (or the bf16 copy given back); without,
# the gradient itself in bf16, written a chunk of rows at a time
WEIGHT_GRAD_BYTES = 6
PLAIN_WEIGHT_GRAD_BYTES = 2
# without top-p, per token per hidden entry: the fp32 sum of the hidden states' gradient over the
# chunks of the vocabulary and the bf16 share of one chunk added to it
PLAIN_HIDDEN_GRAD_BYTES = 6


# the backward's columns per chunk are a multiple of this where they are as many: a chunk's
# [tokens, columns] operands then have 256-byte-aligned rows in bf16. Unaligned, cuBLAS falls
# back to slow kernels: on an H200 the 4,089 columns of 16k tokens at Qwen3's vocabulary ran in
# sm75 cutlass kernels at ~120 TFLOP/s, 250 of the loss head's 290 ms (docs/gpu-runs.md)
COLUMN_ALIGN = 128


def chunk_rows(width: int, cut: bool = False) -> int:
    """Tokens per chunk for rows of `width` logits (the whole vocabulary's with top-p: `cut`)."""
    return max(1, (NUCLEUS_CHUNK_ENTRIES if cut else CHUNK_ENTRIES) // max(1, width))


def token_terms(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                temperature: float = 1.0, top_p: float = 1.0, entropy: bool = True,
                group=None, rows: int | None = None):
    """(log-probs [...], entropy [...] or None), fp32, of hidden [..., h] under the output
    weight [V / tp, h] (this rank's rows of the vocabulary in `group`), targets [...] (ids in the
    whole vocabulary). Both outputs are differentiable in hidden and weight; a caller that only
    logs the entropy detaches it (no gradient is then computed for it). `rows`: tokens per chunk
    (chunk_rows by default)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    log_probs, entropies = _LossHead.apply(flat, weight, targets.reshape(-1), float(temperature),
                                           float(top_p), bool(entropy), group, rows)
    return log_probs.view(targets.shape), entropies.view(targets.shape) if entropy else None


def _scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 [rows, V / tp] logits / temperature, a fresh tensor (modified in place by callers)."""
    logits = hidden @ weight.t()
    x = logits.float() if logits.dtype != torch.float32 else logits
    del logits
    if temperature != 1.0:
        x.div_(temperature)
    return x


def _all_columns(x: torch.Tensor, group) -> torch.Tensor:
    """[rows, V] from every rank's [rows, V / tp] columns, in rank order."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _global_stats(stats: torch.Tensor, inside: torch.Tensor, tp: int, group):
    """(peak [rows, 1], sums [3, rows] to all-reduce) from fused_head.row_stats' per-rank
    numbers: the max over the group, and this rank's sums rescaled to it (the eager loop's
    peak and sums)."""
    if tp == 1:  # the target's shifted logit is 0 already where the row has none
        return stats[0].unsqueeze(-1), stats[1:]
    peak = stats[0].clone()
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    step = stats[0] - peak  # 0 on the rank with the max
    scale = step.exp()
    sums = torch.stack([stats[1] * scale, (stats[2] + step) * inside,
                        scale * (stats[3] + step * stats[1])])
    return peak.unsqueeze(-1), sums


class _LossHead(torch.autograd.Function):
    """hidden [N, h], weight [V / tp, h], targets [N] -> (log-probs [N], entropies [N]), fp32;
    `rows` tokens at a time forward and backward, saving the inputs and per-token numbers."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, top_p, want_entropy, group, rows):
        tp = dist.get_world_size(group) if group is not None else 1
        rank = dist.get_rank(group) if group is not None else 0
        n, part = hidden.shape[0], weight.shape[0]
        cut = top_p < 1.0
        rows = rows or chunk_rows(part * tp if cut else part, cut)
        local = targets - rank * part
        inside = (local >= 0) & (local < part)
        local = local.clamp(0, part - 1).unsqueeze(-1)
        f32 = {"dtype": torch.float32, "device": hidden.device}
        log_probs, entropies, log_total = (torch.empty(n, **f32) for _ in range(3))
        if cut:
            normaliser, threshold, share = (torch.empty(n, **f32) for _ in range(3))
            outside = torch.empty(n, dtype=torch.bool, device=hidden.device)
        fused = not cut and fused_head.usable(hidden)
        if fused:  # each token's column in this rank's part, -1 where another rank has it
            columns = torch.where(inside, local.squeeze(-1), -1)
        for start in range(0, n, rows):
            span = slice(start, start + rows)
            if fused:
                try:
                    stats = fused_head.row_stats(hidden[span] @ weight.t(), temperature,
                                                 columns[span], want_entropy)
                except Exception as error:  # noqa: BLE001 - a node's Triton build: eager instead
                    fused_head.failed(error)
                    fused = False
            if fused:
                peak, sums = _global_stats(stats, inside[span], tp, group)
            else:
                x = _scaled_logits(hidden[span], weight, temperature)
            if cut:
                whole = _all_columns(x, group) if tp > 1 else x
                del x
                target = whole.gather(-1, targets[span].unsqueeze(-1))
                cut_at, kept, tied = nucleus.cut(whole, top_p)
                above, at = whole > cut_at, whole == cut_at
                peak = whole.amax(dim=-1, keepdim=True)
                shifted = whole.sub_(peak)
                e = shifted.exp()
                total = e.sum(dim=-1)
                kept_share = kept.to(e.dtype) / tied.to(e.dtype)
                mass = (torch.where(above, e, 0.0).sum(dim=-1)
                        + kept_share.squeeze(-1) * torch.where(at, e, 0.0).sum(dim=-1))
                del above, at
                below = (target < cut_at).squeeze(-1)  # sampled by the engine: counted in
                mass = mass + below * (target - peak).squeeze(-1).exp()
                log_total[span] = peak.squeeze(-1) + total.log()
                normaliser[span] = peak.squeeze(-1) + mass.log()
                log_probs[span] = target.squeeze(-1) - normaliser[span]
                threshold[span], share[span] = cut_at.squeeze(-1), kept_share.squeeze(-1)
                outside[span] = below
                if want_entropy:
                    entropies[span] = total.log() - e.mul_(shifted).sum(dim=-1) / total
                del whole, shifted, e
                continue
            if not fused:
                peak = x.amax(dim=-1, keepdim=True)
                if tp > 1:
                    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
                shifted = x.sub_(peak)
                e = shifted.exp()
                sums = [e.sum(dim=-1),
                        shifted.gather(-1, local[span]).squeeze(-1) * inside[span]]
                if want_entropy:
                    sums.append(e.mul_(shifted).sum(dim=-1))
                del x, shifted, e
                sums = torch.stack(sums)
            if tp > 1:
                dist.all_reduce(sums, group=group)
            log_sum = sums[0].log()
            log_total[span] = peak.squeeze(-1) + log_sum
            log_probs[span] = sums[1] - log_sum
            if want_entropy:
                entropies[span] = log_sum - sums[2] / sums[0]
        saved = [hidden, weight, targets, log_total, entropies]
        if cut:
            saved += [normaliser, threshold, share, outside]
        ctx.save_for_backward(*saved)
        ctx.options = (temperature, cut, want_entropy, group, rows, rank * part)
        ctx.set_materialize_grads(False)
        if not want_entropy:
            ctx.mark_non_differentiable(entropies)
        return log_probs, entropies

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, targets, log_total, entropies, *nucleus_saved = ctx.saved_tensors
        temperature, cut, want_entropy, _group, rows, first = ctx.options
        if not want_entropy:
            grad_entropy = None
        if grad_log_probs is None and grad_entropy is None:
            return (None,) * 8
        part = weight.shape[0]
        local = targets - first
        inside = (local >= 0) & (local < part)
        if not cut:
            return _by_columns(ctx, hidden, weight, local, inside, log_total, entropies,
                               grad_log_probs, grad_entropy)
        local = local.clamp(0, part - 1).unsqueeze(-1)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, hidden.shape[0], rows):
            span = slice(start, start + rows)
            x = _scaled_logits(hidden[span], weight, temperature)
            g = grad_log_probs[span].unsqueeze(-1) if grad_log_probs is not None else None
            grad = None  # -(dloss/dx) but for the target's +g, built in place
            if g is not None:  # this loop is top-p's (the cut's): _by_columns does the rest
                normaliser, threshold, share, outside = (t[span].unsqueeze(-1)
                                                         for t in nucleus_saved)
                # g q, q = w exp(x - normaliser), w: 1 above the cut, the kept share at it, and
                # 1 for a target below it (nucleus._weights)
                grad = torch.where(x > threshold, 1.0, (x == threshold) * share)
                grad.mul_((x - normaliser).exp_())
                below = (x.gather(-1, local[span]) - normaliser).exp_() * outside
                grad.scatter_add_(-1, local[span], below * inside[span, None])
                grad.mul_(g)
            log_p = x.sub_(log_total[span, None])
            if grad_entropy is not None:  # the entropy's part: p g_H (log p + H)
                p = log_p.exp()
                p.mul_(log_p.add_(entropies[span, None]).mul_(grad_entropy[span, None]))
                grad = p if grad is None else grad.add_(p)
                del p
            del log_p
            grad.neg_()
            if g is not None:
                grad.scatter_add_(-1, local[span], g * inside[span, None])
            del x
            if temperature != 1.0:
                grad.div_(temperature)
            grad = grad.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[span] = grad @ weight
            if grad_weight is not None:
                if weight.dtype == torch.float32:
                    grad_weight.addmm_(grad.t(), hidden[span])
                else:
                    grad_weight.add_(grad.t() @ hidden[span])
            del grad
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None


def chunk_columns(tokens: int, part: int, rows: int) -> int:
    """Vocabulary columns per chunk of the backward without top-p: about the forward's logits
    per chunk (rows × part) over every token, rounded down to a multiple of COLUMN_ALIGN
    where there are as many."""
    columns = max(1, min(part, rows * part // max(tokens, 1)))
    if columns >= COLUMN_ALIGN:
        columns -= columns % COLUMN_ALIGN
    return columns


def _by_columns(ctx, hidden, weight, local, inside, log_total, entropies, g, g_entropy):
    """_LossHead's backward without top-p, a chunk of vocabulary columns at a time (the
    module docstring): d log-prob / dx = onehot(t) - p, d entropy / dx = -p (log p + H)."""
    temperature, _cut, _want_entropy, _group, rows, _first = ctx.options
    n, part = hidden.shape[0], weight.shape[0]
    columns = chunk_columns(n, part, rows)
    total = None
    if ctx.needs_input_grad[0]:
        total = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    grad_weight = torch.empty_like(weight) if ctx.needs_input_grad[1] else None
    fused = fused_head.usable(hidden)
    if fused:  # fp32 [N] and contiguous, as the kernel reads them; -1: the target is elsewhere
        g, g_entropy = (t.float().contiguous() if t is not None else None for t in (g, g_entropy))
        target_columns = torch.where(inside, local, -1)
    for start in range(0, part, columns):
        end = min(start + columns, part)
        piece = weight[start:end]
        if fused:
            try:
                grad = fused_head.grad_in_place(hidden @ piece.t(), start, temperature, log_total,
                                                g, g_entropy, entropies, target_columns)
            except Exception as error:  # noqa: BLE001 - a node's Triton build: eager instead
                fused_head.failed(error)
                fused = False
        if not fused:
            grad = _eager_grad(hidden, piece, start, temperature, log_total, entropies, local,
                               inside, g, g_entropy)
        if total is not None:
            total.add_(grad @ piece)
        if grad_weight is not None:
            torch.mm(grad.t(), hidden, out=grad_weight[start:end])
        del grad
    grad_hidden = total.to(hidden.dtype) if total is not None else None
    return grad_hidden, grad_weight, None, None, None, None, None, None


def _eager_grad(hidden, piece, start, temperature, log_total, entropies, local, inside, g,
                g_entropy):
    """The loss's gradient by the logits of the columns start.. (`piece` of the weight) in
    the weight's dtype, by torch's element-wise kernels (fused_head's where it runs)."""
    end = start + piece.shape[0]
    log_p = _scaled_logits(hidden, piece, temperature).sub_(log_total[:, None])
    if g_entropy is not None:  # p (g_H (log p + H) + g)
        grad = log_p.exp()  # p
        coefficient = log_p.add_(entropies[:, None]).mul_(g_entropy[:, None])
        grad.mul_(coefficient.add_(g[:, None]) if g is not None else coefficient)
        del coefficient
    else:
        grad = log_p.exp_().mul_(g[:, None])
    del log_p
    grad.neg_()
    if g is not None:  # the targets in these columns
        here = inside & (local >= start) & (local < end)
        grad.scatter_add_(-1, (local - start).clamp(0, end - start - 1).unsqueeze(-1),
                          (g * here).unsqueeze(-1))
    if temperature != 1.0:
        grad.div_(temperature)
    return grad.to(piece.dtype)
