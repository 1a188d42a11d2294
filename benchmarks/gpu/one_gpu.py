"""The TrainSlice of a Megatron backend alone on one GPU (tp = pp = cp = ep = etp = dp = 1), the
one the GPU benchmarks build their backend from (megatron_backend_speed.py,
grouped_experts_bench.py, backend_memory_grid.py): seeded random weights, GPU Adam, one dynamic
micro-batch of `tokens` tokens, no reference model, no routing replay."""

from __future__ import annotations

from types import MappingProxyType

from runtime.core.slices import LossConfig, ModelSlice, OptimizerSlice, TrainSlice


def train_slice(arch: dict, tokens: int, recompute: str = "none",
                transformer_impl: str = "local") -> TrainSlice:
    """`transformer_impl`: the spec's train.transformer_impl; "local" unless a benchmark asks,
    so that a machine with Transformer Engine measures what it says it measures."""
    ones = {k: 1 for k in ("tp", "pp", "cp", "ep", "etp", "dp", "edp")}
    return TrainSlice(
        backend="megatron", model=ModelSlice("", MappingProxyType(arch), True, 1234), rank=0,
        world_size=1, node=0, gpu=0, coords=MappingProxyType({k: 0 for k in ones}),
        parallel=MappingProxyType(ones), master_addr="127.0.0.1", master_port=0,
        optimizer=OptimizerSlice(1e-6, 0.1, 0.9, 0.98, 1.0), loss=LossConfig(), temperature=1.0,
        micro_batch_size=1, dynamic_batch=True, max_tokens_per_gpu=tokens,
        needs_ref=False, routing_replay=False, recompute=recompute, cpu_threads=8,
        transformer_impl=transformer_impl)
