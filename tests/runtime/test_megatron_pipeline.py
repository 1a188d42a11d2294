"""megatron-core's pipeline schedule with vime's loss head and GRPO loss on the last stage
(runtime/megatron/pipeline.py), pp = 2 in two CPU processes over gloo, against the
same weights at pp = 1 in one process (megatron-core's schedule without pipelining).

Tiny Qwen3s built by the backend's path (runtime/megatron/model.py), fp32, one layer per stage
at pp = 2: dense with tied embeddings (the last stage holds a copy of the embedding, kept equal
by megatron-core's all-reduce of its gradient over the embedding group), dense untied, and MoE.
The weights are cut into each stage's pieces by runtime/megatron/shards.py (global layer
numbers) and gathered back from both stages (the export), the model wrapped in megatron-core's
DistributedDataParallel as the backend wraps it.
Four micro-batches of different sizes and widths (the stages exchange shapes first), so the
1F1B schedule runs its warm-up, steady state and cool-down. Checked:
- the export from both stages gives pp = 1's tensors under pp = 1's names (a tied model's
  last-stage copy of the embedding counted once: it failed to load with KeyError
  'output_layer.weight' before shards.pieces named it by megatron-core's key);
- the log-probs and entropies of the response tokens, returned by the last stage and broadcast
  to the first (pipeline.from_last_stage), equal pp = 1's;
- the GRPO loss's statistics and, after finalize_model_grads, the gradient norm over both
  stages (megatron-core's get_grad_norm_fp32 over the model-parallel group, the copy of a tied
  embedding counted once, as its optimizer counts it) equal pp = 1's.

Test-only stand-in for CUDA (what the schedule needs to run on the CPU at all, megatron-core
0.19.2; vime's runtime code does not depend on it): `_cpu_stands_in_for_cuda` in each spawned
rank, found by running the schedule and reading each failure:
- schedules.py allocates its token count with device="cuda" (forward_backward_no_pipelining
  and forward_backward_pipelining_without_interleaving), and language_module.py moves the tied
  embedding's copy to `.cuda()` before its all-reduce; no config option avoids either (both
  raised "Found no NVIDIA driver on your system"). A torch function mode maps device "cuda" to
  the CPU and makes Tensor.cuda() return the tensor; it changes no megatron-core code.
- p2p_communication.py allocates the received tensors and shapes on
  torch.cuda.current_device() and calls torch.cuda.synchronize() after exchanging shapes
  (variable_seq_lengths, which the backend sets) and after each batched exchange (the default
  batch_p2p_sync): current_device answers "cpu" (as the other CPU tests of megatron-core do)
  and synchronize does nothing (gloo's waits are blocking).
- the MoE layer's alltoall dispatcher asks for CUDA streams for device-to-host copies: a
  stream that does nothing (as tests/oracle/test_megatron_moe_activations.py).
With these the schedule, its point-to-point sends (batch_isend_irecv over gloo) and
finalize_model_grads ran unchanged.
"""

from __future__ import annotations

import os
import warnings

import pytest

pytest.importorskip("megatron.core")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from megatroncpu import cpu_streams, free_port  # noqa: E402

from vime.resolve.model import arch_from_config  # noqa: E402

PP = 2
BASE = {
    "model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64,
    "intermediate_size": 48, "max_position_embeddings": 64,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
}
MODELS = {
    "dense, tied": {**BASE, "tie_word_embeddings": True},
    "dense": {**BASE, "tie_word_embeddings": False},
    "moe": {**BASE, "model_type": "qwen3_moe", "tie_word_embeddings": False,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
            "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []},
}
TOKENS = [[(7 * i + 3) % 64 for i in range(11)], [(5 * i + 1) % 64 for i in range(8)],
          [(3 * i + 2) % 64 for i in range(9)], [(11 * i + 5) % 64 for i in range(6)],
          [(13 * i + 7) % 64 for i in range(10)]]
PROMPT_LENS = [4, 3, 5, 2, 6]
MICRO_BATCHES = [[0, 1], [2], [3], [4]]
TEMPERATURE = 0.8


def _cpu_stands_in_for_cuda() -> None:
    """Test only: megatron-core's CUDA calls on the schedule's path answered on the CPU (the
    module docstring says which and why)."""
    from torch.overrides import TorchFunctionMode

    class CudaIsTheCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                return args[0]
            device = kwargs.get("device")
            if isinstance(device, str | torch.device) and torch.device(device).type == "cuda":
                kwargs["device"] = "cpu"
            return func(*args, **kwargs)

    CudaIsTheCpu().__enter__()  # for the rest of this spawned process
    cpu_streams()
    torch.cuda.synchronize = lambda *_a, **_k: None


def _micro_batches(with_loss: dict | None):
    from runtime.backends.torch_train import response_positions
    from runtime.megatron.pipeline import MicroBatch

    out = []
    for indices in MICRO_BATCHES:
        tokens = [TOKENS[i] for i in indices]
        width = max(len(t) for t in tokens)
        ids = torch.zeros(len(tokens), width, dtype=torch.long)
        for row, seq in enumerate(tokens):
            ids[row, :len(seq)] = torch.tensor(seq)
        rows, picks, mask = response_positions([PROMPT_LENS[i] for i in indices],
                                               [len(t) for t in tokens], width)
        targets = ids[rows, (picks + 1).clamp(max=width - 1)]
        terms = {}
        if with_loss is not None:
            terms = {k: v[tuple(indices)] for k, v in with_loss.items()}
        out.append(MicroBatch(ids, torch.arange(width).expand(len(tokens), width), rows, picks,
                              targets, mask, **terms))
    return out


def _loss_inputs(log_probs: list[list[float]]) -> dict:
    """Old, reference and rollout log-probs near the current ones and signed advantages, per
    micro-batch (keyed by its samples), so that clipping, KL and TIS all take part."""
    out: dict = {k: {} for k in ("old_log_probs", "ref_log_probs", "rollout_log_probs",
                                 "advantages")}
    for indices in MICRO_BATCHES:
        width = max(len(TOKENS[i]) - PROMPT_LENS[i] for i in indices)
        columns = {k: torch.zeros(len(indices), width) for k in out}
        for row, i in enumerate(indices):
            values = torch.tensor(log_probs[i])
            shift = 0.3 * torch.sin(torch.arange(len(values)) * 1.7 + i)
            columns["old_log_probs"][row, :len(values)] = values + shift
            columns["ref_log_probs"][row, :len(values)] = values - 0.5 * shift
            columns["rollout_log_probs"][row, :len(values)] = values + 0.8 * shift
            columns["advantages"][row] = (-1.0) ** i * (0.5 + 0.25 * i)
        for key in out:
            out[key][tuple(indices)] = columns[key]
    return out


def _build(name: str, full: dict | None):
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from runtime.megatron import shards
    from runtime.megatron.model import build_gpt, transformer_config

    arch = arch_from_config(MODELS[name])
    config = transformer_config(arch, calculate_per_token_loss=True, use_cpu_initialization=True,
                                bf16=False, params_dtype=torch.float32,
                                pipeline_dtype=torch.float32,
                                pipeline_model_parallel_size=parallel_state
                                .get_pipeline_model_parallel_world_size())
    torch.manual_seed(3)
    gpt = build_gpt(arch, config, BASE["max_position_embeddings"],
                    pre_process=parallel_state.is_pipeline_first_stage(),
                    post_process=parallel_state.is_pipeline_last_stage(),
                    experts="sequential")
    if full is not None:
        shards.fill(gpt, full)
    model = DistributedDataParallel(
        config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), gpt)
    return gpt, model


def _case(name: str, full: dict | None) -> dict:
    from megatron.core import parallel_state
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.optimizer.clip_grads import get_grad_norm_fp32
    from megatron.core.transformer.module import param_is_not_shared

    from runtime.backends.megatron_train import _head_inputs
    from runtime.core.slices import LossConfig
    from runtime.megatron import pipeline, shards

    gpt, model = _build(name, full)
    exported = {}  # every stage's pieces, under their global names, on every rank
    for bucket in shards.gather(gpt, 1 << 30):
        exported.update({k: v.detach().clone() for k, v in bucket.items()})
    export_matches = full is None or (exported.keys() == full.keys() and all(
        torch.equal(exported[k], full[k]) for k in full))
    full = exported if full is None else full  # pp = 1: these weights are the case's
    group = parallel_state.get_pipeline_model_parallel_group()
    head = pipeline.Head(temperature=TEMPERATURE, entropy=True, entropy_in_loss=True)
    model.eval()
    with torch.no_grad():
        kept = pipeline.run(model, _micro_batches(None), pipeline.forward_step(head, _head_inputs),
                            forward_only=True)
    log_probs = pipeline.from_last_stage(pipeline.response_values(kept), group)
    entropies = pipeline.from_last_stage(pipeline.response_values(kept, "entropy"), group)

    model.train()
    model.zero_grad_buffer()
    loss = LossConfig(kl_loss_coef=0.1, entropy_coef=0.01, tis=True)
    normalizer = float(sum(len(t) - p for t, p in zip(TOKENS, PROMPT_LENS, strict=True)))
    step = pipeline.forward_step(head, _head_inputs, loss, normalizer)
    kept = pipeline.run(model, _micro_batches(_loss_inputs(log_probs)), step, forward_only=False)
    stats = {key: float(sum(values[key] for values in kept))
             for key in ("pg_loss", "clipped_tokens", "kl", "entropy", "tis_weight")} \
        if kept else None
    finalize_model_grads([model])
    grads = [p.main_grad for p in gpt.parameters() if param_is_not_shared(p)]
    norm = get_grad_norm_fp32(grads, grad_stats_parallel_group=parallel_state
                              .get_model_parallel_group())
    return {"full": full, "export_matches": export_matches, "log_probs": log_probs, "entropies": entropies,
            "stats": pipeline.from_last_stage(stats, group), "grad_norm": norm}


def _rank(rank: int, world: int, port: int, weights: dict | None, results) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _cpu_stands_in_for_cuda()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from megatron.core import parallel_state

        parallel_state.initialize_model_parallel(pipeline_model_parallel_size=world)
        out = {}
        for name in MODELS:
            out[name] = _case(name, None if weights is None else weights[name])
            if weights is not None:
                del out[name]["full"]
        results[rank] = out
    except Exception as error:  # noqa: BLE001  (reported to the test, which fails on it)
        import traceback

        results[rank] = {"error": traceback.format_exc() + repr(error)}
    finally:
        dist.destroy_process_group()


def _spawn(world: int, weights: dict | None) -> list[dict]:
    port = free_port()
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(world, port, weights, results), nprocs=world, join=True)
    out = [results[r] for r in range(world)]
    errors = [f"rank {rank} of {world}:\n{r['error']}" for rank, r in enumerate(out)
              if "error" in r]
    assert not errors, "\n".join(errors)
    return out


def test_pp2_schedule_gives_pp1s_log_probs_and_gradient_norm():
    (single,) = _spawn(1, None)
    stages = _spawn(PP, {name: single[name]["full"] for name in MODELS})
    for name in MODELS:
        want = single[name]
        assert [len(v) for v in want["log_probs"]] == \
            [len(t) - p for t, p in zip(TOKENS, PROMPT_LENS, strict=True)]
        for stage, results in enumerate(stages):
            got = results[name]
            where = f"{name}, stage {stage}"
            assert got["export_matches"], f"{where}: the export differs from pp = 1's weights"
            for key in ("log_probs", "entropies"):
                for sample, (a, b) in enumerate(zip(got[key], want[key], strict=True)):
                    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5,
                                               atol=1e-5, msg=f"{where}: {key} of {sample}")
            assert got["stats"] == pytest.approx(want["stats"], rel=1e-5, abs=1e-6), where
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5), where
            assert want["grad_norm"] > 0 and want["stats"]["clipped_tokens"] > 0
