"""Oracle: the Megatron backend's loss head on a real GPTModel under tensor parallelism (tp = 2,
sequence parallel), in two CPU processes over gloo.

The backend asks the model for its final hidden states and output weight (megatron-core's
output_processor hook, runtime/backends/megatron_train.py's _head_inputs: the sequence gathered
over the tensor group, backward reduce-scatter) and computes the log-probs and entropy a chunk
at a time from them (runtime/core/loss_head.py, reductions over the tensor group). The oracle
is the computation the backend did before: the model's vocabulary-parallel logits gathered over
the group (megatron-core's gather), then a log-softmax (or the nucleus) over the whole
vocabulary. On every rank the log-probs, the entropies and the gradient of every parameter shard
must be the oracle's: fp32 weights (tied and untied output layer), and bf16 weights through
megatron-core's Float16Module (the backend's wrapper; within bf16 tolerance).
"""

from __future__ import annotations

import contextlib
import types
from unittest import mock

import pytest

pytest.importorskip("megatron.core")

import torch  # noqa: E402
from megatroncpu import gloo_ranks  # noqa: E402

from runtime.backends.torch_train import response_positions  # noqa: E402
from runtime.core import loss_head, nucleus  # noqa: E402
from runtime.core.interfaces import TrainBatch  # noqa: E402
from vime.resolve.model import arch_from_config  # noqa: E402

TP, TEMPERATURE, ROWS = 2, 0.7, 3
DENSE = {
    "model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64,
    "intermediate_size": 48, "max_position_embeddings": 64,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
}
TOKENS = [[(7 * i + 3) % 64 for i in range(11)], [(5 * i + 1) % 64 for i in range(8)]]
PROMPT_LENS = [4, 3]
CASES = [(1.0, 0.0), (1.0, 0.2), (0.8, 0.2)]  # (top_p, entropy_coef)


def _model(tied: bool, bf16: bool):
    from runtime.megatron.model import build_gpt, transformer_config

    arch = arch_from_config({**DENSE, "tie_word_embeddings": tied})
    dtype = torch.bfloat16 if bf16 else torch.float32
    config = transformer_config(arch, tensor_model_parallel_size=TP, sequence_parallel=True,
                                calculate_per_token_loss=True, use_cpu_initialization=True,
                                bf16=bf16, params_dtype=dtype, pipeline_dtype=dtype)
    torch.manual_seed(5)
    gpt = build_gpt(arch, config, DENSE["max_position_embeddings"])
    if bf16:
        from megatron.core.transformer.module import Float16Module

        return gpt, Float16Module(config, gpt)

    def model(*args, fp32_output=True, **kwargs):  # Float16Module's call, without the casts
        return gpt(*args, **kwargs)

    return gpt, model


def _rows(width: int, cut: bool = False) -> int:  # loss_head.chunk_rows, for small chunks
    return ROWS

def _backend(model, top_p: float, entropy_coef: float):
    from megatron.core import parallel_state

    from runtime.backends.megatron_train import MegatronTrainingBackend

    backend = MegatronTrainingBackend.__new__(MegatronTrainingBackend)
    backend.slice = types.SimpleNamespace(loss=types.SimpleNamespace(entropy_coef=entropy_coef),
                                          routing_replay=False)
    backend.device, backend.arch = torch.device("cpu"), types.SimpleNamespace(is_moe=False)
    backend.model, backend.temperature, backend.top_p = model, TEMPERATURE, top_p
    backend.tp, backend.cp, backend.cp_rank = TP, 1, 0
    backend.tp_group = parallel_state.get_tensor_model_parallel_group()
    backend.tp_rank = parallel_state.get_tensor_model_parallel_rank()
    return backend


def _loss(log_probs, entropy, entropy_coef, mask):
    weights = torch.linspace(-1.0, 2.0, log_probs.numel()).view_as(log_probs)
    return ((log_probs * weights - entropy_coef * entropy) * mask).sum()


def _oracle(gpt, model, backend, batch, entropy_coef):
    """The whole-logits computation: the logits, then the log-softmax."""
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

    ids = backend._inputs(batch, [0, 1])
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    logits = gather_from_tensor_model_parallel_region(model(ids, positions, None).float(),
                                                      backend.tp_group)
    rows, picked_at, mask = response_positions(PROMPT_LENS, [len(t) for t in TOKENS],
                                               ids.shape[1])
    picked = logits[rows, picked_at] / TEMPERATURE
    targets = ids[rows, (picked_at + 1).clamp(max=ids.shape[1] - 1)]
    log_p = torch.log_softmax(picked, -1)
    log_probs = (nucleus.log_probs(picked, targets, backend.top_p) if backend.top_p < 1
                 else log_p.gather(-1, targets[..., None]).squeeze(-1))
    entropy = -(log_p.exp() * log_p).sum(-1)
    _loss(log_probs, entropy, entropy_coef, mask).backward()
    return log_probs.detach(), entropy.detach(), mask


def _rank(rank: int) -> dict:
    torch.cuda.current_device = lambda: "cpu"  # megatron-core allocates there
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP)
    # the embedding forks the CUDA generator under sequence parallel (for dropout, 0 here)
    get_cuda_rng_tracker().fork = lambda *args, **kwargs: contextlib.nullcontext()
    batch = TrainBatch(tokens=TOKENS, prompt_lens=PROMPT_LENS)
    out = {}
    for tied, bf16 in ((True, False), (False, False), (False, True)):
        gpt, model = _model(tied, bf16)
        for top_p, entropy_coef in CASES:
            backend = _backend(model, top_p, entropy_coef)
            got = {}
            for side in ("oracle", "backend"):
                gpt.zero_grad(set_to_none=True)
                if side == "oracle":
                    values = _oracle(gpt, model, backend, batch, entropy_coef)
                else:
                    with mock.patch.object(loss_head, "chunk_rows", _rows):
                        log_probs, entropy, mask = backend._response_terms(batch, [0, 1])
                    _loss(log_probs, entropy, entropy_coef, mask).backward()
                    values = log_probs.detach(), entropy.detach(), mask
                grads = {n: p.grad.float().clone() for n, p in gpt.named_parameters()
                         if p.grad is not None}
                got[side] = (*values, grads)
            out[tied, bf16, top_p, entropy_coef] = got
    return out


def test_the_chunked_loss_head_on_a_tensor_parallel_gpt_gives_the_whole_logits_numbers():
    results = gloo_ranks(_rank, TP)
    for rank in range(TP):
        for (tied, bf16, top_p, coef), got in results[rank].items():
            case = (rank, "tied" if tied else "untied", "bf16" if bf16 else "fp32", top_p, coef)
            (want_lp, want_h, mask, want_grads), (lp, h, got_mask, grads) = (got["oracle"],
                                                                            got["backend"])
            atol, rtol = (2e-2, 2e-2) if bf16 else (1e-5, 1e-4)
            assert torch.equal(mask, got_mask), case
            assert torch.allclose(lp[mask], want_lp[mask], atol=atol, rtol=rtol), case
            assert torch.allclose(h[mask], want_h[mask], atol=atol, rtol=rtol), case
            assert grads.keys() == want_grads.keys() and len(grads) > 5, case
            for name, want in want_grads.items():
                scale = float(want.abs().max()) or 1.0
                error = float((grads[name] - want).abs().max()) / scale
                assert error < (3e-2 if bf16 else 1e-4), (case, name, error)
            if not tied:
                assert "output_layer.weight" in grads, case
