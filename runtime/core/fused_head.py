"""The loss head's element-wise work as two Triton kernels, one pass over each chunk of logits
(runtime/core/loss_head.py without top-p): `row_stats` (forward: per row the max, the sum of
exponentials, the target's logit and the entropy's sum, by an online softmax) and
`grad_in_place` (backward: the chunk's logits turned into their gradient in place).

The formulas are loss_head's eager ones; tests/runtime/test_fused_head.py runs both through
Triton's interpreter on the CPU and compares. Used where the tensors are on a GPU and Triton
imports, unless VIME_LOSS_HEAD=eager; a kernel that fails to build is logged once and the
eager chunks run instead. What it saves and the formulas: docs/design.md, "The loss head's kernels".
"""

from __future__ import annotations

import os
import sys

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU torch without Triton: the eager chunks
    triton = None

# columns per block of a program: forward, one program per row loops over its blocks (a
# 151,936-entry row is 38 blocks); backward, one program per block of a row
ROW_BLOCK = 4096
GRAD_BLOCK = 1024

_broken: list[str] = []  # the first build failure's message, when there was one


def usable(tensor: torch.Tensor) -> bool:
    """Whether the kernels run on `tensor`'s device: a GPU, or the CPU under Triton's
    interpreter (TRITON_INTERPRET=1, the tests)."""
    if triton is None or _broken or os.environ.get("VIME_LOSS_HEAD", "") == "eager":
        return False
    return tensor.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def failed(error: Exception) -> None:
    """Remember a kernel's build or launch failure (the eager chunks from then on), logged once."""
    if not _broken:
        _broken.append(f"{type(error).__name__}: {error}")
        print(f"vime: loss head: the Triton kernels failed ({_broken[0][:300]}); the eager "
              "chunks instead (VIME_LOSS_HEAD=eager skips the kernels)", file=sys.stderr,
              flush=True)


if triton is not None:

    @triton.jit
    def _row_stats_kernel(logits, stride, width, temperature, targets, out, rows,
                          ENTROPY: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = logits + row.to(tl.int64) * stride
        peak = tl.full((), float("-inf"), tl.float32)
        total = tl.zeros((), tl.float32)
        weighted = tl.zeros((), tl.float32)
        for start in range(0, width, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < width
            x = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32) / temperature
            grown = tl.maximum(peak, tl.max(x, 0))
            step = tl.where(total > 0, peak - grown, 0.0)  # m - m' (0 before the first block)
            scale = tl.exp(step)
            shifted = x - grown
            e = tl.where(inside, tl.exp(shifted), 0.0)
            if ENTROPY:
                weighted = scale * (weighted + step * total) + tl.sum(
                    tl.where(inside, e * shifted, 0.0), 0)
            total = total * scale + tl.sum(e, 0)
            peak = grown
        target = tl.load(targets + row)
        hit = target >= 0
        x_t = tl.load(base + tl.where(hit, target, 0)).to(tl.float32) / temperature
        tl.store(out + row, peak)
        tl.store(out + rows + row, total)
        tl.store(out + 2 * rows + row, tl.where(hit, x_t - peak, 0.0))
        tl.store(out + 3 * rows + row, weighted)

    @triton.jit
    def _grad_kernel(logits, stride, width, first, temperature, log_total, g, g_entropy,
                     entropies, targets, HAS_G: tl.constexpr, HAS_ENTROPY: tl.constexpr,
                     BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < width
        where = logits + row.to(tl.int64) * stride + cols
        x = tl.load(where, mask=inside, other=0.0)
        log_p = x.to(tl.float32) / temperature - tl.load(log_total + row)
        p = tl.exp(log_p)
        coefficient = tl.zeros_like(p)
        if HAS_G:
            g_row = tl.load(g + row)
            coefficient += g_row
        if HAS_ENTROPY:
            coefficient += (log_p + tl.load(entropies + row)) * tl.load(g_entropy + row)
        grad = -p * coefficient
        if HAS_G:
            grad += tl.where(cols + first == tl.load(targets + row), g_row, 0.0)
        tl.store(where, (grad / temperature).to(x.dtype), mask=inside)


def row_stats(logits: torch.Tensor, temperature: float, targets: torch.Tensor,
              entropy: bool) -> torch.Tensor:
    """[4, rows] fp32 of a contiguous [rows, width] chunk: max, sum of exp, the target's shifted
    logit (0 where `targets`, the column within the chunk, is -1), the entropy's sum (0 unless
    `entropy`)."""
    rows, width = logits.shape
    out = torch.empty(4, rows, dtype=torch.float32, device=logits.device)
    _row_stats_kernel[(rows,)](logits, logits.stride(0), width, float(temperature), targets,
                               out, rows, ENTROPY=bool(entropy), BLOCK=ROW_BLOCK, num_warps=8)
    return out


def grad_in_place(logits: torch.Tensor, first: int, temperature: float, log_total: torch.Tensor,
                  g: torch.Tensor | None, g_entropy: torch.Tensor | None,
                  entropies: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss's gradient by a contiguous [tokens, columns] chunk of logits (the vocabulary's
    columns first.. of this rank's part), written over them; `targets`: each token's column in
    the part, -1 where it is on another rank."""
    rows, width = logits.shape
    ones = log_total  # any fp32 [rows] pointer stands in for an absent gradient
    _grad_kernel[(rows, triton.cdiv(width, GRAD_BLOCK))](
        logits, logits.stride(0), width, first, float(temperature), log_total,
        g if g is not None else ones, g_entropy if g_entropy is not None else ones, entropies,
        targets, HAS_G=g is not None, HAS_ENTROPY=g_entropy is not None, BLOCK=GRAD_BLOCK,
        num_warps=4)
    return logits
