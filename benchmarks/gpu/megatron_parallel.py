"""On 2 GPUs: the Megatron training backend under a tensor- or expert-parallel layout, checked
against transformers on the same HF weights.

    python benchmarks/gpu/megatron_parallel.py make-hf DIR           # a random Qwen3-MoE
    torchrun --nproc-per-node 2 benchmarks/gpu/megatron_parallel.py check DIR --tp 2 --ep 1 \
        --out $OUT/parallel_tp2.json

`check`, on every rank (the same batch everywhere):
1. the backend loads DIR's HF weights into its pieces (runtime/megatron/shards.py);
2. export: the gathered weights under HF names equal DIR's tensors bit for bit;
3. log-probs of random sequences vs transformers (bf16 and fp32) on rank 0;
4. routing replay under the layout: the experts transformers chose, replayed, give the same
   log-probs as free routing; the same routes shifted by one expert give different ones;
5. one GRPO step: finite loss, weights moved, and the replicated weights (norms, router)
   still equal on every rank (with `--set train.optimizer.cpu_offload=true`: Adam on the
   host, megatron-core's HybridDeviceOptimizer);
6. checkpoint: save, a second step, load, and the weights are back (dist-checkpointing); so
   are the optimizer's fp32 main weights, Adam moments and step counts (compared tensor by
   tensor, counted per kind).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ARCH = {
    "model_type": "qwen3_moe", "num_hidden_layers": 4, "hidden_size": 512,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 4096,
    "intermediate_size": 1024, "moe_intermediate_size": 256, "num_experts": 8,
    "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "tie_word_embeddings": False, "max_position_embeddings": 4096, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6, "norm_topk_prob": True,
}


def make_hf(folder: Path) -> None:
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(**{k: v for k, v in ARCH.items() if k != "model_type"})
    model = transformers.Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    print(f"wrote {folder}")


def _config(folder: Path, tp: int, ep: int, job_dir: Path, extra: tuple[str, ...] = ()):
    from runtime.node.torchrun import job_config

    sets = ['train.backend="megatron"', 'cluster.gpu="H200"', "cluster.gpus_per_node=2",
            f"train.parallel.tp={tp}", f"train.parallel.ep={ep}", "model.random_init=false",
            f'model.hf_checkpoint="{folder}"', "train.routing_replay=true",
            *(f"model.arch.{k}={json.dumps(v)}" for k, v in ARCH.items()), *extra]
    return job_config(ROOT / "specs" / "tiny_cpu.toml", sets, job_dir)


def _batch(samples: int, seed: int = 1):
    from runtime.core.interfaces import TrainBatch

    rng = np.random.default_rng(seed)
    tokens, prompts = [], []
    for _ in range(samples):
        length = int(rng.integers(200, 400))
        tokens.append(rng.integers(0, ARCH["vocab_size"], length).tolist())
        prompts.append(int(rng.integers(20, 60)))
    return TrainBatch(tokens=tokens, prompt_lens=prompts)


def _hf_reference(folder: Path, batch, dtype):
    """transformers' log-probs of each sample's response tokens, and its routed experts."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).cuda().eval()
    values, routes = [], []
    with torch.no_grad():
        for tokens, prompt in zip(batch.tokens, batch.prompt_lens, strict=True):
            ids = torch.tensor([tokens], device="cuda")
            out = model(ids, output_router_logits=True)
            log_p = torch.log_softmax(out.logits[0].float(), dim=-1)
            picked = log_p[prompt - 1:-1].gather(-1, ids[0, prompt:, None])[:, 0]
            values.append(picked.cpu())
            chosen = [logits.topk(ARCH["num_experts_per_tok"], dim=-1).indices.cpu().numpy()
                      for logits in out.router_logits]
            routes.append(np.stack(chosen, axis=1)[:-1].astype(np.int32))  # [seq-1, L, k]
    del model
    torch.cuda.empty_cache()
    return values, routes


def _optimizer_state(backend) -> dict:
    """Every tensor of the optimizer's state by position: the fp32 main weights the inner
    optimizer steps (its param groups) and their Adam state."""
    out = {}
    for i, opt in enumerate(getattr(backend.optimizer, "chained_optimizers", [backend.optimizer])):
        inner = opt.optimizer
        for g, group in enumerate(inner.param_groups):
            for j, param in enumerate(group["params"]):
                out[(i, g, j, "main")] = param.detach().clone()
                for key, value in inner.state.get(param, {}).items():
                    if torch.is_tensor(value):
                        out[(i, g, j, key)] = value.detach().clone()
    return out


def _live_steps(backend) -> list:
    """Adam's step tensors as the optimizer holds them (not copies: whether parameters share
    one tensor is the point)."""
    return [state["step"] for opt in getattr(backend.optimizer, "chained_optimizers",
                                             [backend.optimizer])
            for state in opt.optimizer.state.values() if "step" in state]


def _adam_step_report(steps: list) -> dict:
    return {"values": sorted({float(t) for t in steps}),
            "distinct_tensors": f"{len({id(t) for t in steps})}/{len(steps)}"}


def _steps_after_load(backend, ckpt: Path, step, saved_state: dict) -> dict:
    """Adam's step counts: saved, after a load and after one more step, with megatron-core's
    load alone and with the backend's restore of the counts (runtime/backends/
    megatron_train.py, _restore_adam_steps)."""
    out = {"saved": {"values": sorted({float(t) for k, t in saved_state.items()
                                       if k[-1] == "step"})}}
    restore = backend._restore_adam_steps
    for name, fix in (("megatron_load", lambda steps: None), ("backend_load", restore)):
        backend._restore_adam_steps = fix
        backend.load(ckpt)
        out[name] = _adam_step_report(_live_steps(backend))
        backend.train_step(step)
        out[name + "_then_one_step"] = _adam_step_report(_live_steps(backend))
    backend._restore_adam_steps = restore
    return out


def check(folder: Path, tp: int, ep: int, out: Path | None, extra: tuple[str, ...] = ()) -> None:
    import torch.distributed as dist

    from runtime.megatron.convert import read_hf
    from runtime.workers import actors

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    job_dir = Path(tempfile.mkdtemp(prefix="parallel-"))
    config = _config(folder, tp, ep, job_dir, extra)
    worker = actors.TrainWorker("megatron")
    started = time.perf_counter()
    worker.init(config.train_slice(rank, os.environ["MASTER_ADDR"],
                                   int(os.environ["MASTER_PORT"]), 4))
    backend = worker.backend
    result: dict = {"tp": tp, "ep": ep, "init_s": round(time.perf_counter() - started, 2),
                    "world": dist.get_world_size(), "set": list(extra),
                    "optimizer": [type(o.optimizer).__name__ for o in getattr(
                        backend.optimizer, "chained_optimizers", [backend.optimizer])]}

    # 2. export
    hf = read_hf(folder)
    exported = {}
    for bucket in backend.export_weights(64 << 20):
        exported.update(bucket)
    if rank == 0:
        result["export_names"] = len(exported)
        result["export_equal"] = sum(torch.equal(exported[k], hf[k].to(exported[k].dtype))
                                     for k in hf if k in exported)
        result["hf_names"] = len(hf)

    # 3. log-probs vs transformers
    batch = _batch(8)
    mine = backend.log_probs(batch, "actor")
    if rank == 0:
        for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            ref, routes = _hf_reference(folder, batch, dtype)
            diffs = torch.cat([(torch.tensor(m) - r).abs() for m, r in zip(mine, ref, strict=True)])
            result[f"logprob_vs_hf_{name}"] = {"max": float(diffs.max()),
                                                "mean": float(diffs.mean())}
        routes_list = [routes]
    else:
        routes_list = [None]
    dist.broadcast_object_list(routes_list, src=0)
    routes = routes_list[0]

    # 4. routing replay
    from dataclasses import replace

    replayed = backend.log_probs(replace(batch, routed_experts=routes), "actor")
    shifted = [(r + 1) % ARCH["num_experts"] for r in routes]
    moved = backend.log_probs(replace(batch, routed_experts=shifted), "actor")
    if rank == 0:
        def gap(a, b):
            return float(torch.cat([(torch.tensor(x) - torch.tensor(y)).abs()
                                    for x, y in zip(a, b, strict=True)]).mean())
        result["replay_same_routes_mean_diff"] = gap(replayed, mine)
        result["replay_shifted_routes_mean_diff"] = gap(moved, mine)

    # 5. one GRPO step (no replay)
    lengths = batch.response_lens()
    step = replace(batch, advantages=[1.0 if i % 2 else -1.0 for i in range(len(batch))],
                   old_log_probs=mine, rollout_log_probs=mine,
                   step_response_tokens=sum(lengths))
    before = {n: p.detach().float().clone() for n, p in backend.params.items()}
    torch.cuda.synchronize()
    started = time.perf_counter()
    stats = backend.train_step(step)
    torch.cuda.synchronize()
    result["train_step_s"] = round(time.perf_counter() - started, 3)
    result["train_stats"] = {k: float(v) for k, v in stats.items()}
    moved_params = sum(not torch.equal(before[n], p.detach().float())
                       for n, p in backend.params.items())
    result["params_moved"] = f"{moved_params}/{len(before)}"
    replicated = [n for n in backend.params if "layernorm" in n or "router" in n]
    flat = torch.cat([backend.params[n].detach().float().reshape(-1) for n in replicated])
    every = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(every, flat)
    result["replicated_equal_on_all_ranks"] = all(torch.equal(every[0], e) for e in every)

    # 6. checkpoint round trip
    ckpt = Path(tempfile.mkdtemp(prefix="ckpt-", dir="/tmp")) if rank == 0 else None
    holder = [str(ckpt) if ckpt else None]
    dist.broadcast_object_list(holder, src=0)
    ckpt = Path(holder[0])
    backend.save(ckpt)
    saved = {n: p.detach().clone() for n, p in backend.params.items()}
    saved_state = _optimizer_state(backend)
    backend.train_step(step)
    backend.load(ckpt)
    result["checkpoint_restores_weights"] = all(torch.equal(saved[n], p.detach())
                                                for n, p in backend.params.items())
    loaded_state = _optimizer_state(backend)
    kinds: dict = {}
    for key, tensor in saved_state.items():
        kind = kinds.setdefault(key[-1], {"equal": 0, "of": 0, "max_abs_diff": 0.0})
        kind["of"] += 1
        other = loaded_state.get(key)
        if other is not None and torch.equal(tensor, other):
            kind["equal"] += 1
        elif other is not None and other.shape == tensor.shape:
            kind["max_abs_diff"] = max(kind["max_abs_diff"],
                                       float((tensor.float() - other.float()).abs().max()))
    result["checkpoint_restores_optimizer"] = kinds
    result["adam_steps"] = _steps_after_load(backend, ckpt, step, saved_state)
    result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    results = [None] * dist.get_world_size()
    dist.gather_object(result, results if rank == 0 else None, dst=0)
    if rank == 0:
        print(json.dumps(results, indent=1))
        if out:
            out.write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("make-hf", "check"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--set", dest="sets", action="append", default=[],
                        help="more spec overrides, e.g. train.optimizer.cpu_offload=true")
    args = parser.parse_args()
    if args.what == "make-hf":
        make_hf(args.folder)
    else:
        check(args.folder, args.tp, args.ep, args.out, tuple(args.sets))


if __name__ == "__main__":
    main()
