"""Packed micro-batches without a model: where the responses sit in a packed row, what the
dynamic micro-batch budget counts, which path the backend and `vime plan` take. The model's
side (attention, rotary, the loss and routing replay through megatron-core) is
tests/oracle/test_megatron_packing.py."""

from __future__ import annotations

import types

import pytest
import torch
from specsupport import ROOT, run_spec

from runtime.backends.torch_train import (
    TorchTrainingBackend,
    packed_response_positions,
    response_positions,
)
from runtime.core.interfaces import TrainBatch
from vime import render


def test_packed_positions_are_the_padded_ones_shifted_by_each_samples_offset():
    prompts, lengths = [2, 3, 1], [5, 4, 6]
    _rows, padded, mask = response_positions(prompts, lengths, 6)
    rows, packed, packed_mask = packed_response_positions(prompts, lengths, 16)
    assert rows.eq(0).all() and torch.equal(mask, packed_mask)
    offsets = torch.tensor([[0], [5], [9]])
    assert torch.equal(packed[mask], (padded + offsets)[mask])
    assert packed[mask].tolist() == [1, 2, 3, 7, 9, 10, 11, 12, 13]


def _groups(lengths: list[int], packed: bool, max_tokens: int) -> list[list[int]]:
    backend = object.__new__(TorchTrainingBackend)
    backend.slice = types.SimpleNamespace(dynamic_batch=True, max_tokens_per_gpu=max_tokens,
                                          micro_batch_size=1)
    backend.packed = packed
    return backend._micro_batches(TrainBatch(tokens=[[0] * n for n in lengths],
                                             prompt_lens=[1] * len(lengths)))


def test_the_dynamic_budget_counts_real_tokens_when_packed():
    # padded: 2 × the longest (10) fills 20; packed: 10 + 4 + 4 = 18 fits
    assert _groups([10, 4, 4, 3], packed=False, max_tokens=20) == [[0, 1], [2, 3]]
    assert _groups([10, 4, 4, 3], packed=True, max_tokens=20) == [[0, 1, 2], [3]]
    assert _groups([25, 4], packed=True, max_tokens=20) == [[0], [1]]  # a long one goes alone


@pytest.mark.parametrize("pack, cp, packed", [(True, 1, True), (True, 2, False),
                                              (False, 1, False)])
def test_the_backend_packs_where_it_can(pack, cp, packed):
    pytest.importorskip("megatron.core")
    from runtime.backends.megatron_train import packing

    assert packing(pack, cp)[0] is packed


@pytest.mark.parametrize("sets, line", [
    ((), "micro-batches: packed into one row, no padding (pack_sequences, from default: True)"),
    (("train.pack_sequences=false",), "micro-batches: padded to the longest sample "
                                      "(pack_sequences = false, from set (--set"),
    (("train.parallel.cp=2",), "micro-batches: padded to the longest sample (cp = 2: packed "
                               "sequences need cp = 1)"),
])
def test_the_plan_says_which_path_the_actor_takes(sets, line):
    result = run_spec(ROOT / "specs" / "qwen3_30b.toml", sets)
    assert line in render.plan_text(result.plan)
