"""What both torch backends share: building the model from its slice, HF checkpoint names
for weight sync, the routers' capture (rollout) and replay (training) of routed experts, and
device and thread settings.

transformers 5 keeps each MoE layer's experts as two fused tensors
(`mlp.experts.gate_up_proj` [E, 2I, H] and `mlp.experts.down_proj` [E, H, I]) while HF
checkpoints, and therefore vLLM's loader and Megatron's converters, name every expert's
projections separately (`mlp.experts.7.gate_proj.weight`). Weight sync uses the checkpoint
names; the conversion is here, in both directions.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from runtime.core.slices import ModelSlice

_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
_FUSED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def device_for_this_process() -> torch.device:
    """The GPU Ray gave this actor (CUDA_VISIBLE_DEVICES), else the CPU: on a machine
    without GPUs Ray's GPUs are logical and the model runs on the CPU."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def set_threads(count: int) -> None:
    torch.set_num_threads(max(1, count))
    os.environ["OMP_NUM_THREADS"] = str(max(1, count))


def release_cached_memory(device: torch.device) -> None:
    """Give freed blocks back to the driver, so the other side of a colocated run can use
    them (the caching allocator would keep them otherwise)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def has_weights(folder: str) -> bool:
    path = Path(folder)
    return path.is_dir() and any(path.glob("*.safetensors")) or (path / "pytorch_model.bin").exists()


def build_model(model: ModelSlice, device: torch.device) -> torch.nn.Module:
    """From hf_checkpoint's weights, or (model.random_init) from the architecture with the
    experiment's seed: every process that builds it gets the same weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = dict(model.arch)
    if model.random_init:
        model_type = arch.pop("model_type", "qwen3_moe")
        config = AutoConfig.for_model(model_type, **arch)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(model.seed)
            module = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        if not has_weights(model.hf_checkpoint):
            raise FileNotFoundError(
                f"model.hf_checkpoint = {model.hf_checkpoint!r} holds no weights (*.safetensors); "
                "set model.random_init = true to start from random weights")
        module = AutoModelForCausalLM.from_pretrained(model.hf_checkpoint, dtype=torch.float32)
    module.config.use_cache = False
    return module.to(device)


def forward(module, input_ids, attention_mask=None, position_ids=None, cache=None):
    """The model's forward across transformers 5 releases (the KV cache argument was renamed
    from past_key_values to cache)."""
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask,
              "position_ids": position_ids}
    if cache is not None:
        kwargs["use_cache"] = True
        kwargs["cache" if _takes_cache(module) else "past_key_values"] = cache
    return module(**kwargs)


def hidden_states(module, input_ids, attention_mask=None, params=None) -> torch.Tensor:
    """The decoder's last hidden states [n, s, h] (after its final norm), what the LM head
    multiplies by its weight; `params` (the full model's names) for a functional call, as the
    reference policy's weights are used."""
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if params is None:
        return module.model(**kwargs).last_hidden_state
    inner = {name.removeprefix("model."): value for name, value in params.items()
             if name.startswith("model.")}
    return torch.func.functional_call(module.model, inner, (), kwargs).last_hidden_state


def output_weight(module, params=None) -> torch.Tensor:
    """The LM head's weight [V, h] (the embedding's when tied), of `params` when given: the
    logits are hidden_states @ weight.T (Qwen3's head, a linear layer without bias)."""
    head = module.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise NotImplementedError("an LM head with a bias (the loss head computes "
                                  "hidden @ weight.T)")
    if params is None:
        return head.weight
    return params[next(n for n, p in module.named_parameters() if p is head.weight)]


def _takes_cache(module) -> bool:
    import inspect

    return "cache" in inspect.signature(module.model.forward).parameters


def new_cache(module):
    from transformers import DynamicCache

    return DynamicCache(config=module.config)


# ------------------------------------------------------------------------ HF checkpoint names

def to_hf(named: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The module's parameters under HF checkpoint names (fused experts split per expert)."""
    for name, tensor in named:
        fused = _FUSED.match(name)
        if not fused:
            yield name, tensor
            continue
        prefix, kind = fused.groups()
        for expert in range(tensor.shape[0]):
            if kind == "down_proj":
                yield f"{prefix}.{expert}.down_proj.weight", tensor[expert]
            else:
                gate, up = tensor[expert].chunk(2, dim=0)
                yield f"{prefix}.{expert}.gate_proj.weight", gate
                yield f"{prefix}.{expert}.up_proj.weight", up


def hf_target(params: dict[str, torch.Tensor], hf_name: str) -> tuple[str, torch.Tensor]:
    """(module parameter name, the view of it that the HF-named tensor fills)."""
    if hf_name in params:
        return hf_name, params[hf_name]
    match = _EXPERT.match(hf_name)
    if not match:
        raise KeyError(f"{hf_name}: not a parameter of this model")
    prefix, expert, kind = match.group(1), int(match.group(2)), match.group(3)
    if kind == "down":
        return f"{prefix}.down_proj", params[f"{prefix}.down_proj"][expert]
    fused = params[f"{prefix}.gate_up_proj"][expert]
    half = fused.shape[0] // 2
    return f"{prefix}.gate_up_proj", (fused[:half] if kind == "gate" else fused[half:])


def hf_names(module) -> list[str]:
    return [name for name, _ in to_hf((n, p.detach()) for n, p in module.named_parameters())]


# ----------------------------------------------------------------------- routed experts (R3)

class Routers:
    """The MoE routers of a model, with two modes used by the R3 data path:

    capture   every forward records each router's top-k expert ids per token;
    replay    the routers take given expert ids instead of their own top-k, with the
              weights still computed from their own scores (so gradients reach the router),
              as slime's routing replay does in Megatron.

    The replacement forward is the router's own computation (softmax, top-k, optional
    renormalisation), so with neither mode set the model computes exactly what it did."""

    def __init__(self, module: torch.nn.Module):
        self.layers: list[int] = []
        self.routers: list[torch.nn.Module] = []
        for name, sub in module.named_modules():
            if type(sub).__name__.endswith("TopKRouter") and hasattr(sub, "top_k"):
                self.layers.append(int(_LAYER.search(f".{name}.").group(1)))
                self.routers.append(sub)
        self.top_k = self.routers[0].top_k if self.routers else 0
        self.num_experts = self.routers[0].num_experts if self.routers else 0
        self.captured: list[list[torch.Tensor]] | None = None
        self.replay: list[torch.Tensor] | None = None
        for ordinal, router in enumerate(self.routers):
            router.forward = self._forward_for(router, ordinal)

    def __len__(self) -> int:
        return len(self.routers)

    def _forward_for(self, router, ordinal: int):
        def routed(hidden_states):
            hidden = hidden_states.reshape(-1, router.hidden_dim)
            logits = F.linear(hidden, router.weight)
            probs = torch.softmax(logits, dtype=torch.float, dim=-1)
            if self.replay is not None:
                indices = self.replay[ordinal].to(probs.device)
                if indices.shape != (hidden.shape[0], router.top_k):
                    raise ValueError(f"routing replay: layer {self.layers[ordinal]} expects "
                                     f"{(hidden.shape[0], router.top_k)} expert ids, got "
                                     f"{tuple(indices.shape)}")
                top = probs.gather(-1, indices)
            else:
                top, indices = torch.topk(probs, router.top_k, dim=-1)
            if router.norm_topk_prob:
                top = top / top.sum(dim=-1, keepdim=True)
            if self.captured is not None:
                self.captured[ordinal].append(indices.detach().to("cpu", torch.int32))
            return logits, top.to(logits.dtype), indices

        return routed

    @contextlib.contextmanager
    def capturing(self):
        self.captured = [[] for _ in self.routers]
        try:
            yield self.captured
        finally:
            self.captured = None

    @contextlib.contextmanager
    def replaying(self, per_layer: list[torch.Tensor] | None):
        self.replay = per_layer
        try:
            yield
        finally:
            self.replay = None

    def replay_for_batch(self, routed: list[np.ndarray], seq_len: int) -> list[torch.Tensor]:
        """Per MoE layer, [batch × seq_len, top_k] expert ids for a right-padded batch: each
        sample's rows (one per token but its last), then filler rows for the last token and
        the padding (distinct experts 0..k-1, as slime pads; their outputs are masked out)."""
        filler = torch.arange(self.top_k, dtype=torch.long)
        per_layer = [[] for _ in self.routers]
        for sample in routed:
            rows = torch.as_tensor(np.asarray(sample), dtype=torch.long)
            if rows.ndim != 3 or rows.shape[1:] != (len(self.routers), self.top_k):
                raise ValueError(f"routed experts of shape {tuple(rows.shape)}; expected "
                                 f"[tokens - 1, {len(self.routers)}, {self.top_k}]")
            pad = filler.expand(seq_len - rows.shape[0], self.top_k)
            for ordinal in range(len(self.routers)):
                per_layer[ordinal].append(torch.cat([rows[:, ordinal], pad]))
        return [torch.cat(chunks) for chunks in per_layer]
