"""train.moe_token_dispatcher reaches every training rank, and the Megatron backend refuses a
flex dispatcher it cannot run at start, naming the key (here: the CPU, no deep_ep), rather
than in megatron-core's first MoE layer."""

from __future__ import annotations

import pytest
from runtimekit import compile_spec, sets_for

from runtime.core.slices import JobConfig


def _slices(tmp_path, resolved: str, plan: dict):
    job_dir = tmp_path / "job"
    job_dir.mkdir(exist_ok=True)
    config = JobConfig.from_job(plan, resolved, job_dir)
    return [config.train_slice(rank, "127.0.0.1", 0, 1) for rank in range(len(config.ranks))]


def test_every_train_slice_carries_the_dispatcher_and_an_older_job_folder_loads_alltoall(
        tmp_path):
    plan, resolved = compile_spec(sets=sets_for(tmp_path))
    assert 'moe_token_dispatcher = "alltoall"' in resolved
    flex = resolved.replace('moe_token_dispatcher = "alltoall"', 'moe_token_dispatcher = "flex"')
    assert {(s.moe_token_dispatcher, s.moe_flex_backend)
            for s in _slices(tmp_path, flex, plan)} == {("flex", "deepep")}
    old = "\n".join(line for line in resolved.splitlines()
                    if not line.startswith(("moe_token_dispatcher", "moe_flex_backend")))
    assert {(s.moe_token_dispatcher, s.moe_flex_backend)
            for s in _slices(tmp_path, old, plan)} == {("alltoall", "deepep")}


def test_the_megatron_backend_refuses_flex_at_start_where_deep_ep_cannot_run(tmp_path):
    pytest.importorskip("megatron.core")
    from runtime.backends.megatron_train import MegatronTrainingBackend
    from runtime.megatron.model import choose_dispatcher

    plan, resolved = compile_spec(sets=sets_for(tmp_path))
    flex = resolved.replace('moe_token_dispatcher = "alltoall"', 'moe_token_dispatcher = "flex"')
    [train, *_] = _slices(tmp_path, flex, plan)
    with pytest.raises(RuntimeError) as refused:
        MegatronTrainingBackend().init(train)
    said = str(refused.value)
    assert said.startswith('train.moe_token_dispatcher = "flex" (moe_flex_backend = "deepep")')
    assert 'set train.moe_token_dispatcher = "alltoall"' in said
    assert choose_dispatcher() == {"moe_token_dispatcher_type": "alltoall"}
    with pytest.raises(ValueError, match="train.moe_token_dispatcher = 'allgather'"):
        choose_dispatcher("allgather")
