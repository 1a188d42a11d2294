"""Oracle: the Megatron backend's top-p log-probs under tensor parallelism (tp = 2, and tp = 2
with context parallel cp = 2), in CPU processes over gloo with megatron-core's own groups and
gathers, against the nucleus log-probs of the whole logits in one process (issue 14).

The model is left out: each rank's forward returns its part (its positions under cp, its
vocabulary columns under tp) of one fixed logits tensor, so the backend's own batching, its
picking of the responses, the vocabulary gather and the cp gather are what is tested. Every
rank's log-probs and entropies must be the whole ones; the gradients the ranks leave on their
parts must add up to the whole logits' gradient. megatron-core's gather allocates on the GPU
(torch.cuda.current_device()); the ranks point it at the CPU.
"""

from __future__ import annotations

import os
import socket
import types
import warnings

import pytest

pytest.importorskip("megatron.core")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from runtime.backends.torch_train import response_positions  # noqa: E402
from runtime.core import nucleus  # noqa: E402
from runtime.core.interfaces import TrainBatch  # noqa: E402

VOCAB, WIDTH, TEMPERATURE = 48, 16, 0.8
TOKENS = [[(7 * i + 3) % VOCAB for i in range(16)], [(5 * i + 1) % VOCAB for i in range(13)]]
PROMPT_LENS = [5, 7]


def _whole_logits() -> torch.Tensor:
    return torch.randn(len(TOKENS), WIDTH, VOCAB, generator=torch.Generator().manual_seed(11)) * 3


def _backend(tp: int, cp: int, top_p: float, logits: torch.Tensor):
    from megatron.core import parallel_state

    from runtime.backends.megatron_train import MegatronTrainingBackend

    backend = MegatronTrainingBackend.__new__(MegatronTrainingBackend)
    backend.slice = types.SimpleNamespace(loss=types.SimpleNamespace(entropy_coef=0.0),
                                          routing_replay=False)
    backend.device, backend.arch = torch.device("cpu"), types.SimpleNamespace(is_moe=False)
    backend.temperature, backend.top_p = TEMPERATURE, top_p
    backend.tp, backend.cp = tp, cp
    backend.tp_group = parallel_state.get_tensor_model_parallel_group()
    backend.tp_rank = parallel_state.get_tensor_model_parallel_rank()
    backend.cp_group = parallel_state.get_context_parallel_group()
    backend.cp_rank = parallel_state.get_context_parallel_rank()
    part = VOCAB // tp
    columns = slice(backend.tp_rank * part, (backend.tp_rank + 1) * part)

    def forward(ids, params=None):  # this rank's positions and vocabulary columns
        assert ids.shape[1] == WIDTH
        return backend._local(logits[..., columns])

    backend._logits = forward
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
        for top_p in (0.7, 1.0):
            logits = _whole_logits().requires_grad_()
            backend = _backend(tp, cp, top_p, logits)
            log_probs, entropy, mask = backend._response_terms(batch, [0, 1])
            weights = torch.linspace(-1.0, 2.0, log_probs.numel()).view_as(log_probs)
            (log_probs * weights * mask).sum().backward()
            out[top_p] = {"log_probs": log_probs.detach(), "entropy": entropy.detach(),
                          "mask": mask, "grad": logits.grad}
        results[rank] = out
    except Exception as error:  # noqa: BLE001  (reported to the test, which fails on it)
        import traceback

        results[rank] = {"error": traceback.format_exc() + repr(error)}
    finally:
        dist.destroy_process_group()


def _expected(top_p: float):
    logits = _whole_logits().requires_grad_()
    ids = torch.tensor([t + [0] * (WIDTH - len(t)) for t in TOKENS])
    rows, positions, mask = response_positions(PROMPT_LENS, [len(t) for t in TOKENS], WIDTH)
    picked = logits[rows, positions] / TEMPERATURE
    targets = ids[rows, (positions + 1).clamp(max=WIDTH - 1)]
    log_probs = (nucleus.log_probs(picked, targets, top_p) if top_p < 1 else
                 torch.log_softmax(picked, -1).gather(-1, targets[..., None]).squeeze(-1))
    log_p = torch.log_softmax(picked.detach(), -1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    weights = torch.linspace(-1.0, 2.0, log_probs.numel()).view_as(log_probs)
    (log_probs * weights * mask).sum().backward()
    return log_probs.detach(), entropy, mask, logits.grad


@pytest.mark.parametrize("tp, cp", [(2, 1), (2, 2)], ids=["tp2", "tp2-cp2"])
def test_top_p_log_probs_under_tensor_parallel_are_the_whole_vocabularys(tp, cp):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    world = tp * cp
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(world, port, tp, cp, results), nprocs=world, join=True)
    got = [results[rank] for rank in range(world)]
    for rank_result in got:
        assert "error" not in rank_result, rank_result["error"]
    for top_p in (0.7, 1.0):
        log_probs, entropy, mask, grad = _expected(top_p)
        for rank, rank_result in enumerate(got):
            mine = rank_result[top_p]
            assert torch.equal(mine["mask"], mask)
            assert torch.allclose(mine["log_probs"][mask], log_probs[mask], atol=1e-5), (rank, top_p)
            assert torch.allclose(mine["entropy"][mask], entropy[mask], atol=1e-5), (rank, top_p)
        summed = sum(rank_result[top_p]["grad"] for rank_result in got)
        assert torch.allclose(summed, grad, atol=1e-5), (top_p, (summed - grad).abs().max())
    # the nucleus changes the numbers: the test tells the two apart
    assert not torch.allclose(_expected(0.7)[0][mask], _expected(1.0)[0][mask], atol=1e-2)
