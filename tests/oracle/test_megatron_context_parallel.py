"""Oracle: context-parallel attention (runtime/megatron/model.py's FlashCoreAttention with
cp = 2) against plain causal attention over the whole sequence, in two CPU processes over
gloo, with megatron-core's own gather (backward: reduce-scatter) between them.

Each rank holds chunks r and 3 − r of 4 (megatron's load-balanced order, the one its rotary
embedding slices positions by). Its outputs, and the gradients of its queries, keys and values
under a loss over every rank's outputs, must be those chunks of the whole-sequence results.
Grouped-query heads (4 query heads, 2 key/value heads) as in Qwen3.
"""

from __future__ import annotations

import os
import types
import warnings

import pytest

pytest.importorskip("megatron.core")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from megatroncpu import free_port  # noqa: E402

CP = 2
SEQ, BATCH, HEADS, KV_HEADS, DIM = 24, 2, 4, 2, 8


def _inputs():
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(SEQ, BATCH, HEADS, DIM, generator=generator)
    k = torch.randn(SEQ, BATCH, KV_HEADS, DIM, generator=generator)
    v = torch.randn(SEQ, BATCH, KV_HEADS, DIM, generator=generator)
    weight = torch.randn(SEQ, BATCH, HEADS * DIM, generator=generator)
    return q, k, v, weight


def _mine(full: torch.Tensor, rank: int) -> torch.Tensor:
    chunks = full.chunk(2 * CP, dim=0)
    return torch.cat([chunks[rank], chunks[2 * CP - 1 - rank]])


def _attention(cp_group):
    from runtime.megatron.model import FlashCoreAttention

    config = types.SimpleNamespace(context_parallel_size=1 if cp_group is None else CP)
    return FlashCoreAttention(config, 1, None, None, softmax_scale=DIM ** -0.5,
                              pg_collection=types.SimpleNamespace(cp=cp_group))


def _rank(rank: int, port: int, results) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=CP)
    try:
        q, k, v, weight = _inputs()
        # the whole sequence, plain causal attention
        whole = [t.clone().requires_grad_() for t in (q, k, v)]
        expected = _attention(None)(*whole)
        (expected * weight).sum().backward()
        # this rank's chunks, context parallel
        local = [_mine(t, rank).requires_grad_() for t in (q, k, v)]
        out = _attention(dist.group.WORLD)(*local)
        (out * _mine(weight, rank)).sum().backward()
        results[rank] = {
            "out": float((out - _mine(expected, rank)).abs().max()),
            **{f"grad_{name}": float((mine.grad - _mine(full.grad, rank)).abs().max())
               for name, mine, full in zip("qkv", local, whole, strict=True)},
            "scale": float(expected.abs().max()),
        }
    except Exception as error:  # noqa: BLE001  (reported to the test, which fails on it)
        results[rank] = {"error": repr(error)}
    finally:
        dist.destroy_process_group()


def test_context_parallel_attention_equals_whole_sequence_attention():
    port = free_port()
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(port, results), nprocs=CP, join=True)
    for rank in range(CP):
        got = results[rank]
        assert "error" not in got, got
        assert got["scale"] > 0.1
        wrong = {k: v for k, v in got.items() if k != "scale" and v > 1e-5}
        assert wrong == {}, f"rank {rank}: {got}"
