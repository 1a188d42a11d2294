"""Weight buckets sized from the compiled plans' memory, the actor's bucketing on a real
Qwen3-MoE state dict, the post-sync sample check against a real torch engine, and the vLLM
launch settings (Ray executor on the plan's bundles) of the compiled seed specs."""

from __future__ import annotations

import json

import pytest
import torch
from runtimekit import ROOT, compile_spec, job_config

from runtime.backends import torch_model
from runtime.backends.torch_rollout import TorchRolloutBackend
from runtime.backends.torch_train import TorchTrainingBackend
from runtime.backends.vllm_rollout import launch, weight_path, weight_transfer_backend
from runtime.core import weights
from runtime.core.interfaces import WeightBucket
from runtime.core.slices import EngineSlice, JobConfig

MIB, GIB = 1 << 20, 1 << 30


def _plan(name: str, sets=()) -> dict:
    plan, _ = compile_spec(ROOT / "specs" / f"{name}.toml", list(sets))
    return plan


# ------------------------------------------------------------------------- bucket sizing

def test_bucket_bytes_follow_the_headroom_of_the_compiled_plans():
    plan = _plan("qwen3_30b_24gpu_eplb")  # 79.6 GiB GPUs, peaks 59.0 (train) and 57.32
    room = (79.6 - 59.0) * GIB / 4 / 2
    assert room > weights.BUCKET_CAP_BYTES  # so the cap holds
    assert weights.bucket_bytes(plan["memory"]) == weights.BUCKET_CAP_BYTES
    # more of the GPU for vLLM's KV cache: the rollout peak rises, the bucket shrinks
    tight = _plan("qwen3_30b", ["inference.gpu_memory_utilization=0.9"])["memory"]
    expected = int((tight["gpu_gib"] - max(tight["train_peak_gib"], tight["rollout_peak_gib"]))
                   * GIB / 8) // MIB * MIB
    assert weights.BUCKET_FLOOR_BYTES < expected < weights.BUCKET_CAP_BYTES
    assert weights.bucket_bytes(tight) == expected
    # no room at all: the floor, as before buckets followed the plan
    full = dict(tight, rollout_peak_gib=tight["gpu_gib"] + 1)
    assert weights.bucket_bytes(full) == weights.BUCKET_FLOOR_BYTES


def test_every_seed_plan_gets_a_bucket_within_floor_and_cap(tmp_path):
    planned = 0
    for spec in sorted((ROOT / "specs").glob("*.toml")):
        memory = _plan(spec.stem)["memory"]
        if memory is None:  # the torch backend pair: no memory plan (Megatron's and vLLM's)
            continue
        size = weights.bucket_bytes(memory)
        assert weights.BUCKET_FLOOR_BYTES <= size <= weights.BUCKET_CAP_BYTES, spec.name
        assert size % MIB == 0
        planned += 1
    assert planned >= 5
    # the driver's JobConfig carries it; without a memory plan (tiny_cpu) it takes the floor
    _, _, config = job_config(tmp_path)
    assert _plan("tiny_cpu")["memory"] is None
    assert config.weight_bucket_bytes == weights.BUCKET_FLOOR_BYTES


# ---------------------------------------------------------------- bucketing a real model

@pytest.fixture
def tiny(tmp_path):
    _, _, config = job_config(tmp_path)
    return config


def _trainer(config: JobConfig) -> TorchTrainingBackend:
    backend = TorchTrainingBackend()
    backend.init(config.train_slice(0, "127.0.0.1", 0, 1))
    return backend


def test_the_actors_buckets_cover_the_state_dict_once_within_the_size(tiny):
    trainer = _trainer(tiny)
    expected = dict(torch_model.to_hf(trainer.model.named_parameters()))
    assert any(".mlp.experts.3.gate_proj.weight" in n for n in expected)  # a real MoE
    size = 16 << 10
    buckets = list(trainer.export_weights(size))
    assert len(buckets) > 3
    seen = [name for bucket in buckets for name in bucket]
    assert sorted(seen) == sorted(expected) and len(seen) == len(set(seen))
    for bucket in buckets:
        sizes = [t.numel() * t.element_size() for t in bucket.values()]
        # a bucket closes as soon as it reaches the size: all but its last tensor fit under it
        assert sum(sizes[:-1]) < size
    for bucket in buckets[:-1]:
        assert sum(t.numel() * t.element_size() for t in bucket.values()) >= size
    for name, tensor in (item for bucket in buckets for item in bucket.items()):
        assert torch.equal(tensor, expected[name].detach())
    # at the plan's size the whole tiny model is one bucket
    assert len(list(trainer.export_weights(tiny.weight_bucket_bytes))) == 1


def test_every_rank_exports_its_own_copies_when_asked(tiny):
    import dataclasses

    trainer = _trainer(tiny)
    trainer.slice = dataclasses.replace(trainer.slice, rank=1)  # a second data-parallel rank
    assert list(trainer.export_weights(1 << 30)) == []  # by default rank 0 alone sends
    expected = dict(torch_model.to_hf(trainer.model.named_parameters()))
    exports = [{n: t for b in trainer.export_weights(1 << 30, every_rank=True, on_device=device)
                for n, t in b.items()} for device in (False, True)]
    for exported in exports:
        assert sorted(exported) == sorted(expected)
        assert all(torch.equal(exported[n], expected[n].detach()) for n in expected)
    with torch.no_grad():  # copies: the next optimizer step must not change what was sent
        for p in trainer.model.parameters():
            p.add_(1.0)
    for exported in exports:
        assert not any(torch.equal(exported[n], expected[n].detach()) for n in expected)


# ------------------------------------------------------------------ sample after a sync

def test_the_sample_check_finds_a_tensor_the_engine_did_not_get(tiny):
    trainer = _trainer(tiny)
    names = list(torch_model.to_hf(trainer.model.named_parameters()))
    sample = weights.sample_names(n for n, _ in names)
    assert sample[0] == "model.norm.weight"
    assert all(n.endswith("norm.weight") for n in sample) and len(sample) == 4
    assert any(".layers.0." in n for n in sample) and any(".layers.1." in n for n in sample)

    with torch.no_grad():  # the actor moves away from the initial weights
        for p in trainer.model.parameters():
            p.add_(0.01)
    engine = TorchRolloutBackend()
    engine.start(tiny.engine_slice(0, 1))
    buckets = list(trainer.export_weights(16 << 10))
    actor = {n: t for bucket in buckets for n, t in bucket.items() if n in sample}

    def engine_report():
        return weights.fingerprints(torch_model.to_hf(engine.model.named_parameters()), sample)

    wrong = weights.mismatches(actor, engine_report())
    assert len(wrong) == len(sample)  # before the sync the engine holds the old weights
    for bucket in buckets:
        engine.update_weights(WeightBucket(2, bucket, last=False))
    engine.update_weights(WeightBucket(2, {}, last=True))
    assert weights.mismatches(actor, engine_report()) == []
    # one tensor lost in transit is named; a bf16 engine is compared in bf16
    with torch.no_grad():
        dict(engine.model.named_parameters())["model.norm.weight"].mul_(1.5)
    assert weights.mismatches(actor, engine_report()) == [
        "model.norm.weight: differs from the actor's"]
    bf16 = {n: ("bfloat16", weights.fingerprint(t, torch.bfloat16)) for n, t in actor.items()}
    assert weights.mismatches(actor, bf16) == []
    assert weights.mismatches(actor, {}) == [f"{n}: not in the engine" for n in actor]


# --------------------------------------------------------------- engines on Ray bundles

def _engine(plan: dict, index: int = 0, first_bundle: int = 0) -> EngineSlice:
    entry = plan["rollout"]["engines"][index]
    gpus = tuple((g["node"], g["gpu"]) for g in entry["gpus"])
    return EngineSlice(backend="vllm", engine=index, gpus=gpus, tp=entry["tp"], dp=entry["dp"],
                       ep=entry["ep"], model=None, max_model_len=1, cpu_threads=1,
                       bundles=tuple(range(first_bundle, first_bundle + len(gpus))),
                       colocated=plan["colocate"])


def test_an_engine_across_two_nodes_runs_its_workers_on_the_plans_bundles():
    plan = _plan("qwen3_30b_2node")  # one engine of 16 GPUs: TP 16 over nodes 0 and 1
    [rank] = launch(_engine(plan))
    assert rank.nodes == (0, 1) and rank.bundles == tuple(range(16))
    assert rank.kwargs == {"tensor_parallel_size": 16, "distributed_executor_backend": "ray"}
    assert rank.env == {"VLLM_RAY_BUNDLE_INDICES": ",".join(map(str, range(16))),
                        "VLLM_RAY_PER_WORKER_GPUS": "0.2"}  # colocated: a share of each GPU
    assert rank.host_gpus == 0.0
    # disaggregated (here: the same engine on bundles 16-31), the workers take whole GPUs
    # (vLLM's default VLLM_RAY_PER_WORKER_GPUS of 1.0 is left alone)
    apart = EngineSlice(**{**_engine(plan, 0, first_bundle=16).__dict__, "colocated": False})
    [rank] = launch(apart)
    assert rank.env == {"VLLM_RAY_BUNDLE_INDICES": ",".join(map(str, range(16, 32)))}
    assert rank.host_gpus == 0.0


def test_the_24_gpu_engine_has_three_dp_ranks_one_per_node():
    plan = _plan("qwen3_30b_24gpu_eplb")  # TP 8 x DP 3, EP 24, nodes 0-2
    ranks = launch(_engine(plan), dp_master=("10.0.0.1", 29555))
    assert [r.nodes for r in ranks] == [(0,), (1,), (2,)]
    assert [r.bundles for r in ranks] == [tuple(range(8 * i, 8 * i + 8)) for i in range(3)]
    for i, rank in enumerate(ranks):
        # vLLM's LLM refuses data_parallel_size > 1; its offline DP reads VLLM_DP_* instead
        assert rank.kwargs["data_parallel_size"] == 1
        assert rank.kwargs["distributed_executor_backend"] == "ray"
        assert rank.env["VLLM_RAY_BUNDLE_INDICES"] == ",".join(map(str, rank.bundles))
        assert (rank.env["VLLM_DP_RANK"], rank.env["VLLM_DP_SIZE"]) == (str(i), "3")
        assert (rank.env["VLLM_DP_MASTER_IP"], rank.env["VLLM_DP_MASTER_PORT"]) == (
            "10.0.0.1", "29555")
    assert json.dumps([dict(r.env) for r in ranks])  # plain strings only, for os.environ


def test_a_one_gpu_engine_keeps_vllms_own_executor_and_its_host_the_gpu_share(tmp_path):
    plan = _plan("tiny_cpu")
    [rank] = launch(_engine(plan))
    assert rank.kwargs == {"tensor_parallel_size": 1} and rank.env == {}
    assert rank.host_gpus == 0.2
    # the host share the driver gives the engine actor agrees (runtime/workers/actors.py)
    from runtime.workers import actors

    _, _, config = job_config(tmp_path)
    assert actors.engine_host_gpus(config, 0) == rank.host_gpus
    many = config.with_overrides(engines=({"gpus": [{"node": 0, "gpu": 0},
                                                    {"node": 0, "gpu": 1}]},))
    assert actors.engine_host_gpus(many, 0) == 0.0


def test_bundles_must_match_the_engines_gpus():
    plan = _plan("qwen3_30b_2node")
    engine = _engine(plan)
    with pytest.raises(ValueError, match="15 bundles for tp 16 x dp 1"):
        launch(EngineSlice(**{**engine.__dict__, "bundles": engine.bundles[:15]}))


def test_weight_transfer_backend_and_the_fallback():
    plan = _plan("qwen3_30b")
    colocated = _engine(plan)
    apart = EngineSlice(**{**colocated.__dict__, "colocated": False})
    assert weight_transfer_backend(colocated, {}) == "ipc"
    assert weight_transfer_backend(apart, {}) == "nccl"
    assert weight_transfer_backend(apart, {"weight_transfer_config": {"backend": "ipc"}}) == "ipc"
    assert weight_path("ipc", actor_on_cuda=True, every_rank_holds_all=True) == "ipc"
    assert weight_path("nccl", actor_on_cuda=True, every_rank_holds_all=False) == "nccl"
    # IPC needs every actor rank to hold every tensor; no CUDA, no vLLM trainer engine
    assert weight_path("ipc", actor_on_cuda=True, every_rank_holds_all=False) == "collective_rpc"
    assert weight_path("nccl", actor_on_cuda=False, every_rank_holds_all=True) == "collective_rpc"
    assert weight_path("sharded_rdt", actor_on_cuda=True, every_rank_holds_all=True) == (
        "collective_rpc")

