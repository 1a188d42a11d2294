"""Backend implementations, by the name written in train.backend / inference.backend.

Each entry is "module:Class"; the module is imported inside the Ray actor that hosts it, so
the driver never imports Megatron or vLLM."""

from __future__ import annotations

import importlib

TRAINING = {
    "torch": "runtime.backends.torch_train:TorchTrainingBackend",
    "megatron": "runtime.backends.megatron_train:MegatronTrainingBackend",
}
ROLLOUT = {
    "torch": "runtime.backends.torch_rollout:TorchRolloutBackend",
    "vllm": "runtime.backends.vllm_rollout:VllmRolloutBackend",
}


def reference(kind: str, name: str) -> str:
    table = TRAINING if kind == "training" else ROLLOUT
    key = "train.backend" if kind == "training" else "inference.backend"
    if name not in table:
        raise ValueError(f"{key} = {name!r}: no such {kind} backend ({', '.join(sorted(table))})")
    return table[name]


def load(kind: str, name: str):
    module, _, cls = reference(kind, name).partition(":")
    return getattr(importlib.import_module(module), cls)
