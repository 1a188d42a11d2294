"""train.balance_data: data-parallel replicas get the same number of samples with even token
sums, and the group's answers come back in the batch's order."""

from __future__ import annotations

import random

import pytest
from runtimekit import job_config

from runtime.core.hosts import balanced_split, split
from runtime.core.interfaces import TrainBatch
from runtime.workers.actors import TrainGroup, TrainWorker


def _sums(costs, shares):
    return [sum(costs[i] for i in share) for share in shares]


def test_balanced_split_keeps_counts_and_evens_the_sums():
    rng = random.Random(7)
    # groups of 8 samples of one prompt each, lengths alike within a group: a contiguous split
    # gives whole long groups to one replica
    costs = [int(rng.lognormvariate(6.5, 0.1) * mean) for mean in (1, 1, 4, 4, 1, 1, 1, 9)
             for _ in range(8)]
    for parts in (2, 3, 4, 8):
        shares = balanced_split(costs, parts)
        assert sorted(i for share in shares for i in share) == list(range(len(costs)))
        assert [len(s) for s in shares] == [len(r) for r in split(len(costs), parts)]
        assert all(share == sorted(share) for share in shares)
        balanced = _sums(costs, shares)
        contiguous = _sums(costs, split(len(costs), parts))
        assert max(balanced) < max(contiguous)
        # greedy largest-first: the heaviest share exceeds the mean by less than one item
        assert max(balanced) - sum(costs) / parts <= max(costs)


def test_balanced_split_is_deterministic_on_ties():
    assert balanced_split([5] * 6, 2) == balanced_split([5] * 6, 2) == [[0, 2, 4], [1, 3, 5]]
    assert balanced_split([], 3) == [[], [], []]


def test_log_probs_come_back_in_the_batchs_order(tmp_path):
    """Two replicas of the same torch actor (same seed): their log-probs with balanced shares,
    put back in order, are the one replica's of the whole batch."""
    _plan, _resolved, config = job_config(tmp_path)
    workers = []
    for _ in range(2):
        worker = TrainWorker(config.train_backend)
        worker.init(config.train_slice(0, "127.0.0.1", 0, 1))
        workers.append(worker)
    rng = random.Random(3)
    tokens = [[rng.randrange(1, 30) for _ in range(n)] for n in (40, 6, 7, 38, 5, 9, 36, 8)]
    batch = TrainBatch(tokens=tokens, prompt_lens=[4] * len(tokens))
    whole = TrainGroup(workers[:1]).log_probs(batch, "actor")
    group = TrainGroup(workers, data_ranks=[0, 1], reporting=[True, True], balance_data=True)
    assignment = group._assignment(batch)
    assert assignment != [[0, 1, 2, 3], [4, 5, 6, 7]]  # the long samples are spread
    lengths = [len(t) for t in tokens]
    assert _sums(lengths, split(len(tokens), 2)) == [91, 58]
    # two of 36, 38 and 40 share a replica of four: 38 + 36 + 6 + 5 = 85 is the best there is
    assert max(_sums(lengths, assignment)) == 85
    balanced = group.log_probs(batch, "actor")
    assert [len(v) for v in balanced] == [len(t) - 4 for t in tokens]
    # a share pads to its own longest sample: float noise, not another sample's values
    for mine, theirs in zip(balanced, whole, strict=True):
        assert mine == pytest.approx(theirs, abs=1e-5)
