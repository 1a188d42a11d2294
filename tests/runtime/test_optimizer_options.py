"""The Megatron backend's optimizer options from train.optimizer, judged by megatron-core's own
OptimizerConfig on the CPU: precision_aware reaches it as the spec writes it (V214 warns of
what megatron-core then does without Transformer Engine), CPU Adam needs no TE."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("megatron.core")

import torch  # noqa: E402
from megatron.core.optimizer import OptimizerConfig  # noqa: E402
from specsupport import ROOT, run_spec  # noqa: E402

from runtime.backends.megatron_train import _optimizer_options  # noqa: E402

SPEC = ROOT / "specs" / "qwen3_30b_2node.toml"  # the distributed optimizer on the GPU


def _config(*sets) -> OptimizerConfig:
    result = run_spec(SPEC, sets)
    opt = result.spec.train.optimizer
    return OptimizerConfig(optimizer="adam", lr=opt.lr, bf16=True, params_dtype=torch.bfloat16,
                           use_distributed_optimizer=True, **_optimizer_options(opt))


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None,
                    reason="Transformer Engine is installed: megatron-core takes its FusedAdam")
def test_precision_aware_without_cpu_adam_is_passed_on_and_needs_te():
    with pytest.raises(RuntimeError, match="requires FusedAdam from TransformerEngine"):
        _config("train.optimizer.precision_aware=true")


def test_the_default_optimizer_is_megatron_cores_plain_adam():
    config = _config()
    assert not config.use_precision_aware_optimizer and not config.optimizer_cpu_offload


def test_cpu_adam_is_precision_aware_and_needs_no_te():
    config = _config("train.optimizer.cpu_offload=true", "train.optimizer.precision_aware=true")
    assert config.optimizer_cpu_offload and config.use_precision_aware_optimizer
    assert config.optimizer_offload_fraction == 1.0
