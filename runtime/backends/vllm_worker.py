"""What vime runs inside each vLLM worker: a worker extension (vLLM's `worker_extension_cls`),
whose methods `LLM.collective_rpc("vime_...")` calls by name on every worker of an engine;
runtime/backends/vllm_rollout.py makes those calls. This module imports torch only; vLLM's
own modules are imported inside the methods, which run in the worker.

Why by name, how a bucket travels and the fallback weight update:
docs/design.md, "The vLLM worker extension".
"""

from __future__ import annotations

import torch

# tensors as bytes: (name, dtype without "torch.", shape, raw bytes)
Packed = list[tuple[str, str, list[int], bytes]]


def pack(tensors: dict) -> Packed:
    """HF-named tensors as plain data for a collective_rpc to a worker in another process."""
    out = []
    for name, tensor in tensors.items():
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        out.append((name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape),
                    flat.view(torch.uint8).numpy().tobytes()))
    return out


def unpack(packed: Packed, device=None) -> list[tuple[str, torch.Tensor]]:
    out = []
    for name, dtype, shape, raw in packed:
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        tensor = data.view(getattr(torch, dtype)).reshape(shape)
        out.append((name, tensor if device is None else tensor.to(device)))
    return out


class VimeWorkerExtension:
    """Mixed into vLLM's worker class: `self` is the worker (self.model_runner, self.device)."""

    def vime_start_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self._vime_moe_kernels = _forget_moe_kernels(self.model_runner.model)
        initialize_layerwise_reload(self.model_runner.model)
        self._vime_loaded = 0

    def vime_load(self, tensors) -> int:
        """One bucket: a dict of tensors (in-process) or `pack`ed bytes (another process)."""
        model = self.model_runner.model
        weights = list(tensors.items()) if isinstance(tensors, dict) else unpack(tensors)
        model.load_weights(weights=weights)
        self._vime_loaded = getattr(self, "_vime_loaded", 0) + len(weights)
        return len(weights)

    def vime_finish_update(self) -> int:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model_runner.model, self.model_runner.model_config)
        for method, kernel in getattr(self, "_vime_moe_kernels", ()):
            if method.moe_kernel is None:  # the layer got no weights in this round
                method.moe_kernel = kernel
        self._vime_moe_kernels = []
        return getattr(self, "_vime_loaded", 0)

    def vime_fingerprints(self, names: list[str]) -> dict:
        """runtime.core.weights.fingerprints of this worker's parameters of those names."""
        from runtime.core import weights

        return weights.fingerprints(self.model_runner.model.named_parameters(), names)


def _forget_moe_kernels(model) -> list:
    """The MoE layers whose experts process their weights themselves (on CPU: the prepack into
    the grouped-gemm layout, fused_moe/experts/cpu_moe.py), with their kernels, which are
    dropped. vLLM 0.32's unquantized MoE method runs that processing only while it has no
    kernel yet (unquantized_fused_moe_method.py, _setup_kernel): on the reload's
    process_weights_after_loading it copied the new, unpacked experts over the packed ones
    and the engine computed with neither (tests/live/test_vllm_cpu.py). Without its kernel the
    method takes its first-load path again, on the layer being reloaded; a layer that gets no
    weights in the round has its kernel given back (vime_finish_update)."""
    try:
        from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEExperts
    except ImportError:  # a vLLM without modular MoE kernels: nothing of this kind
        return []
    forgotten = []
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        kernel = getattr(method, "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if (experts is not None and type(experts).process_weights_after_loading
                is not FusedMoEExperts.process_weights_after_loading):
            forgotten.append((method, kernel))
            method.moe_kernel = None
    return forgotten
