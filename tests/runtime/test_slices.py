"""What the resolved spec hands the training ranks: train.transformer_impl reaches every
TrainSlice (the Megatron backend builds its layer spec from it), and a job folder compiled
before the key existed still loads, as auto."""

from __future__ import annotations

import pytest
from runtimekit import compile_spec, sets_for

from runtime.core.slices import JobConfig


def _slices(tmp_path, resolved: str, plan: dict):
    job_dir = tmp_path / "job"
    job_dir.mkdir(exist_ok=True)
    config = JobConfig.from_job(plan, resolved, job_dir)
    return [config.train_slice(rank, "127.0.0.1", 0, 1) for rank in range(len(config.ranks))]


@pytest.mark.parametrize("impl", ["auto", "transformer_engine", "local"])
def test_every_train_slice_carries_the_layer_spec(tmp_path, impl):
    plan, resolved = compile_spec(sets=sets_for(tmp_path, train__transformer_impl=f'"{impl}"'))
    assert f'transformer_impl = "{impl}"' in resolved
    assert {s.transformer_impl for s in _slices(tmp_path, resolved, plan)} == {impl}


def test_a_resolved_spec_from_before_the_key_loads_as_auto(tmp_path):
    plan, resolved = compile_spec(sets=sets_for(tmp_path, train__transformer_impl='"local"'))
    old = resolved.replace('transformer_impl = "local"\n', "")
    assert "transformer_impl" not in old
    assert {s.transformer_impl for s in _slices(tmp_path, old, plan)} == {"auto"}
