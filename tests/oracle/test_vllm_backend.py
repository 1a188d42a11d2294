"""The vLLM rollout backend's conversions, on vLLM 0.33's real objects (CPU; no engine runs).

Set up and run like test_vllm.py (`make oracle-vllm`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

vllm_platforms = pytest.importorskip("vllm.platforms")
from vllm.platforms.cpu import CpuPlatform  # noqa: E402

vllm_platforms._current_platform = CpuPlatform()

from vllm import SamplingParams as VllmSamplingParams  # noqa: E402
from vllm.logprobs import Logprob  # noqa: E402
from vllm.outputs import CompletionOutput  # noqa: E402

from runtime.backends.vllm_rollout import engine_kwargs, sampling_params, to_generation  # noqa: E402
from runtime.core.interfaces import GenerationRequest, SamplingParams  # noqa: E402
from runtime.megatron.routing import ReplayLayout, local_routes  # noqa: E402
from vime import pipeline  # noqa: E402
from vime.emit.vllm import vllm_args  # noqa: E402
from vime.parse import Source  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def compiled_args(name: str) -> list[str]:
    spec = ROOT / "specs" / f"{name}.toml"
    result = pipeline.run(Source(str(spec), spec.read_text()), [], spec.parent)
    return [token for group in vllm_args(result.plan) for token in group]


def test_engine_kwargs_are_vllms_engine_arguments_of_the_plan():
    kwargs = engine_kwargs(compiled_args("qwen3_30b_24gpu_eplb"))
    assert kwargs["model"] == "/shared/models/Qwen3-30B-A3B"
    assert (kwargs["tensor_parallel_size"], kwargs["data_parallel_size"]) == (8, 3)
    assert kwargs["enable_expert_parallel"] and kwargs["enable_eplb"]
    assert kwargs["eplb_config"].num_redundant_experts == 16
    assert kwargs["enable_return_routed_experts"] and kwargs["enable_sleep_mode"]
    assert kwargs["logprobs_mode"] == "processed_logprobs"
    assert kwargs["distributed_executor_backend"] == "ray"


def test_sampling_params_are_vllms():
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=64,
                            stop_token_ids=(151645,), return_routed_experts=True)
    out = sampling_params(params, GenerationRequest(prompt_ids=(1, 2, 3), seed=42))
    assert isinstance(out, VllmSamplingParams)
    assert (out.temperature, out.top_p, out.max_tokens, out.seed, out.logprobs, out.n) == (
        0.7, 0.9, 64, 42, 0, 1)
    assert out.stop_token_ids == [151645]


def _completion(routes=True, logprobs=True, finish="stop"):
    tokens = [11, 12, 13]
    return CompletionOutput(
        index=0, text="", token_ids=tokens, cumulative_logprob=-1.5,
        logprobs=[{t: Logprob(logprob=-0.5 * (i + 1), rank=1)} for i, t in enumerate(tokens)]
        if logprobs else None,
        routed_experts=np.arange(6 * 2 * 4, dtype=np.uint8).reshape(6, 2, 4) if routes else None,
        finish_reason=finish)


def test_completion_becomes_a_generation_with_routes_the_actor_can_replay():
    gen = to_generation(_completion(finish="length"), want_routes=True)
    assert gen.token_ids == [11, 12, 13] and gen.finish_reason == "length"
    assert gen.log_probs == [-0.5, -1.0, -1.5]
    assert gen.routed_experts.dtype == np.int32 and gen.routed_experts.shape == (6, 2, 4)
    # prompt of 4 + 3 response tokens = 7 tokens; vLLM routed the first 6
    routes = local_routes([gen.routed_experts], [7], moe_layers=2, layout=ReplayLayout())
    assert routes.shape == (7, 2, 4) and np.array_equal(routes[:6], gen.routed_experts)


def test_missing_pieces_are_errors_not_silent_zeros():
    with pytest.raises(ValueError, match="no log-probs"):
        to_generation(_completion(logprobs=False), want_routes=False)
    with pytest.raises(ValueError, match="enable-return-routed-experts"):
        to_generation(_completion(routes=False), want_routes=True)
    assert to_generation(_completion(routes=False), want_routes=False).routed_experts is None


# ------------------------------------------------------------- weight transfer, launch

from vllm.config import WeightTransferConfig  # noqa: E402
from vllm.distributed.weight_transfer.base import ParamMeta  # noqa: E402
from vllm.distributed.weight_transfer.factory import (  # noqa: E402
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)
from vllm.distributed.weight_transfer.ipc_engine import (  # noqa: E402
    IPCTrainerInitInfo,
    IPCWeightTransferEngine,
    IPCWeightTransferInitInfo,
)
from vllm.distributed.weight_transfer.nccl_engine import (  # noqa: E402
    NCCLTrainerInitInfo,
    NCCLWeightTransferEngine,
    NCCLWeightTransferInitInfo,
    NCCLWeightTransferUpdateInfo,
)
from vllm.engine.arg_utils import EngineArgs  # noqa: E402

from runtime.backends import vllm_weights  # noqa: E402
from runtime.backends.vllm_rollout import launch, weight_transfer_backend  # noqa: E402
from runtime.core import weights  # noqa: E402
from runtime.core.slices import EngineSlice  # noqa: E402


def _engine_slice(name: str, colocated: bool | None = None) -> EngineSlice:
    spec = ROOT / "specs" / f"{name}.toml"
    result = pipeline.run(Source(str(spec), spec.read_text()), [], spec.parent)
    engine = result.plan.engines[0]
    gpus = tuple(tuple(g) for g in engine.gpus)  # (node, gpu), vime/plan/placement.py
    return EngineSlice(backend="vllm", engine=0, gpus=gpus, tp=engine.tp, dp=engine.dp,
                       ep=engine.ep, model=None, max_model_len=1, cpu_threads=1,
                       args=tuple(compiled_args(name)), bundles=tuple(range(len(gpus))),
                       colocated=result.spec.train.colocate if colocated is None else colocated)


def test_the_engine_starts_with_vllms_weight_transfer_config():
    for colocated, backend in ((True, "ipc"), (False, "nccl")):
        engine = _engine_slice("qwen3_30b_2node", colocated)
        [rank] = launch(engine)
        kwargs = {**engine_kwargs(engine.args), **rank.kwargs}
        assert weight_transfer_backend(engine, kwargs) == backend
        kwargs["weight_transfer_config"] = WeightTransferConfig(backend=backend)
        args = EngineArgs(**kwargs)  # vLLM's own dataclass takes every key
        assert args.weight_transfer_config.backend == backend
        assert args.distributed_executor_backend == "ray"
        assert args.tensor_parallel_size == 16
        # the worker side's engine for that backend exists in vLLM's registry
        engine_cls = {"ipc": IPCWeightTransferEngine, "nccl": NCCLWeightTransferEngine}[backend]
        assert WeightTransferEngineFactory._registry[backend]() is engine_cls
        assert backend in WeightTransferTrainerFactory._registry
    # a --weight-transfer-config in inference.extra_args wins, parsed by vLLM into its config
    user = engine_kwargs([*compiled_args("qwen3_30b"), "--weight-transfer-config",
                          '{"backend": "nccl"}'])
    assert weight_transfer_backend(_engine_slice("qwen3_30b"), user) == "nccl"


def test_the_24_gpu_engine_per_dp_rank_is_what_vllms_engine_args_accept():
    engine = _engine_slice("qwen3_30b_24gpu_eplb")
    ranks = launch(engine, dp_master=("10.0.0.1", 29555))
    assert len(ranks) == 3
    for rank in ranks:
        args = EngineArgs(**{**engine_kwargs(engine.args), **rank.kwargs})
        assert (args.tensor_parallel_size, args.data_parallel_size) == (8, 1)
        assert args.enable_eplb and args.distributed_executor_backend == "ray"
        assert len(rank.env["VLLM_RAY_BUNDLE_INDICES"].split(",")) == args.tensor_parallel_size


def test_nccl_init_infos_are_vllms_with_one_rank_range_per_engine():
    info = vllm_weights.trainer_init_info("nccl", rank=0, bucket_bytes=256 << 20,
                                          master=("10.0.0.1", 29600), engine_worlds=[8, 8])
    assert isinstance(info, NCCLTrainerInitInfo) and info.backend == "nccl"
    assert info.world_size == 17 and info.is_sender and info.packed
    assert info.packed_buffer_size_bytes == 256 << 20
    payloads = vllm_weights.worker_init_infos(info, [8, 8])
    assert [p["rank_offset"] for p in payloads] == [1, 9]
    for payload in payloads:  # what the workers' engine parses (WeightTransferEngine.parse_init_info)
        parsed = NCCLWeightTransferInitInfo(**payload)
        assert (parsed.master_address, parsed.master_port, parsed.world_size) == (
            "10.0.0.1", 29600, 17)
        assert parsed.packed_buffer_size_bytes == 256 << 20
    with pytest.raises(ValueError, match="address and port"):
        vllm_weights.trainer_init_info("nccl", 0, 1 << 20)


def test_ipc_init_infos_and_update_infos_are_vllms():
    info = vllm_weights.trainer_init_info("ipc", rank=1, bucket_bytes=512 << 20)
    assert isinstance(info, IPCTrainerInitInfo) and not info.is_sender
    assert vllm_weights.worker_init_infos(info, [8]) == [{"packed": True}]
    assert IPCWeightTransferInitInfo(**{"packed": True}).packed
    import torch

    metas = [ParamMeta("model.norm.weight", torch.bfloat16, (64,)),
             ParamMeta("model.layers.0.mlp.gate.weight", torch.bfloat16, (4, 64))]
    nccl = vllm_weights.update_info("nccl", metas)
    assert NCCLWeightTransferUpdateInfo(**nccl).dtype_names == ["bfloat16", "bfloat16"]
    ipc = vllm_weights.update_info("ipc", metas, ipc_handles={"GPU-0": ()},
                                   tensor_sizes=[128, 512])
    assert ipc["shapes"] == [[64], [4, 64]] and ipc["tensor_sizes"] == [128, 512]
    with pytest.raises(ValueError, match="ipc_handles"):
        vllm_weights.update_info("ipc", metas)


def test_the_export_is_a_weight_source_vllms_trainer_engines_accept():
    import torch

    state = {"model.norm.weight": torch.ones(8), "model.layers.0.input_layernorm.weight":
             torch.full((8,), 2.0), "model.layers.0.mlp.gate.weight": torch.zeros(4, 8)}

    def export():
        names = list(state)
        yield {n: state[n] for n in names[:2]}
        yield {names[2]: state[names[2]]}

    source = vllm_weights.ExportSource(export)
    vllm_source = source.vllm  # this vLLM's WeightSource over it (vllm_compat.weight_source)
    if hasattr(vllm_source, "iter_full"):  # 0.33: metadata a property, iter_full
        assert vllm_source.implements_iter_full() and not vllm_source.implements_iter_local()
        assert [m.name for m in vllm_source.metadata] == list(state)
        assert vllm_source.owned_names(0) == list(state)  # IPC: every rank owns everything
        assert [n for n, _ in vllm_source.iter_full()] == list(state)
    else:  # 0.26 / 0.32: metadata() and __iter__
        assert [m.name for m in vllm_source.metadata()] == list(state)
        assert [n for n, _ in vllm_source] == list(state)
    assert sorted(source.sample) == ["model.layers.0.input_layernorm.weight",
                                     "model.norm.weight"]
    # vLLM's NCCL trainer engine accepts the source up to its rendezvous, which needs a GPU
    info = vllm_weights.trainer_init_info("nccl", 1, 1 << 20, ("127.0.0.1", 1), [1])
    client = vllm_weights.EngineClient([], [])
    engine = WeightTransferTrainerFactory.trainer_init(init_info=info, client=client,
                                                       source=vllm_source)
    assert not engine.is_sender  # rank 1: no rendezvous, no RPC; only rank 0 sends
    assert weights.sample_names(state) == ["model.norm.weight",
                                           "model.layers.0.input_layernorm.weight"]


# ------------------------------------- the actor's trainer engines, routes and DP ranks

from vllm.config.parallel import ParallelConfig  # noqa: E402
from vllm.distributed.weight_transfer import nccl_common  # noqa: E402
from vllm.distributed.weight_transfer.nccl_engine import (  # noqa: E402
    NCCLTrainerWeightTransferEngine,
)

from runtime.backends.vllm_rollout import VllmRolloutBackend  # noqa: E402
from runtime.workers import weight_sync  # noqa: E402


class _EngineHost:
    """An engine host as the actor's client reaches it (RolloutWorker.call); the LLM behind
    it needs a GPU, so it records what it is given."""

    def __init__(self):
        self.calls = []

    def call(self, method, *args):
        self.calls.append((method, *args))


def _state():
    import torch

    return {"model.norm.weight": torch.ones(8), "model.layers.0.input_layernorm.weight":
            torch.full((8,), 2.0), "model.embed_tokens.weight": torch.zeros(64, 8)}


def test_vllms_trainer_engines_are_built_from_the_routes():
    ranks = [weight_sync.RankExport(on_cuda=True, holds_all=False)] * 2
    route = weight_sync.with_rendezvous(weight_sync.route(["nccl", "nccl"], ranks),
                                        ("10.0.0.1", 29600), [8, 16])
    state = _state()
    hosts = [_EngineHost(), _EngineHost()]
    # rank 1: vLLM's NCCL trainer engine, a non-sender with no client calls
    source = vllm_weights.ExportSource(lambda: iter([]))  # rank 1's export yields nothing
    engine = vllm_weights.trainer_engine(hosts, route, 1, source, 64 << 20)
    assert isinstance(engine, NCCLTrainerWeightTransferEngine) and not engine.is_sender
    assert engine.client.engines == [] and all(h.calls == [] for h in hosts)
    assert engine.packed_buffer_size_bytes == 64 << 20
    # rank 0's handshake: vLLM's own worker payload through the client to each engine, with
    # the route's rank ranges (the rendezvous itself needs CUDA and is not run)
    info = vllm_weights.trainer_init_info("nccl", 0, 64 << 20, route.master,
                                          route.engine_worlds)
    assert info.world_size == route.group_size == 25 and info.is_sender
    client = vllm_weights.EngineClient(hosts, route.engine_worlds)
    client.init_weight_transfer_engine(nccl_common.worker_init_payload(
        NCCLWeightTransferInitInfo(master_address=info.master_address,
                                   master_port=info.master_port, rank_offset=1,
                                   world_size=info.world_size)))
    assert [h.calls[0][0] for h in hosts] == ["init_weight_transfer"] * 2
    payloads = [h.calls[0][1] for h in hosts]
    parsed = [NCCLWeightTransferInitInfo(**p) for p in payloads]
    assert [p.rank_offset for p in parsed] == list(route.rank_offsets()) == [1, 9]
    assert {(p.master_address, p.master_port, p.world_size) for p in parsed} == {
        ("10.0.0.1", 29600, 25)}
    # the export as the engine's source: the rank's device, its bytes, the sample
    sent = vllm_weights.ExportSource(lambda: iter([state]), device="cpu")
    assert [n for n, _ in sent.stream()] == list(state)
    assert sent.sent_bytes == sum(t.numel() * t.element_size() for t in state.values())
    assert sorted(sent.sample) == ["model.layers.0.input_layernorm.weight",
                                   "model.norm.weight"]


def test_each_dp_rank_of_the_24_gpu_engine_is_one_of_vllms_dp_ranks(monkeypatch):
    engine = _engine_slice("qwen3_30b_24gpu_eplb")
    master = ("10.0.0.1", 29555)
    with pytest.raises(ValueError, match="one LLM per DP rank"):  # the whole engine
        VllmRolloutBackend().start(engine)
    # the actor's NCCL route to this engine of 24 workers, and the payload each worker gets
    route = weight_sync.with_rendezvous(
        weight_sync.route(["nccl"], [weight_sync.RankExport(on_cuda=True, holds_all=False)]),
        ("10.0.0.1", 29600), [24])  # TP 8 x DP 3
    [offset] = route.rank_offsets()
    payload = NCCLWeightTransferInitInfo(master_address="10.0.0.1", master_port=29600,
                                         rank_offset=offset, world_size=route.group_size)
    # vLLM's worker_init_process_group picks each worker's rank in that group (0.26 to 0.33);
    # its rendezvous needs CUDA, so the rank it would join with is recorded instead
    group_ranks = []
    monkeypatch.setattr(nccl_common, "stateless_init_process_group",
                        lambda address, port, rank, world_size, device: group_ranks.append(rank))
    monkeypatch.setattr(nccl_common.torch.accelerator, "current_device_index", lambda: 0)
    for dp_rank in range(engine.dp):
        rank_slice = engine.for_dp_rank(dp_rank, master)  # what the rank's host starts with
        [rank] = launch(rank_slice)
        assert rank.bundles == tuple(range(8 * dp_rank, 8 * dp_rank + 8))
        for name, value in rank.env.items():
            monkeypatch.setenv(name, value)
        kwargs = {**engine_kwargs(engine.args), **rank.kwargs}
        assert EngineArgs(**kwargs).data_parallel_size == 1  # LLM accepts it
        # vLLM's own ParallelConfig reads the DP layout from the rank's environment ("mp":
        # this venv has no Ray, which the "ray" executor asserts)
        config = ParallelConfig(tensor_parallel_size=kwargs["tensor_parallel_size"],
                                data_parallel_size=kwargs["data_parallel_size"],
                                enable_expert_parallel=True, distributed_executor_backend="mp")
        assert (config.data_parallel_size, config.data_parallel_rank) == (3, dp_rank)
        assert (config.data_parallel_master_ip, config.data_parallel_master_port) == master
        # every rank reports the engine's whole world: the NCCL group's size for the engine
        assert config.world_size_across_dp == 24
        for worker in range(config.world_size):
            config.rank = worker
            nccl_common.worker_init_process_group(payload, config)
    # all DP ranks take the engine's payload (offset 1); vLLM spreads their workers over the
    # group's ranks after the actor's sender, each once
    assert sorted(group_ranks) == list(range(offset, route.group_size)) == list(range(1, 25))
