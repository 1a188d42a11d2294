"""Measure a real megatron-core training step of a Qwen3-MoE slice on one GPU.

Run on the GPU machine (torch with CUDA, megatron-core 0.19 on PYTHONPATH):
    python benchmarks/gpu/megatron_memory.py --case 4:full:16384 --out measurements.jsonl

For each case: build GPTModel with Qwen3-30B-A3B's layer shapes and `layers` decoder layers
(random initialisation), wrap it in megatron-core's DDP with the distributed optimizer, and
run forward + backward + optimizer steps on `tokens` tokens whose loss is the GRPO shape
(fp32 log-softmax of the logits, gathered at the targets, times an advantage). Records peak
allocated and reserved memory of the last step and its tokens/s. vime's prediction for the
same spec is computed on the CPU side (benchmarks/memory_validation.py), so this script
needs nothing of vime.

Core attention: the local layer spec's DotProductAttention materialises the [s, s] score
matrix (32 GiB for one 16k sequence, see shared/reference/megatron.md); real runs use
Transformer Engine's flash attention, so this script swaps in torch's
scaled_dot_product_attention (flash kernel), which is what vime's memory model assumes.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

# Qwen3-30B-A3B (config.json of Qwen/Qwen3-30B-A3B)
QWEN3_30B_A3B = dict(hidden=2048, heads=32, kv_heads=4, head_dim=128, vocab=151936, experts=128,
                     topk=8, moe_ffn=768, ffn=6144, rope_theta=1e6, eps=1e-6)


class FlashCoreAttention(torch.nn.Module):
    """Drop-in for megatron's core_attention: causal SDPA on [s, b, heads, d] tensors."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type,
                 attention_dropout=None, softmax_scale=None, cp_comm_type=None, pg_collection=None):
        super().__init__()
        self.config = config
        self.softmax_scale = softmax_scale

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        # [s, b, h, d] -> [b, h, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def build(layers: int, recompute: str, seq_len: int):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    m = QWEN3_30B_A3B
    recompute_args = {}
    if recompute == "full":
        recompute_args = dict(recompute_granularity="full", recompute_method="uniform",
                              recompute_num_layers=1)
    elif recompute == "selective":
        recompute_args = dict(recompute_granularity="selective")
    config = TransformerConfig(
        num_layers=layers, hidden_size=m["hidden"], num_attention_heads=m["heads"],
        num_query_groups=m["kv_heads"], kv_channels=m["head_dim"], ffn_hidden_size=m["ffn"],
        num_moe_experts=m["experts"], moe_ffn_hidden_size=m["moe_ffn"], moe_router_topk=m["topk"],
        moe_token_dispatcher_type="alltoall", moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0, moe_router_dtype="fp32", normalization="RMSNorm",
        layernorm_epsilon=m["eps"], gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=False, qk_layernorm=True, hidden_dropout=0.0,
        attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, attention_softmax_in_fp32=True,
        variable_seq_lengths=True, **recompute_args)
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    for layer in spec.layer_specs:
        layer.submodules.self_attention.submodules.core_attention = FlashCoreAttention
    model = GPTModel(config, spec, vocab_size=m["vocab"], max_sequence_length=seq_len,
                     position_embedding_type="rope", rotary_base=int(m["rope_theta"]),
                     share_embeddings_and_output_weights=False).cuda()
    model = Float16Module(config, model)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                               use_distributed_optimizer=True)
    model = DistributedDataParallel(config, ddp_config, model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-6, weight_decay=0.1, adam_beta1=0.9,
                        adam_beta2=0.98, bf16=True, params_dtype=torch.bfloat16,
                        use_distributed_optimizer=True), [model])
    return model, optimizer, sum(p.numel() for p in model.parameters())


def grpo_step(model, optimizer, tokens: int, vocab: int) -> dict:
    """One step; returns the peak allocated bytes of each phase (forward, backward, step)."""
    input_ids = torch.randint(0, vocab, (1, tokens), device="cuda")
    targets = torch.roll(input_ids, -1, dims=1)
    position_ids = torch.arange(tokens, device="cuda").unsqueeze(0)
    advantages = torch.randn(1, tokens, device="cuda")
    model.zero_grad_buffer()
    optimizer.zero_grad()
    peaks = {}
    torch.cuda.reset_peak_memory_stats()
    logits = model(input_ids, position_ids, None)  # [b, s, V] bf16
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    loss = -(logp * advantages).mean()
    peaks["forward"] = torch.cuda.max_memory_allocated()
    peaks["forward_reserved"] = torch.cuda.max_memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    del logits, logp, loss
    model.finish_grad_sync()
    peaks["backward"] = torch.cuda.max_memory_allocated()
    peaks["backward_reserved"] = torch.cuda.max_memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    optimizer.step()
    peaks["step"] = torch.cuda.max_memory_allocated()
    peaks["step_reserved"] = torch.cuda.max_memory_reserved()
    return peaks


def run_case(case: dict) -> dict:
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model_parallel_cuda_manual_seed(1234)
    model, optimizer, params = build(case["layers"], case["recompute"], case["tokens"])
    torch.cuda.synchronize()
    after_build = torch.cuda.memory_allocated()
    times = []
    for _ in range(case.get("steps", 3)):
        torch.cuda.synchronize()
        resident = torch.cuda.memory_allocated()
        start = time.perf_counter()
        peaks = grpo_step(model, optimizer, case["tokens"], QWEN3_30B_A3B["vocab"])
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    result = dict(case, params=params, after_build_gib=after_build / 2**30,
                  resident_before_step_gib=resident / 2**30,
                  **{f"peak_{phase}_gib": value / 2**30 for phase, value in peaks.items()},
                  peak_allocated_gib=max(peaks[p] for p in ("forward", "backward", "step")) / 2**30,
                  peak_reserved_gib=max(peaks[p + "_reserved"] for p in ("forward", "backward", "step")) / 2**30,
                  resident_gib=torch.cuda.memory_allocated() / 2**30,
                  step_s=times[-1], tokens_per_s=case["tokens"] / times[-1])
    return result


def main() -> None:
    """One case per process (a fresh allocator each time); results are appended as JSON lines."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--case", required=True, help="layers:recompute:tokens, e.g. 4:full:16384")
    args = parser.parse_args()
    torch.distributed.init_process_group("nccl", init_method="tcp://127.0.0.1:29511",
                                         world_size=1, rank=0)
    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel(1, 1)
    layers, recompute, tokens = args.case.split(":")
    case = dict(layers=int(layers), recompute=recompute, tokens=int(tokens))
    try:
        result = run_case(case)
    except torch.OutOfMemoryError as err:
        result = dict(case, error=f"OOM: {str(err)[:300]}")
    result.update(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  total_gib=torch.cuda.get_device_properties(0).total_memory / 2**30)
    print(json.dumps(result), flush=True)
    with open(args.out, "a") as fh:
        fh.write(json.dumps(result) + "\n")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
