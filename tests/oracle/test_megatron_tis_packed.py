"""Oracle: sequence-level TIS (algorithm.tis_level = "sequence") in the Megatron backend's packed
micro-batches: two samples of different lengths in one packed row, each weighted by the product
of its own token ratios, not by one weight for the row. Through the backend's own train_step on
a real GPTModel (runtime/megatron/model.py), fp32 on the CPU in a spawned gloo world of one; the
backend is built around the model by hand as in tests/oracle/test_megatron_packing.py.

Checked: the step's TIS sums are the per-sample formula's; the packed step's gradients are the
padded step's; and they equal an untruncated step whose advantages carry each sample's weight."""

from __future__ import annotations

import math
import types

import pytest

pytest.importorskip("megatron.core")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from megatroncpu import TINY_MOE, gloo_ranks  # noqa: E402

TOKENS = [[3, 9, 27, 81, 15, 45, 7, 21, 63], [5, 25, 11, 55, 33]]
PROMPT_LENS = [3, 2]  # responses of 6 and 3 tokens
# log pi_old - log pi_rollout per response token: sums 0.9 and -0.9
LOG_RATIOS = [[0.3, -0.1, 0.5, 0.2, 0.1, -0.1], [-0.4, -0.3, -0.2]]
ADVANTAGES = [1.0, -2.0]


class _ModelCall(torch.nn.Module):
    """The backend's Float16Module stand-in in fp32: takes and drops fp32_output."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, *args, fp32_output=True, **kwargs):
        return self.gpt(*args, **kwargs)


def _backend(gpt, arch, config, packed: bool, loss):
    from runtime.backends.megatron_train import MegatronTrainingBackend

    class OnTheCpu(MegatronTrainingBackend):
        def _begin_step(self):
            self.model.train()
            self.model.zero_grad(set_to_none=True)

        def _finish_step(self):
            return {"grads": {n: p.grad.clone() for n, p in self.params.items()
                              if p.grad is not None}}

    slice = types.SimpleNamespace(routing_replay=False, dynamic_batch=False, micro_batch_size=2,
                                  max_tokens_per_gpu=0, loss=loss, world_size=1, rank=0)
    return OnTheCpu.over(_ModelCall(gpt), gpt, arch, config, slice, packed=packed,
                         temperature=1.0)


def _world(_rank: int) -> dict:
    from megatron.core import parallel_state
    from megatroncpu import cpu_streams

    from runtime.core.interfaces import TrainBatch
    from runtime.core.slices import LossConfig
    from runtime.megatron.model import build_gpt, transformer_config
    from vime.resolve.model import arch_from_config

    cpu_streams()
    parallel_state.initialize_model_parallel(1, 1)
    arch = arch_from_config(TINY_MOE)
    config = transformer_config(arch, bf16=False, params_dtype=torch.float32,
                                pipeline_dtype=torch.float32, use_cpu_initialization=True,
                                calculate_per_token_loss=True)
    torch.manual_seed(0)
    gpt = build_gpt(arch, config, 256, experts="sequential")
    sequence = LossConfig(tis=True, tis_clip=2.0, tis_clip_low=0.5, tis_level="sequence")
    packed = _backend(gpt, arch, config, True, sequence)
    old = packed.log_probs(TrainBatch(tokens=TOKENS, prompt_lens=PROMPT_LENS))
    rollout = [[v - d for v, d in zip(row, ratios, strict=True)]
               for row, ratios in zip(old, LOG_RATIOS, strict=True)]
    batch = TrainBatch(tokens=TOKENS, prompt_lens=PROMPT_LENS, advantages=ADVANTAGES,
                       old_log_probs=old, rollout_log_probs=rollout,
                       step_response_tokens=9, step_samples=2)
    out = {"packed": packed.train_step(batch),
           "padded": _backend(gpt, arch, config, False, sequence).train_step(batch)}
    # no TIS, each sample's weight in its advantage: 2 × 1 and 0.5 × -2
    weights = [min(max(math.exp(sum(r)), 0.5), 2.0) for r in LOG_RATIOS]
    scaled = TrainBatch(tokens=TOKENS, prompt_lens=PROMPT_LENS,
                        advantages=[w * a for w, a in zip(weights, ADVANTAGES, strict=True)],
                        old_log_probs=old, step_response_tokens=9, step_samples=2)
    out["scaled"] = _backend(gpt, arch, config, True, LossConfig()).train_step(scaled)
    return {name: {**{k: v for k, v in stats.items() if k != "grads"},
                   "grads": {k: g.numpy() for k, g in stats["grads"].items()}}
            for name, stats in out.items()}


@pytest.fixture(scope="module")
def steps():
    return gloo_ranks(_world, 1)[0]


def test_each_packed_sample_gets_its_own_sequence_weight(steps):
    packed = steps["packed"]
    # exp(0.9) = 2.46 truncated to 2 on 6 tokens, exp(-0.9) = 0.41 truncated to 0.5 on 3
    assert packed["tis_weight"] == pytest.approx(6 * 2.0 + 3 * 0.5, rel=1e-5)
    assert packed["tis_truncated_tokens"] == 9
    assert (packed["tis_samples"], packed["tis_truncated_samples"]) == (2, 2)
    assert packed["response_tokens"] == 9


def test_the_packed_step_is_the_padded_one_and_the_weighted_advantages_one(steps):
    packed = steps["packed"]["grads"]
    assert packed
    for other in ("padded", "scaled"):
        grads = steps[other]["grads"]
        assert grads.keys() == packed.keys()
        for name, grad in packed.items():
            np.testing.assert_allclose(grad, grads[name], rtol=1e-4, atol=1e-6,
                                       err_msg=f"{other}: {name}")
