"""The Megatron backend's restore of Adam's step counts after a checkpoint load, on torch's
real Adam (CPU).

megatron-core's DistributedOptimizer, without Apex or Transformer Engine, reloads the step
through its param_groups and puts one tensor object in every parameter's state; torch's
Adam then adds 1 to it once per parameter at each step (17 and 33 after one step on
two H200s, 2026-11-29: docs/gpu-runs.md). The backend saves the counts and gives every
parameter its own tensor again.
"""

from __future__ import annotations

import types

import pytest

pytest.importorskip("megatron.core")

import torch  # noqa: E402

from runtime.backends.megatron_train import MegatronTrainingBackend  # noqa: E402


def _backend_with_adams(*sizes: int, fused: bool = False):
    """A backend whose optimizer is a chain of torch Adams (one per size), each stepped
    once, as a chained dense + expert optimizer is. `fused`: torch's fused kernel (it has a
    CPU path), as _fuse_adam sets on the GPU."""
    backend = MegatronTrainingBackend.__new__(MegatronTrainingBackend)
    chained = []
    generator = torch.Generator().manual_seed(0)
    for size in sizes:
        params = [torch.nn.Parameter(torch.randn(3, generator=generator)) for _ in range(size)]
        adam = torch.optim.Adam(params, lr=0.1, fused=fused)
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


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_each_parameter_gets_its_own_float32_step_where_its_adam_wants_it(fused):
    backend = _backend_with_adams(3, 5, fused=fused)
    _share_one_step_tensor(backend, 1.0)
    backend._restore_adam_steps([None, None])  # no saved counts: each keeps the loaded one
    steps = [s["step"] for inner in backend._torch_adams() for s in inner.state.values()]
    assert len({id(s) for s in steps}) == len(steps) == 8
    assert {(s.dtype, s.device.type, float(s)) for s in steps} == {(torch.float32, "cpu", 1.0)}
    _step_all(backend)
    assert backend._adam_steps() == [2.0, 2.0]


def test_fused_and_foreach_adam_agree_after_a_restore():
    """The restore leaves torch's fused kernel the same state as its foreach path: the same
    parameters after a second step."""
    results = []
    for fused in (False, True):
        backend = _backend_with_adams(4, fused=fused)
        saved = backend._adam_steps()
        _share_one_step_tensor(backend, 1.0)
        backend._restore_adam_steps(saved)
        _step_all(backend)
        results.append([p.detach().clone() for inner in backend._torch_adams()
                        for p in inner.param_groups[0]["params"]])
    for a, b in zip(*results, strict=True):
        assert torch.allclose(a, b, atol=1e-6), (a, b)


def test_fused_adam_only_on_gpu_fp32_parameters_and_not_when_asked(monkeypatch):
    """_fuse_adam leaves CPU parameters (and everything under VIME_ADAM=foreach) to torch's
    default path; the fused path on CUDA ran on an H200 (docs/gpu-runs.md)."""
    backend = _backend_with_adams(2)
    backend._fuse_adam()
    assert not any(g.get("fused") for inner in backend._torch_adams()
                   for g in inner.param_groups)

    class OnGpu(torch.nn.Parameter):  # what _fuse_adam reads of a CUDA fp32 parameter
        is_cuda = True

    for inner in backend._torch_adams():
        for group in inner.param_groups:
            group["params"] = [OnGpu(p.detach()) for p in group["params"]]
    monkeypatch.setenv("VIME_ADAM", "foreach")
    backend._fuse_adam()
    assert not any(g.get("fused") for inner in backend._torch_adams()
                   for g in inner.param_groups)
    monkeypatch.delenv("VIME_ADAM")
    backend._fuse_adam()
    assert all(g["fused"] and not g["foreach"] for inner in backend._torch_adams()
               for g in inner.param_groups)
