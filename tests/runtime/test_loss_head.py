"""runtime/core/loss_head.py: the log-probs and entropy a chunk of tokens at a time,
against the unchunked computation the backends did before (the whole logits hidden @ W.T / T,
a log-softmax over the vocabulary, or the nucleus of runtime/core/nucleus.py with top-p): values
and gradients of the hidden states and of the output weight, with and without top-p, entropy in
the loss, temperature, ties at the nucleus's boundary, chunks of 1 to all tokens, fp32 and bf16,
and tensor parallel (the vocabulary split over two gloo processes).

And its memory on the CPU, where torch's allocator reports no peak: the bytes of the tensors
saved for the backward (saved_tensors_hooks), and the peak of live bytes the CPU allocator
reports to torch's profiler over a forward and backward. The chunked head holds no
[tokens, vocab] tensor: its peak does not grow with tokens × vocab (≤ 4 bytes per token per
vocabulary entry is the bound; it measures ~0), and its chunk temporaries are within the
bytes per entry the planner charges (vime/plan/memory.py). The unchunked figures are shown for
comparison (12 to 28 bytes per token per vocabulary entry).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from megatroncpu import gloo_ranks

from runtime.core import loss_head, nucleus
from runtime.core.memprobe import peak_bytes, saved_bytes

N, HIDDEN, VOCAB = 41, 8, 64


def _inputs(ties: bool, dtype=torch.float32, n=N, hidden=HIDDEN, vocab=VOCAB, seed=3):
    """Hidden states [n, h], weight [V, h], targets [n]. With ties: values on a coarse grid,
    so many logits of a row are equal, also at the nucleus's boundary (as bf16 logits are)."""
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=generator)
    w = torch.randn(vocab, hidden, generator=generator) * 0.7
    if ties:
        h, w = h.round(), (w * 2).round() / 2
    targets = torch.randint(0, vocab, (n,), generator=generator)
    return h.to(dtype), w.to(dtype), targets


def unchunked(hidden, weight, targets, temperature=1.0, top_p=1.0, entropy_in_loss=True):
    """The whole-logits computation: (log-probs, entropy) from the whole logits
    (in fp32, as Megatron's Float16Module gave them), the entropy without gradients and an eighth
    of the rows at a time when it was only a metric (torch_train.entropy_metric's blocks)."""
    x = (hidden @ weight.t()).float() / temperature
    log_p = torch.log_softmax(x, dim=-1)
    if top_p < 1:
        log_probs = nucleus.log_probs(x, targets, top_p)
    else:
        log_probs = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if entropy_in_loss:
        return log_probs, -(log_p.exp() * log_p).sum(dim=-1)
    with torch.no_grad():  # the entropy metric, a few rows at a time (2048 of 16k tokens)
        blocks = log_p.detach().split(max(1, log_p.shape[0] // 8))
        return log_probs, torch.cat([-(b.exp() * b).sum(dim=-1) for b in blocks])


def _loss(log_probs, entropy, entropy_coef):
    weights = torch.linspace(-1.0, 2.0, log_probs.numel()).view_as(log_probs)
    total = log_probs * weights
    return (total - entropy_coef * entropy if entropy_coef else total).sum()


def _run(fn, hidden, weight, targets, entropy_coef, **options):
    """Values and gradients of fn's (log-probs, entropy) under _loss."""
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    log_probs, entropy = fn(h, w, targets, **options)
    _loss(log_probs, entropy, entropy_coef).backward()
    return log_probs.detach().float(), entropy.detach().float(), h.grad.float(), w.grad.float()


def _chunked(rows):
    def fn(h, w, t, **options):
        return loss_head.token_terms(h, w, t, rows=rows, **options)
    return fn


def _close(got, want, atol, rtol=0.0, what=""):
    for name, a, b in zip(("log_probs", "entropy", "grad_hidden", "grad_weight"), got, want,
                          strict=True):
        scale = float(b.abs().max()) or 1.0
        error = float((a - b).abs().max())
        assert error <= atol + rtol * scale, (what, name, error, scale)


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("top_p", [1.0, 0.6, 0.95])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_coef", [0.0, 0.3])
def test_values_and_gradients_are_the_unchunked_ones_in_fp32(ties, top_p, temperature,
                                                              entropy_coef):
    hidden, weight, targets = _inputs(ties)
    options = {"temperature": temperature, "top_p": top_p}
    want = _run(unchunked, hidden, weight, targets, entropy_coef, **options)
    assert torch.isfinite(want[0]).all()
    for rows in (1, 4, 7, N, 10 * N, None):  # uneven chunks, one chunk, the default size
        got = _run(_chunked(rows), hidden, weight, targets, entropy_coef, **options)
        _close(got, want, atol=2e-6, rtol=2e-6, what=rows)


def test_the_cases_differ():
    """The test above can tell the nucleus, the temperature and the entropy bonus apart."""
    hidden, weight, targets = _inputs(ties=False)
    base = _run(unchunked, hidden, weight, targets, 0.0)
    for changed in (_run(unchunked, hidden, weight, targets, 0.0, top_p=0.6),
                    _run(unchunked, hidden, weight, targets, 0.0, temperature=0.7),
                    _run(unchunked, hidden, weight, targets, 0.3)):
        assert (changed[3] - base[3]).abs().max() > 1e-2


@pytest.mark.parametrize("top_p", [1.0, 0.6])
def test_bf16_within_bf16_tolerance(top_p):
    """bf16 hidden states and weight (the Megatron backend's): the logits are the same bf16
    matmul; gradients differ by the rounding of the bf16 gradient of each chunk."""
    hidden, weight, targets = _inputs(ties=False, dtype=torch.bfloat16, n=300, hidden=32,
                                      vocab=256)
    options = {"temperature": 0.8, "top_p": top_p}
    want = _run(unchunked, hidden, weight, targets, 0.3, **options)
    got = _run(_chunked(37), hidden, weight, targets, 0.3, **options)
    _close(got, want, atol=1e-3, rtol=1e-2, what="bf16")
    assert got[2].dtype == torch.float32  # the test's cast; the gradients came back in bf16


def test_without_gradients_nothing_is_kept_and_the_values_are_the_same():
    hidden, weight, targets = _inputs(ties=True)
    want = unchunked(hidden, weight, targets, 0.7, 0.6)
    with torch.no_grad():
        log_probs, entropy = loss_head.token_terms(hidden, weight.requires_grad_(), targets,
                                                   temperature=0.7, top_p=0.6, rows=5)
    assert log_probs.grad_fn is None and entropy.grad_fn is None
    assert torch.allclose(log_probs, want[0], atol=1e-6)
    assert torch.allclose(entropy, want[1], atol=1e-6)
    only, none = loss_head.token_terms(hidden, weight, targets, entropy=False, rows=5)
    assert none is None and torch.allclose(only, unchunked(hidden, weight, targets)[0], atol=1e-6)


def test_shapes_follow_the_targets():
    hidden, weight, targets = _inputs(ties=False, n=24)
    log_probs, entropy = loss_head.token_terms(hidden.view(2, 3, 4, HIDDEN), weight,
                                               targets.view(2, 3, 4), rows=5)
    assert log_probs.shape == entropy.shape == (2, 3, 4)
    assert torch.allclose(log_probs.reshape(-1), unchunked(hidden, weight, targets)[0],
                          atol=1e-6)


def test_default_chunks():
    assert loss_head.chunk_rows(151936) == 441
    assert loss_head.chunk_rows(151936, cut=True) == 110
    assert loss_head.chunk_rows(151936 // 8) == 3533
    assert loss_head.chunk_rows(2**30) == 1


@pytest.mark.parametrize("tokens", [4096, 16384, 24576, 32768, 65536, 100_003])
@pytest.mark.parametrize("part", [151936, 151936 // 2, 151936 // 8, 32768, 152064 // 4])
def test_backward_columns_are_aligned_and_within_the_forwards_chunk(tokens, part):
    """On an H200 the 4,089 unaligned columns of 16k tokens at Qwen3's vocabulary ran in slow
    sm75 kernels (docs/gpu-runs.md, one H200, 2026-12-01): each chunk but the last is a multiple of
    COLUMN_ALIGN, and no chunk holds more logits than a chunk of the forward."""
    rows = loss_head.chunk_rows(part)
    columns = loss_head.chunk_columns(tokens, part, rows)
    assert columns % loss_head.COLUMN_ALIGN == 0 or columns == part
    assert tokens * columns <= max(rows * part, tokens * loss_head.COLUMN_ALIGN)
    assert columns > rows * part // tokens - loss_head.COLUMN_ALIGN


def test_the_16k_token_chunk_at_qwen3s_vocabulary_is_aligned():
    assert 441 * 151936 // 16384 == 4089  # the unaligned width that ran in sm75 kernels
    assert loss_head.chunk_columns(16384, 151936, 441) == 3968  # 31 × 128


def test_aligned_column_chunks_with_a_short_last_one_give_the_unchunked_gradients():
    """COLUMN_ALIGN-wide chunks and a remainder (300 = 128 + 128 + 44 columns), fp32."""
    hidden, weight, targets = _inputs(ties=False, n=10, hidden=16, vocab=300)
    assert loss_head.chunk_columns(10, 300, 5) == 128
    for entropy_coef in (0.0, 0.3):
        got = _run(_chunked(5), hidden, weight, targets, entropy_coef, temperature=0.7)
        want = _run(unchunked, hidden, weight, targets, entropy_coef, temperature=0.7)
        _close(got, want, atol=2e-6, rtol=2e-6, what=entropy_coef)


# ------------------------------------------------------------------ tensor parallel (gloo)

TP = 2


def _tp_rank(rank: int) -> dict:
    hidden, weight, targets = _inputs(ties=True)
    part = VOCAB // TP
    out = {}
    for top_p in (1.0, 0.6):
        for entropy_coef in (0.0, 0.3):
            h = hidden.clone().requires_grad_()
            w = weight.clone().requires_grad_()
            log_probs, entropy = loss_head.token_terms(
                h, w[rank * part:(rank + 1) * part], targets, temperature=0.7,
                top_p=top_p, group=dist.group.WORLD, rows=6)
            _loss(log_probs, entropy, entropy_coef).backward()
            out[top_p, entropy_coef] = (log_probs.detach(), entropy.detach(), h.grad, w.grad)
    return out


def test_tensor_parallel_vocabulary_gives_the_whole_vocabularys_numbers():
    """Each rank holds half of the vocabulary's rows of the weight: its log-probs and
    entropies are the whole ones; its gradients of the hidden states are its part (the
    caller sums them over the group, as megatron-core's sequence-parallel gather does), of the
    weight its rows."""
    got = gloo_ranks(_tp_rank, TP)
    hidden, weight, targets = _inputs(ties=True)
    for top_p, entropy_coef in got[0]:
        want = _run(unchunked, hidden, weight, targets, entropy_coef, temperature=0.7,
                    top_p=top_p)
        for rank_result in got:
            log_probs, entropy, _h, _w = rank_result[top_p, entropy_coef]
            assert torch.allclose(log_probs, want[0], atol=2e-6), top_p
            assert torch.allclose(entropy, want[1], atol=2e-6), top_p
        grad_hidden = sum(r[top_p, entropy_coef][2] for r in got)
        grad_weight = sum(r[top_p, entropy_coef][3] for r in got)  # each its rows
        assert torch.allclose(grad_hidden, want[2], atol=1e-5), (top_p, entropy_coef)
        assert torch.allclose(grad_weight, want[3], atol=1e-5), (top_p, entropy_coef)


# ------------------------------------------------------------------------------- memory


MEASURED_VOCAB, MEASURED_HIDDEN = 8192, 64


def _training_step(fn, n, top_p, entropy_coef, dtype=torch.bfloat16, **options):
    hidden, weight, targets = _inputs(ties=False, dtype=dtype, n=n, hidden=MEASURED_HIDDEN,
                                      vocab=MEASURED_VOCAB)
    weight = torch.nn.Parameter(weight)
    hidden.requires_grad_()

    def step():
        log_probs, entropy = fn(hidden, weight, targets, temperature=0.8, top_p=top_p,
                                **options)
        _loss(log_probs, entropy, entropy_coef).backward()
    return step


def _per_token_entry(measure, fn, top_p, entropy_coef, **options) -> float:
    """Bytes per token per vocabulary entry: the growth of `measure` from 512 to 1024 tokens."""
    small, large = (measure(_training_step(fn, n, top_p, entropy_coef, **options))
                    for n in (512, 1024))
    return (large - small) / (512 * MEASURED_VOCAB)


CASES = [(1.0, 0.0), (1.0, 0.3), (0.9, 0.0), (0.9, 0.3)]  # (top_p, entropy_coef)


@pytest.mark.parametrize("top_p, entropy_coef", CASES)
def test_the_chunked_head_keeps_no_tokens_by_vocabulary_tensor(top_p, entropy_coef, capsys):
    chunked = {measure.__name__: _per_token_entry(measure, loss_head.token_terms, top_p,
                                                  entropy_coef, rows=128)
               for measure in (saved_bytes, peak_bytes)}
    whole = {measure.__name__: _per_token_entry(measure, unchunked, top_p, entropy_coef,
                                                entropy_in_loss=bool(entropy_coef))
             for measure in (saved_bytes, peak_bytes)}
    with capsys.disabled():
        print(f"\n  top_p {top_p}, entropy_coef {entropy_coef}: bytes per token per vocabulary "
              f"entry, bf16, vocab {MEASURED_VOCAB}: saved for backward "
              f"{whole['saved_bytes']:.2f} unchunked / {chunked['saved_bytes']:.3f} chunked; "
              f"peak {whole['peak_bytes']:.2f} / {chunked['peak_bytes']:.3f}")
    # the bound, with what it grows by per token: the hidden states (h entries) and a
    # few numbers, ~(4h + 40) / V here
    bound = (4 * MEASURED_HIDDEN + 64) / MEASURED_VOCAB
    assert chunked["saved_bytes"] <= 4 and chunked["peak_bytes"] <= 4
    assert chunked["saved_bytes"] <= bound and chunked["peak_bytes"] <= bound
    assert whole["saved_bytes"] >= 4 and whole["peak_bytes"] >= 12  # today's, for comparison


@pytest.mark.parametrize("top_p, entropy_coef", CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_chunk_temporaries_are_within_what_the_planner_charges(top_p, entropy_coef, dtype):
    """The peak grows with the chunk's rows by at most (NUCLEUS_)CHUNK_BYTES_PER_ENTRY per
    entry, and what does not grow with them is at most WEIGHT_GRAD_BYTES per weight entry and
    the per-token numbers (the planner's other two parts of the loss head)."""
    n = 1024
    peaks = {rows: peak_bytes(_training_step(loss_head.token_terms, n, top_p, entropy_coef,
                                             dtype=dtype, rows=rows))
             for rows in (64, 256)}
    per_entry = (peaks[256] - peaks[64]) / (192 * MEASURED_VOCAB)
    cut = top_p < 1
    charged = loss_head.NUCLEUS_CHUNK_BYTES_PER_ENTRY if cut else loss_head.CHUNK_BYTES_PER_ENTRY
    assert per_entry <= charged + 64 / MEASURED_VOCAB, per_entry  # and a few numbers per row
    if not cut:
        assert per_entry >= charged - 1.5  # the constant is the measurement, rounded up
    rest = peaks[256] - per_entry * 256 * MEASURED_VOCAB
    # without top-p the weight's gradient is in its own dtype (the planner's 2 bytes: bf16), and
    # the hidden states' gradient is summed in fp32
    weight_grad = (loss_head.WEIGHT_GRAD_BYTES if cut else
                   loss_head.PLAIN_WEIGHT_GRAD_BYTES * torch.finfo(dtype).bits / 16)
    per_token = 4 * MEASURED_HIDDEN + 64 + (0 if cut else
                                            loss_head.PLAIN_HIDDEN_GRAD_BYTES * MEASURED_HIDDEN)
    assert rest <= weight_grad * MEASURED_VOCAB * MEASURED_HIDDEN + n * per_token, rest
