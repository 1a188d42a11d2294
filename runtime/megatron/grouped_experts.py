"""MoE experts as grouped GEMMs (`torch._grouped_mm`), without Transformer Engine.

megatron-core's local layer spec runs its experts as SequentialMLP: one GEMM per expert per
projection, so a layer of 128 experts launches ~384 GEMMs forward and ~768 backward, and the
step is bound by the host launching them (docs/gpu-runs.md). `GroupedMLP` computes the same
thing with three grouped GEMMs per projection (forward; input and weight gradients), in place
of SequentialMLP in the MoE layer spec; megatron-core's router and token dispatcher are
unchanged: it takes what SequentialMLP takes, `(permuted tokens [T, h], tokens_per_expert [E],
permuted_probs [T])` with the tokens sorted by local expert, and returns `(output, None)`.

Design: the parameters stay SequentialMLP's. `GroupedMLP` subclasses SequentialMLP and keeps
its constructor, so the module tree, the parameter names (`local_experts.{i}.linear_fc1.
weight`, `...linear_fc2.weight`), their etp shards, attributes (`allreduce`, expert-parallel
marks), initialisation and `sharded_state_dict` are megatron-core's own, untouched: the HF
mapping (mapping.py), the sharded gather for export (shards.py), `vime convert`, torch_dist
checkpoints of either path and the distributed optimizer see no difference, and a checkpoint
saved with one path loads in the other. Only `forward` differs. The price is a copy: every
forward stacks the local experts' fc1 and fc2 weights into one [E, out, in] tensor per
projection, and every backward stacks them again rather than keeping the stacked copy alive
from forward to backward (for Qwen3-30B-A3B at ep 1 that copy is 1.2 GB per layer, 58 GB over
48 layers if it were kept). The copy reads and writes the weights once, a memory-bound pass,
against the GEMMs' 2·T·top_k·(3·h·f) FLOPs; measured on the CPU in
benchmarks/gpu/grouped_experts_bench.py and to be measured on the H200 (docs/gpu-runs.md).
Holding stacked parameters instead would save the copy but change the parameter names, the
dist-checkpoint layout and the mapping, which the issue asks to keep.

Numerics: per expert, the same operations in the same dtypes as megatron-core's MLP on its
unfused path (fc1, the GLU `act(gate) * (up + glu_linear_offset)` with the optional clamp,
times the routing prob, cast back, fc2); the GEMMs themselves differ in blocking, so outputs
and gradients equal SequentialMLP's within bf16 rounding, not bit for bit
(tests/oracle/test_megatron_grouped_experts.py).

`torch._grouped_mm` wants bf16, strides that are multiples of 16 bytes (so hidden, the local
fc1 width 2·f/etp and f/etp multiples of 8), and a contiguous upstream gradient (its
backward's "Invalid strides/sizes, got [0, 0]" otherwise). Our backward makes the gradient
contiguous, zeroes the weight gradient of experts that got no token (kernels on other
architectures than Hopper have left garbage there: pytorch/pytorch#172439), and never calls
the op with zero rows. `unsupported_reason` says when a config cannot take this path;
runtime/megatron/model.py then builds SequentialMLP and says why.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.moe.experts import SequentialMLP

_ALIGN = 8  # bf16 elements in 16 bytes


class _GroupedLinear(torch.autograd.Function):
    """y[rows of expert e] = x[rows of expert e] @ W_e^T for the W_e given (each [out, in]);
    rows sorted by expert, `offs` their cumulative ends (int32 on x's device)."""

    @staticmethod
    def forward(ctx, x, offs, empty, *weights):
        ctx.save_for_backward(x, offs, empty, *weights)
        out = weights[0].shape[0]
        if x.shape[0] == 0:
            return x.new_zeros((0, out))
        return torch._grouped_mm(x, torch.stack(weights).transpose(1, 2), offs=offs)

    @staticmethod
    def backward(ctx, grad):
        x, offs, empty, *weights = ctx.saved_tensors
        if x.shape[0] == 0:
            return (x.new_zeros(x.shape) if ctx.needs_input_grad[0] else None, None, None,
                    *(torch.zeros_like(w) for w in weights))
        grad = grad.contiguous()
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = torch._grouped_mm(grad, torch.stack(weights), offs=offs)
        grad_w = torch._grouped_mm(grad.t(), x, offs=offs)  # [E, out, in]
        grad_w.masked_fill_(empty.view(-1, 1, 1), 0)
        return grad_x, None, None, *grad_w.unbind(0)


def unsupported_reason(config, expert_tensor_parallel: int = 1) -> str | None:
    """Why this config's experts cannot run as GroupedMLP, or None when they can."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    if config.params_dtype != torch.bfloat16:
        return f"parameters in {config.params_dtype}, the grouped GEMM wants bf16"
    if config.fp8 or config.fp4:
        return "fp8/fp4 experts"
    if config.add_bias_linear:
        return "expert biases"
    if config.use_te_activation_func or config.bias_activation_fusion:
        return "a fused or TE activation"
    if getattr(config, "moe_latent_size", None) is not None:
        return "moe_latent_size"
    ffn = config.moe_ffn_hidden_size
    widths = {"hidden": config.hidden_size, "ffn / etp": ffn // expert_tensor_parallel}
    odd = [f"{k} = {v}" for k, v in widths.items() if v % _ALIGN]
    if odd or ffn % expert_tensor_parallel:
        return (f"{', '.join(odd) or f'ffn {ffn} over etp {expert_tensor_parallel}'}: the grouped "
                f"GEMM needs multiples of {_ALIGN} (16-byte strides in bf16)")
    return None


def probe(device: torch.device) -> str | None:
    """Run one tiny grouped GEMM forward and backward on `device` (bf16, an expert with no
    rows among them): None when it works, else why not."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        return f"compute capability {torch.cuda.get_device_capability(device)} < 8.0"
    try:
        counts = torch.tensor([3, 0, 5], device=device)
        generator = torch.Generator().manual_seed(0)  # leaves the global RNG streams alone

        def tensor(*shape):
            return torch.randn(*shape, generator=generator).to(device, torch.bfloat16) \
                .requires_grad_(True)

        x = tensor(8, 16)
        weights = [tensor(8, 16) for _ in range(3)]
        y = _GroupedLinear.apply(x, counts.cumsum(0).to(torch.int32), counts == 0, *weights)
        y.square().sum().backward()
        reference = torch.cat([x[:3] @ weights[0].t(), x[3:] @ weights[2].t()])
        if not torch.allclose(y.float(), reference.float(), atol=0.5, rtol=0.05):
            return "torch._grouped_mm disagrees with a per-expert matmul on a probe"
    except (RuntimeError, NotImplementedError) as error:
        return f"torch._grouped_mm fails on {device.type}: {error}"
    return None


class GroupedMLP(SequentialMLP):
    """SequentialMLP's experts (same parameters, names and checkpoints), computed as grouped
    GEMMs: see the module docstring."""

    def forward(self, permuted_local_hidden_states: torch.Tensor,
                tokens_per_expert: torch.Tensor, permuted_probs: torch.Tensor):
        config = self.config
        hidden, probs = permuted_local_hidden_states, permuted_probs
        if config.moe_apply_probs_on_input:  # as SequentialMLP
            assert config.moe_router_topk == 1, \
                "`moe_apply_probs_on_input` only works with `moe_router_topk`=1."
            hidden = (probs.unsqueeze(-1) * hidden).to(hidden.dtype)
            probs = torch.ones_like(probs)
        counts = torch.as_tensor(tokens_per_expert).to(hidden.device, non_blocking=True)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        empty = counts == 0
        experts = self.local_experts
        fc1 = _GroupedLinear.apply(hidden, offs, empty, *(e.linear_fc1.weight for e in experts))
        if config.gated_linear_unit:  # megatron-core MLP.forward's unfused glu
            gate, up = torch.chunk(fc1, 2, dim=-1)
            if (clamp := config.activation_func_clamp_value) is not None:
                gate = gate.clamp(min=None, max=clamp)
                up = up.clamp(min=-clamp, max=clamp)
            act = config.activation_func(gate) * (up + config.glu_linear_offset)
        else:
            act = config.activation_func(fc1)
        act = (act * probs.unsqueeze(-1)).to(act.dtype)
        out = _GroupedLinear.apply(act, offs, empty, *(e.linear_fc2.weight for e in experts))
        return out, None
