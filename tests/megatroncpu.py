"""Test-only helpers for megatron-core on the CPU over gloo (imported as `megatroncpu`, like
`specsupport`): a tiny MoE config, a free port for the process group, and CPU stand-ins for
the CUDA streams and device queries that megatron-core's alltoall dispatcher and rotary
embedding make. The runtime never uses them; they answer on the CPU what megatron-core asks
of CUDA."""

from __future__ import annotations

import contextlib
import os
import socket
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# A Qwen3-MoE small enough for a CPU process: its first layer dense, the second MoE (the shard
# and grouped-experts oracles build it).
TINY_MOE = {
    "model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 64,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
    "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 4,
    "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [0],
    "tie_word_embeddings": False, "max_position_embeddings": 256, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6, "norm_topk_prob": True,
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gloo_ranks(work, world: int, *args) -> list:
    """`work(rank, *args)` in `world` spawned processes of one gloo group (work: a module-level
    function, as spawn pickles it by name); what each returned, in rank order. A rank that
    raised fails the caller with that rank's traceback."""
    port = free_port()
    results = mp.Manager().dict()
    mp.spawn(_gloo_rank, args=(work, world, port, results, args), nprocs=world, join=True)
    got = [results[rank] for rank in range(world)]
    for rank, result in enumerate(got):
        assert "error" not in result, f"rank {rank}:\n{result['error']}"
    return [result["value"] for result in got]


def _gloo_rank(rank: int, work, world: int, port: int, results, args) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results[rank] = {"value": work(rank, *args)}
    except Exception:  # noqa: BLE001  (reported to the test, which fails on it)
        results[rank] = {"error": traceback.format_exc()}
    finally:
        dist.destroy_process_group()


def single_rank_parallel_state():
    """megatron-core's parallel state for this process alone (gloo, every size 1), set up once
    per process: a module's fixture for in-process CPU tests."""
    from megatron.core import parallel_state

    warnings.simplefilter("ignore")
    if not torch.distributed.is_initialized():
        # an in-memory store: no port, and no MASTER_PORT left in this process's environment
        # for the commands a later test starts to inherit
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(),
                                             world_size=1, rank=0)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    return parallel_state


class NoStream:
    """A CUDA stream's stand-in for the alltoall dispatcher's device-to-host copies."""

    def wait_stream(self, _other):
        pass

    def record_event(self):
        return self

    def synchronize(self):
        pass


def cpu_streams() -> None:
    """For the rest of this (spawned) process: torch.cuda's device and stream calls that
    megatron-core makes on the MoE and rotary paths, answered on the CPU."""
    stream = NoStream()
    torch.cuda.current_device = lambda: "cpu"  # megatron's rotary embedding asks for it
    torch.cuda.Stream = lambda *_a, **_k: stream
    torch.cuda.current_stream = lambda *_a, **_k: stream
    torch.cuda.stream = lambda _s: contextlib.nullcontext()
