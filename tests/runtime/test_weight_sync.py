"""Which path a weight sync takes and which actor ranks take part (runtime/workers/weight_sync.py):
the decision on its own, from the compiled plans' engines, and on a real Ray with the torch
pair, whose engines have no vLLM transfer engine and keep the fallback. vLLM's trainer
engines built from these routes are in tests/oracle/test_vllm_backend.py."""

from __future__ import annotations

import pytest
from runtimekit import ROOT, compile_spec, job_config

from runtime.node import placement
from runtime.workers import actors, weight_sync
from runtime.workers.weight_sync import COLLECTIVE_RPC, RankExport

CUDA_ALL = RankExport(on_cuda=True, holds_all=True)
CUDA_RANK0 = RankExport(on_cuda=True, holds_all=False)  # a backend that exports on rank 0 only
CPU = RankExport(on_cuda=False, holds_all=True)


def _engine_worlds(name: str, sets=()) -> list[int]:
    plan, _ = compile_spec(ROOT / "specs" / f"{name}.toml", list(sets))
    return [len(engine["gpus"]) for engine in plan["rollout"]["engines"]]


def test_nccl_sends_from_rank_0_into_one_group_with_a_rank_range_per_engine():
    ranks = [CUDA_RANK0] * 24  # the 24-GPU spec's actor: every rank iterates, rank 0 sends
    decided = weight_sync.route(["nccl"], ranks)
    assert (decided.path, decided.world, decided.senders) == ("nccl", 24, (0,))
    assert decided.transfer and decided.drives(0) and not decided.drives(1)
    worlds = _engine_worlds("qwen3_30b_24gpu_eplb")  # one engine, TP 8 x DP 3
    assert worlds == [24]
    ready = weight_sync.with_rendezvous(decided, ("10.0.0.1", 29600), worlds)
    assert ready.master == ("10.0.0.1", 29600) and ready.group_size == 25
    assert ready.rank_offsets() == (1,)
    # several engines: each starts after the workers of those before it
    two = weight_sync.with_rendezvous(weight_sync.route(["nccl", "nccl"], ranks),
                                      ("h", 1), [8, 16])
    assert two.rank_offsets() == (1, 9) and two.group_size == 25
    # the route a rank gets from the group is what it was decided as (frozen, comparable)
    assert two == weight_sync.with_rendezvous(weight_sync.route(["nccl"] * 2, ranks),
                                              ("h", 1), (8, 16))


def test_ipc_needs_every_rank_to_hold_every_tensor():
    # one actor rank: it holds everything, and shares it with the engine on its GPU
    assert weight_sync.route(["ipc"], [CUDA_RANK0]).path == "ipc"
    # ranks of a backend that exports on rank 0 only: the fallback
    megatron = weight_sync.route(["ipc"], [CUDA_RANK0] * 8)
    assert (megatron.path, megatron.senders) == (COLLECTIVE_RPC, tuple(range(8)))
    # an actor whose ranks each yield everything: each rank sends to its own GPU's worker
    every = weight_sync.route(["ipc"], [CUDA_ALL] * 4)
    assert (every.path, every.senders) == ("ipc", (0, 1, 2, 3))
    # IPC needs no rendezvous
    assert weight_sync.with_rendezvous(every, ("h", 1), [4]) == every


def test_the_fallback_for_engines_or_actors_vllm_cannot_transfer_for():
    assert weight_sync.route([None, None], [CUDA_ALL]).path == COLLECTIVE_RPC  # torch engines
    assert weight_sync.route(["nccl"], [CPU, CPU]).path == COLLECTIVE_RPC  # actor on CPU
    assert weight_sync.route(["sharded_rdt"], [CUDA_ALL]).path == COLLECTIVE_RPC
    assert not weight_sync.route([None], [CPU]).transfer
    with pytest.raises(ValueError, match="different weight-transfer backends"):
        weight_sync.route(["nccl", "ipc"], [CUDA_ALL])


# ------------------------------------------------------------- real ranks and engines

def test_the_torch_pair_on_ray_keeps_the_fallback_and_reports_what_decides(tmp_path,
                                                                          ray_cluster):
    import ray

    plan, _, config = job_config(tmp_path, cluster__gpus_per_node="4", train__colocate="false",
                                 train__num_gpus="2")
    group = placement.create(plan)
    try:
        train, rollout = actors.ray_groups(config, group, cpu_threads=1)
        assert ray.get([e.transfer_backend.remote() for e in rollout.workers]) == [None, None]
        traits = ray.get([t.export_traits.remote() for t in train.workers])
        # no CUDA here; two data-parallel ranks, each of which can export every tensor
        assert traits == [RankExport(on_cuda=False, holds_all=True)] * 2
        decided = train.sync_route(rollout)
        assert (decided.path, decided.senders) == (COLLECTIVE_RPC, (0, 1))
        assert train.push_weights(rollout, 3, 1 << 20) > 0
        assert ray.get([e.weight_version.remote() for e in rollout.workers]) == [3, 3]
        # kept for the same engines, decided again for another set (a replaced engine)
        assert train.sync_route(rollout) is decided
        fresh = actors.RolloutGroup(rollout.workers[:1])
        assert train.sync_route(fresh) == decided and train._route[0] != (
            actors._handle_key(rollout.workers[0]), actors._handle_key(rollout.workers[1]))
        train.stop()
        rollout.stop()
    finally:
        placement.remove(group)


def test_an_engine_in_the_actors_own_process_takes_the_fallback():
    # CUDA IPC cannot open a handle in the process that made it: in-process groups (one
    # process holds the actor and the engine) hand the tensors over through the fallback
    assert weight_sync.route(["ipc"], [CUDA_ALL]).path == "ipc"
    shared = weight_sync.route(["ipc"], [CUDA_ALL], same_process=True)
    assert (shared.path, shared.senders) == (COLLECTIVE_RPC, (0,))
    # NCCL between two processes is unaffected by the flag's meaning for IPC
    assert weight_sync.route(["nccl"], [CUDA_ALL], same_process=True).path == "nccl"


def test_the_group_sees_that_in_process_hosts_share_its_process(tmp_path):
    _plan, _resolved, config = job_config(tmp_path)
    train, rollout = actors.local_groups(config)
    route = train.sync_route(rollout)
    assert route.path == COLLECTIVE_RPC  # the torch engine has no transfer backend anyway
    # an engine that reports IPC, hosted in this process, still gets the fallback
    rollout.workers[0].backend.transfer_backend = "ipc"
    train._route = None
    train.workers[0].export_traits = lambda: CUDA_ALL
    assert train.sync_route(rollout).path == COLLECTIVE_RPC
