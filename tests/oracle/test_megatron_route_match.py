"""Oracle: the share of replayed routes the actor's routers pick too (the R3 metric,
train/replayed_route_match), counted around megatron-core's own RouterReplay: while the
backend counts, each router's replayed top-k is compared with the top-k of its own scores."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core")

import torch  # noqa: E402
from megatron.core.transformer.moe.router_replay import (  # noqa: E402
    RouterReplay,
    RouterReplayAction,
)

from runtime.backends.megatron_train import MegatronTrainingBackend  # noqa: E402


def _topk(scores, topk, num_groups=None, group_topk=None):
    values, indices = torch.topk(scores, topk, dim=-1)
    return values, indices


def test_replayed_routes_are_counted_against_the_routers_own_choice():
    RouterReplay.clear_global_router_replay_instances()
    layers = [RouterReplay() for _ in range(2)]
    backend = object.__new__(MegatronTrainingBackend)  # only the counter, no model
    backend._route_counts = torch.zeros(2, dtype=torch.int64)
    backend._counting_routes = False
    backend._routed_rows = None
    backend._watch_replayed_routes()
    torch.manual_seed(0)
    scores = torch.randn(6, 8)
    own = torch.topk(scores, 2).indices
    replayed = own.clone()
    replayed[0, 0] = next(e for e in range(8) if e not in own[0])  # one expert of 12 differs
    RouterReplay.set_replay_data([replayed, own])
    RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    for layer in layers:  # not counting: the replayed routes are used, nothing is counted
        probs, indices = layer.get_replay_topk(scores, 2, None, None, _topk)
    assert backend._route_counts.tolist() == [0, 0]
    backend._counting_routes = True
    outputs = [layer.get_replay_topk(scores, 2, None, None, _topk) for layer in layers]
    assert torch.equal(outputs[0][1], replayed) and torch.equal(outputs[1][1], own)
    assert torch.equal(outputs[0][0], scores.gather(1, replayed))  # replay is unchanged
    assert backend._route_counts.tolist() == [23, 24]  # 2 layers x 6 tokens x top-2
    # other actions (recording, no replay) are not counted
    RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
    layers[0].get_replay_topk(scores, 2, None, None, _topk)
    assert backend._route_counts.tolist() == [23, 24]
    # rows vLLM did not route (a sample's last token, a batch's padding) are not counted
    backend._route_counts.zero_()
    backend._routed_rows = torch.tensor([False, True, True, True, False, False])
    RouterReplay.set_replay_data([replayed, own])
    RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    for layer in layers:
        layer.get_replay_topk(scores, 2, None, None, _topk)
    assert backend._route_counts.tolist() == [12, 12]  # row 0's differing expert left out
    RouterReplay.clear_global_router_replay_instances()
