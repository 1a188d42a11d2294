"""runtime/core/fused_head.py: the loss head's Triton kernels, run on the CPU by Triton's
interpreter, against the eager chunks of runtime/core/loss_head.py and the unchunked
log-softmax (tests/runtime/test_loss_head.py's reference). Blocks of 16 columns here, so that a
row spans several blocks (the online softmax's rescaling) and ends in a partial one.

Not collected by itself: the interpreter is chosen when Triton is first imported
(TRITON_INTERPRET=1 then; Triton's own library functions are decorated at that import), so
tests/runtime/test_fused_head.py runs this file in a pytest of its own with that variable set.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from megatroncpu import gloo_ranks
from test_loss_head import _inputs, _run, unchunked

from runtime.core import fused_head, loss_head

assert os.environ.get("TRITON_INTERPRET") == "1", "run by tests/runtime/test_fused_head.py"

BLOCK = 16


def _count_calls(calls: dict, setattr_) -> None:
    for name in calls:
        original = getattr(fused_head, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)
        setattr_(fused_head, name, counted)


@pytest.fixture
def kernels(monkeypatch):
    """Small blocks, the kernels' calls counted, and no failure remembered from another test."""
    monkeypatch.setattr(fused_head, "ROW_BLOCK", BLOCK)
    monkeypatch.setattr(fused_head, "GRAD_BLOCK", BLOCK)
    monkeypatch.setattr(fused_head, "_broken", [])
    calls = {"row_stats": 0, "grad_in_place": 0}
    _count_calls(calls, monkeypatch.setattr)
    return calls


def _loss_of(kind):
    weights = None

    def fn(log_probs, entropy):
        nonlocal weights
        weights = torch.linspace(-1.0, 2.0, log_probs.numel()).view_as(log_probs)
        if kind == "entropy":  # no gradient of the log-probs reaches the head
            return (entropy * weights).sum()
        total = (log_probs * weights).sum()
        return total - 0.3 * entropy.sum() if kind == "both" else total
    return fn


def _values(hidden, weight, targets, kind, rows=None, fn=None, **options):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    if fn is None:
        log_probs, entropy = loss_head.token_terms(h, w, targets, rows=rows,
                                                   entropy=kind != "log-probs", **options)
    else:
        log_probs, entropy = fn(h, w, targets, **options)
    _loss_of(kind)(log_probs, entropy).backward()
    return [None if t is None else t.detach().float() for t in (log_probs, entropy, h.grad, w.grad)]


def _assert_close(got, want, atol, rtol, what, names=("log_probs", "entropy", "grad_hidden",
                                                    "grad_weight")):
    for name, a, b in zip(names, got, want, strict=True):
        if a is None:  # the entropy, not asked for
            continue
        error, scale = float((a - b).abs().max()), float(b.abs().max()) or 1.0
        assert error <= atol + rtol * scale, (what, name, error, scale)


# every pair of (what is asked, temperature, vocabulary) once: 64 is whole blocks, 100 ends in
# a partial block (4-11 s a case under the interpreter on a 2-core machine); the fast tier
# runs the two that ask for both values, each temperature and each kind of block among them
SLOW = pytest.mark.slow


@pytest.mark.parametrize(("kind", "temperature", "vocab"), [
    pytest.param("log-probs", 1.0, 64, marks=SLOW), pytest.param("log-probs", 0.7, 100, marks=SLOW),
    ("both", 1.0, 100), ("both", 0.7, 64),
    pytest.param("entropy", 1.0, 64, marks=SLOW), pytest.param("entropy", 0.7, 100, marks=SLOW)])
def test_the_kernels_give_the_unchunked_values_and_gradients_in_fp32(kernels, kind, temperature,
                                                                     vocab):
    hidden, weight, targets = _inputs(ties=False, vocab=vocab)
    want = _values(hidden, weight, targets, kind, fn=lambda h, w, t, **o: unchunked(h, w, t, **o),
                   temperature=temperature)
    for rows in (3, None):  # uneven chunks (forward by 3 tokens, backward by 7 columns), one
        got = _values(hidden, weight, targets, kind, rows=rows, temperature=temperature)
        _assert_close(got, want, atol=2e-6, rtol=5e-6, what=(rows, "fused"))
    assert kernels["row_stats"] > 0 and kernels["grad_in_place"] > 0, kernels


def test_bf16_the_kernels_match_the_eager_chunks(kernels, monkeypatch):
    """bf16 (the Megatron backend's): the same bf16 logits in both; values within fp32
    rounding, gradients within one bf16 rounding of each other."""
    hidden, weight, targets = _inputs(ties=False, dtype=torch.bfloat16, n=120, hidden=32,
                                      vocab=200)
    got = _values(hidden, weight, targets, "both", rows=37, temperature=0.8)
    assert kernels["row_stats"] == 4 and kernels["grad_in_place"] > 0, kernels
    monkeypatch.setenv("VIME_LOSS_HEAD", "eager")
    want = _values(hidden, weight, targets, "both", rows=37, temperature=0.8)
    assert kernels["row_stats"] == 4, "VIME_LOSS_HEAD=eager still ran the kernels"
    _assert_close(got[:2], want[:2], atol=1e-5, rtol=1e-5, what="bf16", names=("log_probs",
                                                                                "entropy"))
    _assert_close(got[2:], want[2:], atol=1e-3, rtol=1e-2, what="bf16", names=("grad_hidden",
                                                                                "grad_weight"))
    unfused = _run(unchunked, hidden, weight, targets, 0.3, temperature=0.8)
    assert float((got[0] - unfused[0]).abs().max()) < 1e-4


def test_a_kernel_that_fails_leaves_the_eager_chunks_and_says_so(kernels, monkeypatch, capsys):
    hidden, weight, targets = _inputs(ties=True)
    want = _values(hidden, weight, targets, "both", rows=5)

    def broken(*_args, **_kwargs):
        raise RuntimeError("no C compiler for Triton's launcher")
    monkeypatch.setattr(fused_head, "row_stats", broken)
    got = _values(hidden, weight, targets, "both", rows=5)
    _assert_close(got, want, atol=2e-6, rtol=2e-6, what="after the failure")
    again = _values(hidden, weight, targets, "both", rows=5)
    _assert_close(again, want, atol=2e-6, rtol=2e-6, what="second step")
    err = capsys.readouterr().err
    assert err.count("vime: loss head: the Triton kernels failed") == 1, err
    assert "no C compiler" in err and "VIME_LOSS_HEAD=eager" in err
    assert not fused_head.usable(hidden)


def test_no_kernel_on_the_cpu_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not fused_head.usable(torch.zeros(1))


# ------------------------------------------------------------------ tensor parallel (gloo)

TP = 2


def _tp_rank(rank: int) -> dict:
    fused_head.ROW_BLOCK = fused_head.GRAD_BLOCK = BLOCK
    calls = {"row_stats": 0, "grad_in_place": 0}
    _count_calls(calls, setattr)
    hidden, weight, targets = _inputs(ties=False, vocab=96)
    part = 96 // TP
    out = {}
    for kind in ("log-probs", "both"):
        h = hidden.clone().requires_grad_()
        w = weight[rank * part:(rank + 1) * part].clone().requires_grad_()
        log_probs, entropy = loss_head.token_terms(h, w, targets, temperature=0.7,
                                                   group=dist.group.WORLD, rows=6)
        _loss_of(kind)(log_probs, entropy).backward()
        out[kind] = (log_probs.detach(), entropy.detach(), h.grad, w.grad)
    out["calls"] = dict(calls, broken=list(fused_head._broken))
    return out


@pytest.mark.slow
def test_tensor_parallel_kernels_give_the_whole_vocabularys_numbers():
    """Each rank's kernels see its 48 columns; the max and the sums rescaled to it are
    all-reduced (loss_head._global_stats)."""
    got = gloo_ranks(_tp_rank, TP)
    hidden, weight, targets = _inputs(ties=False, vocab=96)
    for rank_result in got:
        calls = rank_result.pop("calls")
        assert calls["row_stats"] and calls["grad_in_place"] and not calls["broken"], calls
    for kind in got[0]:
        want = _values(hidden, weight, targets, kind,
                       fn=lambda h, w, t, **o: unchunked(h, w, t, **o), temperature=0.7)
        for rank_result in got:
            log_probs, entropy = rank_result[kind][:2]
            assert torch.allclose(log_probs, want[0], atol=2e-6), kind
            assert torch.allclose(entropy, want[1], atol=2e-6), kind
        assert torch.allclose(sum(r[kind][2] for r in got), want[2], atol=1e-5), kind
        assert torch.allclose(torch.cat([r[kind][3] for r in got]), want[3], atol=1e-5), kind
