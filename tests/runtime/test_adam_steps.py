"""The Megatron backend's restore of Adam's step counts after a checkpoint load, on torch's
real Adam (CPU).

megatron-core's DistributedOptimizer, without Apex or Transformer Engine, reloads the step
through its param_groups and puts one tensor object in every parameter's state; torch's
Adam then adds 1 to it once per parameter at each step (docs/gpu-runs.md, third session:
17 and 33 after one step on two H200s). The backend saves the counts and gives every
parameter its own tensor again.
"""

from __future__ import annotations

import types

import pytest

pytest.importorskip("megatron.core")

import torch  # noqa: E402

from runtime.backends.megatron_train import MegatronTrainingBackend  # noqa: E402


def _backend_with_adams(*sizes: int):
    """A backend whose optimizer is a chain of torch Adams (one per size), each stepped
    once, as a chained dense + expert optimizer is."""
    backend = MegatronTrainingBackend.__new__(MegatronTrainingBackend)
    chained = []
    for size in sizes:
        params = [torch.nn.Parameter(torch.randn(3)) for _ in range(size)]
        adam = torch.optim.Adam(params, lr=0.1)
        for p in params:
            p.grad = torch.ones(3)
        adam.step()
        chained.append(types.SimpleNamespace(optimizer=adam))
    backend.optimizer = types.SimpleNamespace(chained_optimizers=chained)
    return backend


def _share_one_step_tensor(backend, value: float) -> None:
    """What megatron-core's load leaves: one step tensor object per optimizer."""
    for inner in backend._torch_adams():
        shared = torch.tensor(value)
        for state in inner.state.values():
            state["step"] = shared


def _step_all(backend) -> None:
    for inner in backend._torch_adams():
        inner.step()


def test_restored_counts_advance_by_one_per_step():
    backend = _backend_with_adams(4, 6)
    saved = backend._adam_steps()
    assert saved == [1.0, 1.0]

    _share_one_step_tensor(backend, 1.0)
    _step_all(backend)
    # the shared tensor: counted once per parameter
    assert backend._adam_steps() == [5.0, 7.0]

    _share_one_step_tensor(backend, 1.0)
    backend._restore_adam_steps(saved)
    steps = [s["step"] for inner in backend._torch_adams() for s in inner.state.values()]
    assert len({id(s) for s in steps}) == len(steps) == 10
    _step_all(backend)
    assert backend._adam_steps() == [2.0, 2.0]
    assert {float(s["step"]) for inner in backend._torch_adams()
            for s in inner.state.values()} == {2.0}
