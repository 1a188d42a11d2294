"""One parallel layout for the compiler and the runtime (vime/layout.py): plan.json carries it
from `vime plan` to the job, and every training rank's slice holds the layout and the
coordinates the plan gave that rank."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest
from runtimekit import ROOT, compile_spec

from runtime.core.slices import JobConfig, LossConfig, ModelSlice, OptimizerSlice, TrainSlice
from vime.layout import SIZES, Layout

SPECS = ["qwen3_30b_2node.toml", "qwen3_30b_24gpu_eplb.toml", "tiny_cpu.toml"]


@pytest.mark.parametrize("name", SPECS)
def test_plan_json_carries_the_compilers_layout_to_every_rank(tmp_path, name):
    data = json.dumps(str(ROOT / "specs" / "data" / "tiny_arithmetic.jsonl"))
    plan, resolved = compile_spec(ROOT / "specs" / name, [f"data.prompt_data={data}"])
    train = plan["train"]
    layout = Layout.from_plan(train)
    assert layout.to_plan() == {size: train[size] for size in SIZES}
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    config = JobConfig.from_job(plan, resolved, job_dir)
    assert config.parallel == layout
    for entry in train["ranks"]:
        rank = entry["rank"]
        slice = config.train_slice(rank, "127.0.0.1", 0, 1)
        assert slice.parallel == layout
        assert dict(slice.coords) == {k: v for k, v in entry.items()
                                      if k not in ("rank", "node", "gpu")}


def test_the_plan_round_trips_through_json():
    layout = Layout(48, tp=2, cp=2, pp=3, ep=4, etp=2)
    again = Layout.from_plan(json.loads(json.dumps({"num_gpus": 48, **layout.to_plan()})))
    assert again == layout and (again.dp, again.edp) == (4, 2)
    # without num_gpus (a mapping of the sizes alone) the world is dp × tp × cp × pp
    assert Layout.from_plan(layout.to_plan()) == layout


@pytest.mark.parametrize(("sizes", "world"), [
    ({}, 1), ({"tp": 4, "ep": 8}, 8), ({"tp": 8, "ep": 4}, 8), ({"tp": 3, "ep": 2, "etp": 2}, 12),
    ({"tp": 2, "pp": 2, "ep": 4}, 8)])
def test_the_smallest_world_holds_tp_and_the_expert_grid_per_stage(sizes, world):
    layout = Layout.smallest(**sizes)
    assert layout.world_size == world and not layout.problems()
    assert layout.world_size // layout.pp % layout.tp == 0
    assert layout.world_size // layout.pp % (layout.ep * layout.etp) == 0


def test_a_slice_built_from_a_mapping_holds_a_layout():
    ones = {k: 1 for k in SIZES}
    slice = TrainSlice(
        backend="torch", model=ModelSlice("", MappingProxyType({}), True, 1), rank=0,
        world_size=1, node=0, gpu=0, coords=MappingProxyType({k: 0 for k in ones}),
        parallel=MappingProxyType(ones), master_addr="127.0.0.1", master_port=0,
        optimizer=OptimizerSlice(1e-6, 0.1, 0.9, 0.98, 1.0), loss=LossConfig(),
        temperature=1.0, micro_batch_size=1, dynamic_batch=True, max_tokens_per_gpu=8,
        needs_ref=False, routing_replay=False, recompute="none", cpu_threads=1)
    assert slice.parallel == Layout(1)
    assert [slice.parallel[k] for k in SIZES] == [1] * len(SIZES)


def test_a_train_group_takes_its_replicas_from_the_layout():
    """Each data-parallel replica gets one share of a batch, reported by its tensor- and
    context-rank-0 rank: tp 2 × cp 2 over 8 ranks is 2 replicas of 4."""
    from runtime.workers.groups import TrainGroup

    group = TrainGroup.from_layout([f"rank {r}" for r in range(8)], Layout(8, tp=2, cp=2, ep=4))
    assert group.data_ranks == [0, 0, 0, 0, 1, 1, 1, 1]
    assert group.reporting == [True, False, False, False, True, False, False, False]
    with pytest.raises(ValueError, match="3 training ranks for a layout of 8"):
        TrainGroup.from_layout(["a", "b", "c"], Layout(8, tp=2))
