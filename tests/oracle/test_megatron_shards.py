"""Oracle: full tensors -> one rank's pieces -> full tensors again, under real megatron-core
tensor and expert parallel layouts (two CPU processes over gloo).

Every rank builds the same tiny Qwen3-MoE GPTModel under its layout, fills its pieces from
full tensors made up per name (runtime/megatron/shards.py reads megatron's own
sharded_state_dict for where each piece sits), then gathers: every rank must get back every
full tensor bit for bit, under names that megatron_to_hf accepts (so none is missing), and
each rank's parameters must really hold a slice (not the whole tensor) where the layout
shards it.
"""

from __future__ import annotations

import os
import warnings
import zlib

import pytest

pytest.importorskip("megatron.core")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from megatroncpu import TINY_MOE, free_port  # noqa: E402

TINY = TINY_MOE


def made_up(name: str, shape) -> torch.Tensor:
    generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(tuple(shape), generator=generator).to(torch.bfloat16)


def _rank(rank: int, world: int, port: int, tp: int, ep: int, results) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from megatron.core import parallel_state

        from runtime.megatron import shards
        from runtime.megatron.mapping import megatron_to_hf
        from runtime.megatron.model import build_gpt, transformer_config
        from vime.resolve.model import arch_from_config

        parallel_state.initialize_model_parallel(tp, 1, expert_model_parallel_size=ep)
        arch = arch_from_config(TINY)
        # the allgather dispatcher builds on CPU (alltoall makes CUDA streams); the layout of
        # the weights does not depend on the dispatcher
        config = transformer_config(arch, tensor_model_parallel_size=tp,
                                    expert_model_parallel_size=ep, use_cpu_initialization=True,
                                    moe_token_dispatcher_type="allgather",
                                    variable_seq_lengths=False)
        gpt = build_gpt(arch, config, 256)
        pieces = shards.pieces(gpt)
        full = {p.name: made_up(p.name, p.full_shape) for p in pieces}
        shards.fill(gpt, full)
        held: dict[str, int] = {}  # elements of each tensor this rank holds (fc1: 2 pieces)
        for p in pieces:
            held[p.name] = held.get(p.name, 0) + p.data.numel()
        sharded = sorted(p.name for p in pieces if held[p.name] < full[p.name].numel())
        gathered = {}
        for bucket in shards.gather(gpt, bucket_bytes=64 * 1024):
            gathered.update({k: v.clone() for k, v in bucket.items()})
        wrong = sorted(n for n, t in gathered.items()
                       if not torch.equal(t, made_up(n, t.shape)))
        hf_names = sorted(megatron_to_hf(gathered, arch))
        local_experts = sorted({p.name.split(".local_experts.")[1].split(".")[0]
                                for p in pieces if ".local_experts." in p.name})
        results[rank] = {"wrong": wrong, "count": len(gathered), "hf": len(hf_names),
                         "sharded": sharded, "experts": local_experts}
    except Exception as error:  # noqa: BLE001  (reported to the test, which fails on it)
        results[rank] = {"error": repr(error)}
    finally:
        dist.destroy_process_group()


def _run(tp: int, ep: int, world: int = 2) -> dict:
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(world, free_port(), tp, ep, results), nprocs=world)
        return dict(results)


def test_tensor_parallel_round_trip():
    results = _run(tp=2, ep=1)
    for rank, result in results.items():
        assert "error" not in result, result
        assert result["wrong"] == [], f"rank {rank}"
        # embedding, final norm, head; per layer qkv, proj, 4 norms; dense fc1/fc2; router; 4×2 experts
        assert result["count"] == 3 + 2 * 6 + 2 + 1 + 8
        assert result["hf"] == 3 + 2 * 8 + 3 + 1 + 12  # + q/k/v and gate/up unfused
        # what tensor parallelism must split
        for name in ("embedding.word_embeddings.weight", "output_layer.weight",
                     "decoder.layers.0.self_attention.linear_qkv.weight",
                     "decoder.layers.0.mlp.linear_fc1.weight",
                     "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight"):
            assert name in result["sharded"], (rank, name)
        assert "decoder.layers.1.mlp.router.weight" not in result["sharded"]
        assert result["experts"] == ["0", "1", "2", "3"]


def test_expert_parallel_round_trip():
    results = _run(tp=1, ep=2)
    for result in results.values():
        assert "error" not in result, result
        assert result["wrong"] == []
        assert result["count"] == 3 + 2 * 6 + 2 + 1 + 8
        assert result["sharded"] == []  # experts are split, each expert's tensor is whole
    assert results[0]["experts"] == ["0", "1"]
    assert results[1]["experts"] == ["2", "3"]
