"""MoE experts as grouped GEMMs (`torch._grouped_mm`), without Transformer Engine.

`GroupedMLP` replaces megatron-core's SequentialMLP (one GEMM per expert per projection) in
the local layer spec with three grouped GEMMs per projection; it subclasses SequentialMLP and
changes only `forward`, so parameter names, shards and checkpoints are megatron-core's.
Outputs and gradients equal SequentialMLP's within bf16 rounding
(tests/oracle/test_megatron_grouped_experts.py). `unsupported_reason` says when a config
cannot take this path; runtime/megatron/model.py then builds SequentialMLP and says why.
The design, its cost and the kernel's constraints: docs/design.md, "Grouped-GEMM experts".
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
