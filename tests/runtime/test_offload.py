"""runtime/backends/offload.py: the host mirror of a colocated actor's device storages, on the
CPU (the storages are the CPU's; freeing and re-sizing them is the same bookkeeping as on a GPU).
A parameter and an Adam moment come back bit for bit, a gradient comes back without a copy, and
the host buffers are made once and reused."""

from __future__ import annotations

import torch

from runtime.backends.offload import HostMirror


def stepped_actor():
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-2)
    layer(torch.randn(8, 64)).square().sum().backward()
    optimizer.step()
    return layer, optimizer


def storages(layer, optimizer):
    """kept (weights, then Adam's moments), dropped (gradients), the weights' data pointers"""
    params = list(layer.parameters())
    moments = [optimizer.state[p][k] for p in params for k in ("exp_avg", "exp_avg_sq")]
    kept = [t.untyped_storage() for t in [p.data for p in params] + moments]
    grads = [p.grad.untyped_storage() for p in params]
    return kept, grads, {p.data.untyped_storage().data_ptr() for p in params}


def test_state_survives_offload_and_onload_bit_for_bit():
    layer, optimizer = stepped_actor()
    weight, moment = layer.weight, optimizer.state[layer.weight]["exp_avg_sq"]
    before = {"weight": weight.detach().clone(), "moment": moment.clone()}
    mirror = HostMirror(torch.device("cpu"))
    mirror.track(*storages(layer, optimizer))
    mirror.offload()
    assert weight.untyped_storage().nbytes() == 0 and moment.untyped_storage().nbytes() == 0
    assert layer.weight.grad.untyped_storage().nbytes() == 0
    # what a freed storage held is gone: the host copy is the only one
    mirror.onload()
    assert torch.equal(weight.detach(), before["weight"])
    assert torch.equal(moment, before["moment"])
    assert layer.weight.grad.shape == (32, 64)  # back at its size, for the next step to zero
    # the actor trains on after it
    optimizer.zero_grad()
    layer(torch.randn(8, 64)).sum().backward()
    optimizer.step()
    assert not torch.equal(weight.detach(), before["weight"])


def test_gradients_are_dropped_not_copied():
    layer, optimizer = stepped_actor()
    kept, grads, weights = storages(layer, optimizer)
    mirror = HostMirror(torch.device("cpu"))
    mirror.track(kept, grads, weights)
    assert mirror.dropped_bytes == sum(s.nbytes() for s in grads) > 0
    assert mirror.host_bytes == sum(s.nbytes() for s in kept)
    assert mirror.buffers_made == len(kept)


def test_host_buffers_are_made_once_and_reused():
    layer, optimizer = stepped_actor()
    mirror = HostMirror(torch.device("cpu"))
    hosts = []
    for _round in range(3):
        mirror.track(*storages(layer, optimizer))
        mirror.offload()
        hosts.append([slot.host.data_ptr() for slot in mirror._slots if slot.host is not None])
        mirror.onload()
        optimizer.zero_grad()
        layer(torch.randn(8, 64)).sum().backward()
        optimizer.step()
    assert mirror.buffers_made == 6  # two weights, four moments: once each
    assert hosts[0] == hosts[1] == hosts[2]


def test_weights_come_back_alone_for_an_export():
    layer, optimizer = stepped_actor()
    before = layer.weight.detach().clone()
    mirror = HostMirror(torch.device("cpu"))
    mirror.track(*storages(layer, optimizer))
    mirror.offload()
    mirror.weights_back()
    assert torch.equal(layer.weight.detach(), before)
    assert optimizer.state[layer.weight]["exp_avg"].untyped_storage().nbytes() == 0
    mirror.weights_gone()
    assert layer.weight.untyped_storage().nbytes() == 0
    mirror.onload()
    assert torch.equal(layer.weight.detach(), before)


def test_host_buffers_are_pinned_only_where_cuda_runs():
    assert HostMirror(torch.device("cpu")).pin is False
    if torch.cuda.is_available():
        mirror = HostMirror(torch.device("cuda", 0))
        assert mirror.pin and mirror._host_buffer(1 << 20).is_pinned()
