"""Oracle: the Megatron backend's packed micro-batches (every sample of a micro-batch in one row
of their summed length, megatron-core's THD PackedSeqParams) against its padded ones ([n,
longest]), through the backend's own log_probs and train_step on a real GPTModel built by
runtime/megatron/model.py, fp32 on the CPU in a spawned gloo world of one.

Checked, for samples of different lengths in micro-batches of two and three:
- the response log-probs of every sample are the padded path's (1e-5): attention stays inside
  each sample (one causal attention over the whole row, the packing ignored, is 0.2-0.4 off).
  Rotary positions restarting at 0 in each sample (megatron-core's per-segment RoPE) are not
  what this checks: RoPE's scores depend on the distance between positions only, so positions
  continued across a row give the same log-probs up to rounding;
- with routing replay (R3) the routes laid in the packed order (routing.packed_routes) give
  the padded path's log-probs, the replay is in force (free routing differs), and the rows
  vLLM routed are counted alike;
- one train_step gives the same loss statistics and gradients;
- changing one sample's tokens leaves the log-probs of the others in its packed row as they
  were (no attention across segments);
- a DeepSeek-V3 layer (MLA, whose THD value is padded to the query's width by megatron-core)
  packs to the padded path's log-probs too.

The backend is built around the model by hand (no DDP, optimizer or CUDA): the test's
subclass keeps the gradients in the parameters (its _begin_step zeroes them, _finish_step
returns them) instead of megatron-core's buffers and optimizer step.
"""

from __future__ import annotations

import types

import pytest

pytest.importorskip("megatron.core")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from megatroncpu import TINY_MOE, gloo_ranks  # noqa: E402

LENGTHS = [7, 12, 9, 5, 10]
PROMPT_LENS = [3, 5, 2, 4, 6]
TOLERANCE = 1e-5


class _ModelCall(torch.nn.Module):
    """The backend's Float16Module stand-in in fp32: takes and drops fp32_output."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, *args, fp32_output=True, **kwargs):
        return self.gpt(*args, **kwargs)


def _backend(gpt, arch, config, packed: bool, routing_replay: bool):
    from runtime.backends.megatron_train import MegatronTrainingBackend
    from runtime.core.slices import LossConfig

    class OnTheCpu(MegatronTrainingBackend):
        def _begin_step(self):
            self.model.train()
            self.model.zero_grad(set_to_none=True)

        def _finish_step(self):
            return {"grads": {n: p.grad.clone() for n, p in self.params.items()
                              if p.grad is not None}}

    slice = types.SimpleNamespace(
        routing_replay=routing_replay, dynamic_batch=False, micro_batch_size=3,
        max_tokens_per_gpu=0, loss=LossConfig(), world_size=1, rank=0)
    return OnTheCpu.over(_ModelCall(gpt), gpt, arch, config, slice, packed=packed,
                         temperature=0.8)


def _batch(arch, seed: int = 0):
    from runtime.core.interfaces import TrainBatch

    rng = np.random.default_rng(seed)
    tokens = [rng.integers(0, arch.vocab_size, n).tolist() for n in LENGTHS]
    routed = None
    if arch.is_moe:  # vLLM's routes, [length - 1, layers, top_k], distinct experts per token
        routed = [np.stack([[rng.choice(arch.num_experts, arch.topk, replace=False)
                             for _ in range(arch.num_moe_layers)] for _ in range(n - 1)]
                           ).astype(np.uint8) for n in LENGTHS]
    return TrainBatch(tokens=tokens, prompt_lens=list(PROMPT_LENS), routed_experts=routed)


def _model(config_json: dict, **config_args):
    from megatron.core.transformer.moe.router_replay import RouterReplay

    from runtime.megatron.model import build_gpt, transformer_config
    from vime.resolve.model import arch_from_config

    arch = arch_from_config(config_json)
    config = transformer_config(arch, bf16=False, params_dtype=torch.float32,
                                pipeline_dtype=torch.float32, use_cpu_initialization=True,
                                calculate_per_token_loss=True, **config_args)
    RouterReplay.clear_global_router_replay_instances()
    torch.manual_seed(0)
    gpt = build_gpt(arch, config, 256, experts="sequential")
    with torch.no_grad():  # experts that weigh in the log-probs, so that a wrong route shows
        for name, param in gpt.named_parameters():
            if ".experts." in name:
                param.mul_(8)
    return arch, config, gpt


def _gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(float(np.abs(np.array(x) - np.array(y)).max()) for x, y in zip(a, b, strict=True))


def _moe_world(_rank: int) -> dict:
    from megatron.core import parallel_state
    from megatroncpu import cpu_streams

    from runtime.core.interfaces import TrainBatch

    cpu_streams()
    parallel_state.initialize_model_parallel(1, 1)
    arch, config, gpt = _model(TINY_MOE, moe_enable_routing_replay=True)
    batch = _batch(arch)
    out: dict = {}
    padded, packed = (_backend(gpt, arch, config, p, routing_replay=False) for p in (False, True))
    out["padded"], out["packed"] = padded.log_probs(batch), packed.log_probs(batch)

    replay_padded, replay_packed = (_backend(gpt, arch, config, p, routing_replay=True)
                                    for p in (False, True))
    out["replay_padded"] = replay_padded.log_probs(batch)
    out["replay_packed"] = replay_packed.log_probs(batch)
    out["counts"] = [replay_padded._route_counts.tolist(), replay_packed._route_counts.tolist()]

    # one sample changed: the others of its packed row (micro-batch [0, 1, 2]) keep theirs
    changed = [list(t) for t in batch.tokens]
    changed[0] = [(t + 1) % arch.vocab_size for t in changed[0]]
    out["changed"] = packed.log_probs(TrainBatch(tokens=changed, prompt_lens=batch.prompt_lens))

    steps = {}
    old = out["padded"]
    training = TrainBatch(tokens=batch.tokens, prompt_lens=batch.prompt_lens,
                          advantages=[1.0, -0.5, 0.25, -1.0, 0.5],
                          old_log_probs=[[v + 0.01 for v in row] for row in old],
                          routed_experts=batch.routed_experts,
                          step_response_tokens=sum(len(r) for r in old),
                          step_samples=len(old))
    for name, backend in (("padded", replay_padded), ("packed", replay_packed)):
        stats = backend.train_step(training)
        steps[name] = {"grads": {k: v.numpy() for k, v in stats.pop("grads").items()},
                       "stats": stats}
    out["steps"] = steps
    return out


def _mla_world(_rank: int) -> dict:
    from megatron.core import parallel_state
    from megatroncpu import cpu_streams
    from moe_families import FAMILIES

    cpu_streams()
    parallel_state.initialize_model_parallel(1, 1)
    arch, config, gpt = _model(FAMILIES["deepseek_v3"])
    batch = _batch(arch)
    return {p: _backend(gpt, arch, config, p == "packed", False).log_probs(batch)
            for p in ("padded", "packed")}


@pytest.fixture(scope="module")
def moe():
    return gloo_ranks(_moe_world, 1)[0]


def test_packed_log_probs_are_the_padded_ones(moe):
    assert [len(r) for r in moe["packed"]] == [n - p for n, p in zip(LENGTHS, PROMPT_LENS,
                                                                      strict=True)]
    assert _gap(moe["packed"], moe["padded"]) < TOLERANCE


def test_packed_routes_replay_as_the_padded_ones(moe):
    assert _gap(moe["replay_packed"], moe["replay_padded"]) < TOLERANCE
    assert _gap(moe["replay_packed"], moe["packed"]) > 100 * TOLERANCE  # the replay is used
    padded, packed = moe["counts"]
    assert packed == padded and packed[1] > 0


def test_a_changed_sample_leaves_the_others_of_its_row_alone(moe):
    assert _gap(moe["changed"][1:], moe["packed"][1:]) < 1e-6
    assert _gap(moe["changed"][:1], moe["packed"][:1]) > 100 * TOLERANCE


def test_a_packed_train_step_is_the_padded_one(moe):
    padded, packed = moe["steps"]["padded"], moe["steps"]["packed"]
    assert padded["stats"].keys() == packed["stats"].keys()
    for key, value in padded["stats"].items():
        assert packed["stats"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert padded["grads"].keys() == packed["grads"].keys() and padded["grads"]
    for name, grad in padded["grads"].items():
        np.testing.assert_allclose(packed["grads"][name], grad, rtol=1e-4, atol=1e-6,
                                   err_msg=name)


def test_packed_mla_log_probs_are_the_padded_ones():
    out = gloo_ranks(_mla_world, 1)[0]
    assert _gap(out["packed"], out["padded"]) < TOLERANCE
