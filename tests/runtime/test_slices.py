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


def test_a_resolved_spec_without_transformer_impl_loads_as_auto(tmp_path):
    plan, resolved = compile_spec(sets=sets_for(tmp_path, train__transformer_impl='"local"'))
    old = resolved.replace('transformer_impl = "local"\n', "")
    assert "transformer_impl" not in old
    assert {s.transformer_impl for s in _slices(tmp_path, old, plan)} == {"auto"}


def test_the_estimator_aggregation_and_lr_schedule_reach_every_rank(tmp_path):
    plan, resolved = compile_spec(sets=sets_for(
        tmp_path, algorithm__advantage_estimator='"gspo"', algorithm__eps_clip="3e-4",
        algorithm__eps_clip_high="4e-4", algorithm__loss_aggregation='"seq-mean-token-sum-norm"',
        train__optimizer__lr_warmup_iters="5", train__optimizer__lr_decay_style='"cosine"',
        train__optimizer__min_lr="1e-4"))
    for train in _slices(tmp_path, resolved, plan):
        assert (train.loss.advantage_estimator, train.loss.loss_aggregation) == (
            "gspo", "seq-mean-token-sum-norm")
        assert train.loss.max_response_len == 8  # the tiny spec's: Dr.GRPO's constant
        opt = train.optimizer
        # lr_decay_iters derived: 40 rollouts × 2 steps
        assert (opt.lr_warmup_iters, opt.lr_decay_style, opt.lr_decay_iters, opt.min_lr) == (
            5, "cosine", 80, 1e-4)


def test_a_resolved_spec_without_the_algorithm_keys_loads_with_their_defaults(tmp_path):
    plan, resolved = compile_spec(sets=sets_for(tmp_path))
    old = "\n".join(line for line in resolved.splitlines() if not line.startswith((
        "advantage_estimator", "loss_aggregation", "lr_warmup_iters", "lr_decay_style",
        "lr_decay_iters", "min_lr")))
    assert "lr_decay_style" not in old and "advantage_estimator" not in old
    for train in _slices(tmp_path, old, plan):
        assert (train.loss.advantage_estimator, train.loss.loss_aggregation) == ("grpo",
                                                                                 "token-mean")
        assert (train.optimizer.lr_warmup_iters, train.optimizer.lr_decay_style,
                train.optimizer.lr_decay_iters) == (0, "constant", 80)
