"""Routing replay layout: vLLM's routed experts -> what each Megatron router sees."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.megatron.routing import (
    ReplayLayout,
    batch_routes,
    local_routes,
    moe_layer_routes,
    packed_routes,
    per_layer,
    sample_routes,
)


def token_routes(length: int, layers: int = 2, topk: int = 2, offset: int = 0) -> np.ndarray:
    """Routes that name their own token: route[t, l, k] = 1000·(offset + t) + 10·l + k."""
    t = np.arange(length - 1)[:, None, None] + offset
    return (1000 * t + 10 * np.arange(layers)[None, :, None] + np.arange(topk)[None, None, :]).astype(np.int64)


def token_of(routes: np.ndarray) -> np.ndarray:
    return routes[:, 0, 0] // 1000


def test_one_sample_keeps_vllms_rows_and_fills_the_last_token():
    routed = token_routes(5).astype(np.uint16)
    routes = sample_routes(routed, 5, moe_layers=2)
    assert routes.dtype == np.int64 and routes.shape == (5, 2, 2)
    assert list(token_of(routes)) == [0, 1, 2, 3, 3]  # token 4 borrows token 3's route


def test_context_parallel_gives_rank_r_chunks_r_and_2cp_minus_1_minus_r():
    layout = ReplayLayout(cp=2, pad_multiple=4)
    routed = [token_routes(9)]  # 8 routed tokens + the last one; padded to 12, chunks of 3
    rank0 = token_of(local_routes(routed, [9], 2, layout, cp_rank=0))
    rank1 = token_of(local_routes(routed, [9], 2, layout, cp_rank=1))
    assert list(rank0) == [0, 1, 2, 7, 7, 7]  # chunks 0 and 3 (padding repeats the last route)
    assert list(rank1) == [3, 4, 5, 6, 7, 7]  # chunks 1 and 2


def test_sequence_parallel_splits_the_packed_tokens_contiguously():
    layout = ReplayLayout(tp=2, sequence_parallel=True, pad_multiple=2)
    samples = [token_routes(4), token_routes(6, offset=100)]
    tp0 = token_of(local_routes(samples, [4, 6], 2, layout, tp_rank=0))
    tp1 = token_of(local_routes(samples, [4, 6], 2, layout, tp_rank=1))
    assert list(tp0) == [0, 1, 2, 2, 100]
    assert list(tp1) == [101, 102, 103, 104, 104]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(2, 40), min_size=1, max_size=5),
       tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2, 4]))
def test_every_token_is_routed_by_exactly_one_rank(lengths, tp, cp):
    pad = 2 * cp * tp if cp > 1 else tp
    layout = ReplayLayout(tp=tp, cp=cp, sequence_parallel=True, pad_multiple=pad)
    samples = [token_routes(n, offset=1000 * i) for i, n in enumerate(lengths)]
    seen = np.concatenate([
        token_of(local_routes(samples, lengths, 2, layout, tp_rank=t, cp_rank=c))
        for c in range(cp) for t in range(tp)])
    padded_total = sum(n + (-n % pad) for n in lengths)
    assert len(seen) == padded_total
    for i, n in enumerate(lengths):  # each real routed token appears at least once
        assert set(range(1000 * i, 1000 * i + n - 1)) <= set(seen.tolist())
    chunks = [local_routes(samples, lengths, 2, layout, tp_rank=t, cp_rank=c)
              for c in range(cp) for t in range(tp)]
    assert len({len(c) for c in chunks}) == 1  # every rank routes the same number of tokens


def test_a_batch_is_seen_position_major():
    # two samples right-padded to width 4: a router sees (p0 s0), (p0 s1), (p1 s0), ...
    routes, known = batch_routes([token_routes(3), token_routes(4, offset=100)], [3, 4], 4, 2,
                                 ReplayLayout())
    assert list(token_of(routes)) == [0, 100, 1, 101, 1, 102, 1, 102]
    assert list(known) == [True, True, True, True, False, True, False, False]


def test_a_batch_under_context_and_sequence_parallelism():
    samples = [token_routes(8), token_routes(6, offset=100)]  # width 8: chunks of 2 under cp 2
    rank1, _ = batch_routes(samples, [8, 6], 8, 2, ReplayLayout(cp=2), cp_rank=1)
    assert list(token_of(rank1)) == [2, 102, 3, 103, 4, 104, 5, 104]  # chunks 1 and 2
    tp1, _ = batch_routes(samples, [8, 6], 8, 2, ReplayLayout(tp=2, sequence_parallel=True),
                          tp_rank=1)
    assert list(token_of(tp1)) == [4, 104, 5, 104, 6, 104, 6, 104]  # positions 4-7


@settings(max_examples=200, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(2, 40), min_size=1, max_size=5),
       tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2, 4]))
def test_every_routed_token_of_a_batch_is_marked_on_exactly_one_rank(lengths, tp, cp):
    multiple = tp * (2 * cp if cp > 1 else 1)
    width = max(lengths) + -max(lengths) % multiple
    layout = ReplayLayout(tp=tp, cp=cp, sequence_parallel=True)
    samples = [token_routes(n, offset=100 * i) for i, n in enumerate(lengths)]
    parts = [batch_routes(samples, lengths, width, 2, layout, tp_rank=t, cp_rank=c)
             for c in range(cp) for t in range(tp)]
    assert len({len(routes) for routes, _ in parts}) == 1
    assert sum(len(routes) for routes, _ in parts) == width * len(lengths)
    marked = np.concatenate([token_of(routes)[known] for routes, known in parts])
    want = [100 * i + t for i, n in enumerate(lengths) for t in range(n - 1)]
    assert sorted(marked.tolist()) == want


def test_a_batch_too_narrow_or_unsplittable_is_refused():
    with pytest.raises(ValueError, match="6-token sample"):
        batch_routes([token_routes(6)], [6], 4, 2, ReplayLayout())
    with pytest.raises(ValueError, match="2 × cp"):
        batch_routes([token_routes(6)], [6], 6, 2, ReplayLayout(cp=2))


def test_per_layer_gives_megatrons_replay_tensors():
    routes = sample_routes(token_routes(4, layers=3, topk=8), 4, moe_layers=3)
    layers = per_layer(routes)
    assert len(layers) == 3 and all(layer.shape == (4, 8) for layer in layers)
    assert layers[2][1, 5] == 1000 * 1 + 20 + 5


@pytest.mark.parametrize(("shape", "length", "message"), [
    ((4, 3, 2), 5, "expected"), ((2, 2, 2), 5, "cover 2 tokens"), ((4, 2), 5, "expected")])
def test_mismatched_arrays_are_refused(shape, length, message):
    with pytest.raises(ValueError, match=message):
        sample_routes(np.zeros(shape, dtype=np.uint8), length, moe_layers=2)


def test_a_packed_row_is_its_samples_one_after_another_then_padding():
    routed = [token_routes(4, offset=0), token_routes(3, offset=100)]
    routes, known = packed_routes(routed, [4, 3], 8, 2, ReplayLayout())
    # each sample's last token borrows its last route; the padding, the last sample's
    assert list(token_of(routes)) == [0, 1, 2, 2, 100, 101, 101, 101]
    assert known.tolist() == [True, True, True, False, True, True, False, False]
    halves = [packed_routes(routed, [4, 3], 8, 2, ReplayLayout(tp=2, sequence_parallel=True),
                            tp_rank=r) for r in (0, 1)]
    assert [list(token_of(r)) for r, _ in halves] == [[0, 1, 2, 2], [100, 101, 101, 101]]
    with pytest.raises(ValueError, match="cp = 1"):
        packed_routes(routed, [4, 3], 8, 2, ReplayLayout(cp=2, pad_multiple=4))
    with pytest.raises(ValueError, match="does not split"):
        packed_routes(routed, [4, 3], 7, 2, ReplayLayout(tp=2, sequence_parallel=True))


def test_vllms_column_per_decoder_layer_keeps_the_moe_layers_for_megatron():
    # DeepSeek-V3 / GLM-4.5 with first_k_dense_replace = 1: vLLM's capturer holds a column per
    # decoder layer (num_hidden_layers wide), the dense layer 0's left at 0; megatron-core's
    # routers are the two MoE layers'
    moe_layers = (False, True, True)
    routed = token_routes(5, layers=3)
    routed[:, 0, :] = 0
    with pytest.raises(ValueError, match="expected"):
        batch_routes([routed], [5], 6, 2, ReplayLayout())
    kept = moe_layer_routes(routed, moe_layers)
    assert kept.shape == (4, 2, 2) and np.array_equal(kept, routed[:, 1:, :])
    routes, known = batch_routes([kept], [5], 6, 2, ReplayLayout())
    first, second = per_layer(routes)  # decoder layers 1 and 2, tokens 0..3 as vLLM routed
    assert first[:4].tolist() == [[10, 11], [1010, 1011], [2010, 2011], [3010, 3011]]
    assert second[:4, 0].tolist() == [20, 1020, 2020, 3020] and known[:4].all()
    # routes with a column per MoE layer (Qwen3-MoE, every layer MoE) are kept as they are
    assert moe_layer_routes(kept, (True, True)) is kept
