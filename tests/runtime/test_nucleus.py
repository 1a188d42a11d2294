"""runtime/core/nucleus.py against a plain reading of vLLM's top-p rule (vllm/v1/sample/ops/
topk_topp_sampler.py, apply_top_k_top_p_pytorch, top-p only): sort ascending, softmax,
cumulative sum, mask where it is <= 1 - p (in float32), never the largest, log-softmax of
what is left. On random logits with and without ties, for p in {0.3, 0.6, 0.95, 1.0}, and on
hand-computed boundaries."""

from __future__ import annotations

import math

import pytest
import torch

from runtime.core import nucleus

VOCAB = 64


def vllm_processed_log_probs(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """[N, V] log-probs as vLLM reports them with --logprobs-mode processed_logprobs."""
    ascending, order = logits.sort(dim=-1)
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    p = torch.full((logits.shape[0], 1), top_p, dtype=torch.float32)
    dropped = cumulative <= 1 - p
    dropped[:, -1] = False
    kept = torch.empty_like(logits).scatter(-1, order, ascending.masked_fill(dropped, -math.inf))
    return kept.log_softmax(dim=-1)


def _logits(ties: bool, rows: int = 400) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(rows, VOCAB, generator=generator) * 2
    # a coarse grid (as bf16 logits are, more coarsely): many tokens share a value, also at
    # the boundary of the nucleus
    return (logits * 2).round() / 2 if ties else logits


def _expected(logits, targets, top_p):
    """The reference's log-prob where vLLM kept the target; for a target vLLM dropped, the
    one nucleus.py promises: at the threshold, the kept tied tokens' value (the sort chose
    which of equal tokens to keep); below it, under nucleus ∪ {target}."""
    reference = vllm_processed_log_probs(logits, top_p)
    log_mass = torch.logsumexp(logits.masked_fill(reference.isinf(), -math.inf), dim=-1)
    threshold = logits.masked_fill(reference.isinf(), math.inf).min(dim=-1).values
    target_logit = logits.gather(-1, targets[:, None]).squeeze(-1)
    below = target_logit < threshold
    expected = target_logit - torch.where(below, torch.logaddexp(log_mass, target_logit),
                                          log_mass)
    dropped = reference.gather(-1, targets[:, None]).squeeze(-1).isinf()
    return expected, reference, dropped & ~below, below


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("top_p", [0.3, 0.6, 0.95, 1.0])
def test_log_probs_are_vllms_processed_log_probs(top_p, ties):
    logits = _logits(ties)
    targets = torch.randint(0, VOCAB, (logits.shape[0],), generator=torch.Generator().manual_seed(5))
    expected, reference, tied_dropped, below = _expected(logits, targets, top_p)
    got = nucleus.log_probs(logits, targets, top_p)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()
    kept_by_vllm = ~(tied_dropped | below)
    assert torch.allclose(got[kept_by_vllm], reference.gather(-1, targets[:, None]).squeeze(-1)
                          [kept_by_vllm], atol=1e-5, rtol=0)
    if top_p == 1.0:
        assert torch.allclose(got, torch.log_softmax(logits, -1).gather(-1, targets[:, None])
                              .squeeze(-1), atol=1e-6, rtol=0)
    else:  # the cases the rule is about were met
        assert below.any()
        if ties:
            assert tied_dropped.any()


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("top_p", [0.3, 0.6, 0.95, 1.0])
def test_mask_keeps_as_many_tokens_of_the_same_values_as_vllm(top_p, ties):
    logits = _logits(ties)
    kept = nucleus.mask(logits, top_p)
    reference = ~vllm_processed_log_probs(logits, top_p).isinf()
    assert torch.equal(kept.sum(-1), reference.sum(-1))
    for row in range(logits.shape[0]):  # the same values: only which of equal tokens differs
        assert torch.equal(logits[row][kept[row]].sort().values,
                           logits[row][reference[row]].sort().values)
    threshold, _kept, _tied = nucleus.cut(logits, top_p)
    at = logits == threshold
    assert torch.equal(kept & ~at, reference & ~at)


def test_the_boundary_is_vllms():
    uniform = torch.zeros(1, 4)  # probabilities 0.25 exactly; cumulative 0.25, 0.5, 0.75, 1
    for top_p, kept in [(0.5, 2), (0.75, 3), (0.3, 2), (0.76, 4), (0.25, 1), (1e-9, 1),
                        (0.50000002, 2)]:
        # dropped where the cumulative mass is <= 1 - p: at p = 0.5 the second token's 0.5
        # is dropped; the largest is kept whatever p. 1 - p is taken in float32, as vLLM's
        # p tensor is: 0.50000002 is 0.5 there (in float64 1 - p would round to 0.49999997
        # and keep 3)
        assert int(nucleus.mask(uniform, top_p).sum()) == kept, top_p
        assert int((~vllm_processed_log_probs(uniform, top_p).isinf()).sum()) == kept, top_p
        for target in range(4):  # each of the tied tokens counts as one of the kept
            got = nucleus.log_probs(uniform, torch.tensor([target]), top_p)
            assert math.isclose(float(got), -math.log(kept), abs_tol=1e-6)
    logits = torch.tensor([[0.0, 1.0, 3.0]])
    assert nucleus.mask(logits, 1e-9).tolist() == [[False, False, True]]
    assert float(nucleus.log_probs(logits, torch.tensor([2]), 1e-9)) == 0.0
    # a target outside: nucleus ∪ {target}
    assert math.isclose(float(nucleus.log_probs(logits, torch.tensor([0]), 1e-9)),
                        -math.log1p(math.exp(3.0)), rel_tol=1e-6)


def test_gradients_are_those_of_the_renormalised_nucleus():
    logits = _logits(ties=False, rows=64).requires_grad_()
    targets = torch.randint(0, VOCAB, (64,), generator=torch.Generator().manual_seed(6))
    weights = torch.linspace(-1, 2, 64)
    (nucleus.log_probs(logits, targets, 0.6) * weights).sum().backward()
    # autograd through the masked log-softmax, the target added where it was dropped
    leaf = logits.detach().clone().requires_grad_()
    kept = nucleus.mask(leaf, 0.6).scatter(-1, targets[:, None], True)
    log_p = leaf.masked_fill(~kept, -math.inf).log_softmax(-1)
    (log_p.gather(-1, targets[:, None]).squeeze(-1) * weights).sum().backward()
    assert torch.allclose(logits.grad, leaf.grad, atol=1e-6, rtol=0)

    tied = torch.zeros(1, 4, requires_grad=True)  # 2 of 4 equal tokens kept at p = 0.5
    nucleus.log_probs(tied, torch.tensor([0]), 0.5).backward()
    # d/dx of x_0 - log(0.5 * sum exp x): the kept share spread evenly over the tied tokens
    assert torch.allclose(tied.grad, torch.tensor([[0.75, -0.25, -0.25, -0.25]]))


def test_chunks_and_shapes_change_nothing(monkeypatch):
    logits = _logits(ties=True, rows=60).view(3, 20, VOCAB)
    targets = torch.randint(0, VOCAB, (3, 20), generator=torch.Generator().manual_seed(7))
    whole = nucleus.log_probs(logits, targets, 0.6)
    assert whole.shape == (3, 20)
    monkeypatch.setattr(nucleus, "SORT_ROWS", 7)
    assert torch.equal(nucleus.log_probs(logits, targets, 0.6), whole)
    assert torch.equal(nucleus.mask(logits, 0.6).view(60, VOCAB),
                       nucleus.mask(logits.view(60, VOCAB), 0.6))
