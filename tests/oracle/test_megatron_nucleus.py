"""Oracle: the Megatron backend's log-probs and entropy under tensor parallelism (tp = 2, and
tp = 2 with context parallel cp = 2), with and without top-p and an entropy bonus, in CPU
processes over gloo with megatron-core's own groups and gathers, against the log-softmax (or
the nucleus log-probs) of the whole logits in one process.

The decoder is left out: each rank's model returns its part of one fixed set of final hidden
states (its positions under cp) and its rows of one fixed output weight (its vocabulary under
tp), so the backend's own batching, its picking of the responses, the chunked loss head
(runtime/core/loss_head.py: reductions over the tensor group, or each chunk's logits gathered
for the nucleus) and the cp gather are what is tested. Every rank's log-probs and entropies
must be the whole ones; the gradients the ranks leave on the hidden states and the weight
must add up to the whole ones (in the real model the sequence-parallel gather sums the hidden
states' parts: tests/oracle/test_megatron_loss_head.py). megatron-core's gather allocates on
the GPU (torch.cuda.current_device()); the ranks point it at the CPU.
"""

from __future__ import annotations

import os
import types
import warnings
from unittest import mock

import pytest

pytest.importorskip("megatron.core")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from megatroncpu import free_port  # noqa: E402

from runtime.backends.torch_train import response_positions  # noqa: E402
from runtime.core import loss_head, nucleus  # noqa: E402
from runtime.core.interfaces import TrainBatch  # noqa: E402

VOCAB, WIDTH, HIDDEN, TEMPERATURE = 48, 16, 8, 0.8
ROWS = 5  # tokens per loss-head chunk: several chunks, the last one short
TOKENS = [[(7 * i + 3) % VOCAB for i in range(16)], [(5 * i + 1) % VOCAB for i in range(13)]]
PROMPT_LENS = [5, 7]


def _whole() -> tuple[torch.Tensor, torch.Tensor]:
    """Final hidden states [n, WIDTH, HIDDEN] and the output weight [VOCAB, HIDDEN], as leaves."""
    generator = torch.Generator().manual_seed(11)
    hidden = torch.randn(len(TOKENS), WIDTH, HIDDEN, generator=generator)
    weight = torch.randn(VOCAB, HIDDEN, generator=generator)
    return hidden.requires_grad_(), weight.requires_grad_()


def _rows(width: int, cut: bool = False) -> int:  # loss_head.chunk_rows, for small chunks
    return ROWS

def _backend(tp: int, cp: int, top_p: float, entropy_coef: float, hidden, weight):
    from megatron.core import parallel_state

    from runtime.backends.megatron_train import MegatronTrainingBackend

    backend = MegatronTrainingBackend.__new__(MegatronTrainingBackend)
    backend.slice = types.SimpleNamespace(loss=types.SimpleNamespace(entropy_coef=entropy_coef),
                                          routing_replay=False)
    backend.device, backend.arch = torch.device("cpu"), types.SimpleNamespace(is_moe=False)
    backend.temperature, backend.top_p = TEMPERATURE, top_p
    backend.tp, backend.cp = tp, cp
    backend.tp_group = parallel_state.get_tensor_model_parallel_group()
    backend.tp_rank = parallel_state.get_tensor_model_parallel_rank()
    backend.cp_group = parallel_state.get_context_parallel_group()
    backend.cp_rank = parallel_state.get_context_parallel_rank()
    part = VOCAB // tp
    rows = slice(backend.tp_rank * part, (backend.tp_rank + 1) * part)

    def head(ids):  # this rank's positions and vocabulary rows
        assert ids.shape[1] == WIDTH
        return backend._local(hidden), weight[rows]

    backend._head = head
    return backend


def _rank(rank: int, world: int, port: int, tp: int, cp: int, results) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.current_device = lambda: "cpu"  # megatron-core's gather allocates there
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from megatron.core import parallel_state

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp,
                                                 context_parallel_size=cp)
        batch = TrainBatch(tokens=TOKENS, prompt_lens=PROMPT_LENS)
        out = {}
        for top_p, entropy_coef in CASES:
            hidden, weight = _whole()
            backend = _backend(tp, cp, top_p, entropy_coef, hidden, weight)
            with mock.patch.object(loss_head, "chunk_rows", _rows):
                log_probs, entropy, mask = backend._response_terms(batch, [0, 1])
            assert entropy.requires_grad == bool(entropy_coef)
            (_loss(log_probs, entropy, entropy_coef) * mask).sum().backward()
            out[top_p, entropy_coef] = {"log_probs": log_probs.detach(),
                                        "entropy": entropy.detach(), "mask": mask,
                                        "grad_hidden": hidden.grad, "grad_weight": weight.grad}
        results[rank] = out
    except Exception as error:  # noqa: BLE001  (reported to the test, which fails on it)
        import traceback

        results[rank] = {"error": traceback.format_exc() + repr(error)}
    finally:
        dist.destroy_process_group()


CASES = [(0.7, 0.0), (1.0, 0.0), (0.7, 0.3), (1.0, 0.3)]  # (top_p, entropy_coef)


def _loss(log_probs, entropy, entropy_coef):
    """Per-token weights of the log-probs, minus the entropy bonus when it is in the loss."""
    weights = torch.linspace(-1.0, 2.0, log_probs.numel()).view_as(log_probs)
    return log_probs * weights - (entropy_coef * entropy if entropy_coef else 0.0)


def _expected(top_p: float, entropy_coef: float):
    """The unchunked computation on the whole logits (the definition the chunks must match)."""
    hidden, weight = _whole()
    ids = torch.tensor([t + [0] * (WIDTH - len(t)) for t in TOKENS])
    rows, positions, mask = response_positions(PROMPT_LENS, [len(t) for t in TOKENS], WIDTH)
    picked = (hidden @ weight.t())[rows, positions] / TEMPERATURE
    targets = ids[rows, (positions + 1).clamp(max=WIDTH - 1)]
    log_probs = (nucleus.log_probs(picked, targets, top_p) if top_p < 1 else
                 torch.log_softmax(picked, -1).gather(-1, targets[..., None]).squeeze(-1))
    log_p = torch.log_softmax(picked, -1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    (_loss(log_probs, entropy, entropy_coef) * mask).sum().backward()
    return log_probs.detach(), entropy.detach(), mask, hidden.grad, weight.grad


@pytest.mark.parametrize("tp, cp", [
    (2, 1), pytest.param(2, 2, marks=pytest.mark.slow)], ids=["tp2", "tp2-cp2"])
def test_log_probs_and_entropy_under_tensor_parallel_are_the_whole_vocabularys(tp, cp):
    port = free_port()
    world = tp * cp
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(world, port, tp, cp, results), nprocs=world, join=True)
    got = [results[rank] for rank in range(world)]
    for rank_result in got:
        assert "error" not in rank_result, rank_result["error"]
    for case in CASES:
        log_probs, entropy, mask, grad_hidden, grad_weight = _expected(*case)
        for rank, rank_result in enumerate(got):
            mine = rank_result[case]
            assert torch.equal(mine["mask"], mask)
            assert torch.allclose(mine["log_probs"][mask], log_probs[mask], atol=1e-5), (rank, case)
            assert torch.allclose(mine["entropy"][mask], entropy[mask], atol=1e-5), (rank, case)
        for name, whole in (("grad_hidden", grad_hidden), ("grad_weight", grad_weight)):
            summed = sum(rank_result[case][name] for rank_result in got)
            assert torch.allclose(summed, whole, atol=1e-5), (case, name,
                                                              (summed - whole).abs().max())
    # the nucleus and the entropy bonus change the numbers: the test tells the cases apart
    assert not torch.allclose(_expected(0.7, 0)[0][mask], _expected(1.0, 0)[0][mask], atol=1e-2)
    assert not torch.allclose(_expected(1.0, 0)[4], _expected(1.0, 0.3)[4], atol=1e-2)
