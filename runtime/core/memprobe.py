"""What a step of torch code holds in memory on the CPU, for the tests and benchmarks that
check the memory planner's terms against it (tests/runtime/test_loss_head.py,
tests/oracle/test_megatron_moe_activations.py, benchmarks/gpu/loss_head_memory.py)."""

from __future__ import annotations

import torch


def saved_bytes(step) -> int:
    """Bytes of the distinct storages autograd saves for the backward during step(), leaving
    out leaves that require grad (inputs and parameters exist anyway)."""
    seen: dict[int, int] = {}

    def pack(tensor):
        if not (tensor.is_leaf and tensor.requires_grad):
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step()
    return sum(seen.values())


def peak_bytes(step) -> int:
    """The peak of live bytes the CPU allocator reports to torch's profiler during step(),
    over what was live before it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak
