"""Oracle: routing replay (R3) of several samples in one forward, as the Megatron backend
batches them (runtime/megatron/routing.py's batch_routes), against each sample replayed alone,
through megatron-core's own RouterReplay in a real GPTModel built by runtime/megatron/model.py.

A backend that runs one sample per forward whenever routes are replayed spends 0.62 s on
log-probs against 0.06 s without replay on the toy task (one H200, docs/gpu-runs.md); a
replay layout that knows only samples packed one after another forces it. A right-padded [n, width]
batch reaches a router position-major (megatron-core holds it as [s, b, h]); the test checks
that the routes laid out that way give every sample the logits it gets alone, and that the
sample-major order, what the one-sample layout would give if it were reused, does not.

CPU, a spawned gloo world of one; the alltoall dispatcher's CUDA streams are stand-ins
(tests/megatroncpu.py).
"""

from __future__ import annotations

import os
import warnings

import pytest

pytest.importorskip("megatron.core")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from megatroncpu import TINY_MOE, cpu_streams, free_port  # noqa: E402

LENGTHS = (7, 12, 9)
# fp32: a batch and a sample alone differ by the kernels' summation order only (in bf16 the
# CPU's kernels for a padded batch round differently from one machine to the next)
FP32 = 1e-5


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max())


def _forward(gpt, ids: torch.Tensor, routes: np.ndarray | None) -> torch.Tensor:
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    from runtime.megatron.routing import per_layer

    RouterReplay.clear_global_indices()
    if routes is None:
        RouterReplay.clear_global_router_replay_action()
    else:
        RouterReplay.set_replay_data([torch.from_numpy(a) for a in per_layer(routes)])
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    with torch.no_grad():
        return gpt(ids, positions, None)


def _world(_rank: int, port: int, results) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        from megatron.core import parallel_state

        from runtime.megatron.model import build_gpt, transformer_config
        from runtime.megatron.routing import ReplayLayout, batch_routes
        from vime.resolve.model import arch_from_config

        parallel_state.initialize_model_parallel(1, 1)
        cpu_streams()
        arch = arch_from_config(TINY_MOE)
        torch.manual_seed(0)
        gpt = build_gpt(arch, transformer_config(arch, use_cpu_initialization=True,
                                                 moe_enable_routing_replay=True, bf16=False,
                                                 params_dtype=torch.float32,
                                                 pipeline_dtype=torch.float32), 256)
        gpt.eval()
        with torch.no_grad():  # experts that weigh in the logits, so that a wrong route shows
            for name, param in gpt.named_parameters():
                if ".experts." in name:
                    param.mul_(8)
        rng = np.random.default_rng(0)
        experts, topk, layers = arch.num_experts, arch.topk, arch.num_moe_layers
        # vLLM's routes ([length - 1, layers, top_k], distinct experts per token), random so
        # that they differ from the routers' own choice
        routed = [np.stack([[rng.choice(experts, topk, replace=False) for _ in range(layers)]
                            for _ in range(n - 1)]).astype(np.uint8) for n in LENGTHS]
        ids = [torch.randint(0, arch.vocab_size, (n,)) for n in LENGTHS]
        width = max(LENGTHS)
        batch = torch.zeros(len(LENGTHS), width, dtype=torch.long)
        for row, sample in enumerate(ids):
            batch[row, :len(sample)] = sample
        layout = ReplayLayout()
        alone = [_forward(gpt, sample[None], batch_routes([r], [len(sample)], len(sample),
                                                          layers, layout)[0])[0]
                 for sample, r in zip(ids, routed, strict=True)]
        routes, known = batch_routes(routed, list(LENGTHS), width, layers, layout)
        together = _forward(gpt, batch, routes)
        # the order a one-sample layout gives when its samples are simply concatenated
        sample_major = routes.reshape(width, len(LENGTHS), layers, topk).transpose(1, 0, 2, 3)
        wrong = _forward(gpt, batch, np.ascontiguousarray(sample_major).reshape(-1, layers, topk))
        natural = _forward(gpt, batch, None)
        gaps = [_gap(together[i, :n], alone[i]) for i, n in enumerate(LENGTHS)]
        results.update(
            gaps=gaps, wrong=[_gap(wrong[i, :n], alone[i]) for i, n in enumerate(LENGTHS)],
            natural=[_gap(natural[i, :n], alone[i]) for i, n in enumerate(LENGTHS)],
            known=known.reshape(width, len(LENGTHS)).sum(0).tolist(), rows=len(routes))
    except Exception as error:  # noqa: BLE001  (reported to the test)
        import traceback

        results["error"] = f"{error!r}\n{traceback.format_exc()}"
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def replayed():
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_world, args=(free_port(), results), nprocs=1, start_method="spawn")
        out = dict(results)
    assert "error" not in out, out.get("error")
    return out


def test_a_batch_replays_every_sample_as_it_replays_alone(replayed):
    assert replayed["rows"] == max(LENGTHS) * len(LENGTHS)
    assert max(replayed["gaps"]) < FP32, replayed["gaps"]


def test_the_replay_is_used_and_its_order_matters(replayed):
    # free routing and the sample-major order both move the logits by over 4 % of the largest
    assert min(replayed["natural"]) > 0.04, replayed["natural"]
    assert min(replayed["wrong"]) > 0.04, replayed["wrong"]


def test_only_the_rows_vllm_routed_are_marked(replayed):
    assert replayed["known"] == [n - 1 for n in LENGTHS]
