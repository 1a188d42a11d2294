"""On a GPU: a random Qwen3-MoE made with transformers, converted to megatron-core with
runtime/megatron/mapping.py, must give the same log-probs; HF -> torch_dist -> HF must give
bit-identical tensors.

    python benchmarks/gpu/hf_vs_megatron.py --out $OUT/hf_vs_megatron.json

Run from the repository root (torch with CUDA, transformers, megatron-core on the path).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

from runtime.megatron.mapping import hf_to_megatron, megatron_to_hf, unfuse_experts
from runtime.megatron.model import build_gpt, transformer_config
from vime.resolve.model import arch_from_config

CONFIG = {
    "model_type": "qwen3_moe", "num_hidden_layers": 4, "hidden_size": 1024,
    "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 32768,
    "intermediate_size": 2048, "moe_intermediate_size": 512, "num_experts": 8,
    "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [0],
    "tie_word_embeddings": False, "max_position_embeddings": 4096, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6, "norm_topk_prob": True,
}


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--fp32", action="store_true", help="both models in fp32 (isolates the "
                        "mapping from bf16 rounding)")
    args = parser.parse_args()
    import transformers
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from safetensors.torch import load_file

    torch.distributed.init_process_group("nccl", init_method="tcp://127.0.0.1:29512",
                                         world_size=1, rank=0)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(1234)
    result: dict = {"transformers": transformers.__version__, "torch": torch.__version__,
                    "device": torch.cuda.get_device_name(), "config": CONFIG}
    arch = arch_from_config(CONFIG)
    hf_config = transformers.Qwen3MoeConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"})
    dtype = torch.float32 if args.fp32 else torch.bfloat16
    result["dtype"] = str(dtype)
    hf_model = transformers.Qwen3MoeForCausalLM(hf_config).to(dtype).cuda().eval()
    work = tempfile.mkdtemp()
    hf_model.save_pretrained(f"{work}/hf")
    files = sorted(f for f in os.listdir(f"{work}/hf") if f.endswith(".safetensors"))
    saved: dict = {}
    for name in files:
        saved.update(load_file(f"{work}/hf/{name}"))
    result["saved_expert_format"] = ("fused" if any(k.endswith("experts.gate_up_proj") for k in saved)
                                     else "per-expert")
    hf_weights = unfuse_experts(saved)

    # HF -> Megatron, log-probs of the same tokens
    precision = (dict(bf16=False, params_dtype=torch.float32, pipeline_dtype=torch.float32)
                 if args.fp32 else {})
    config = transformer_config(arch, **precision)
    mc_model = build_gpt(arch, config, CONFIG["max_position_embeddings"]).to(dtype).cuda()
    missing = mc_model.load_state_dict(
        {k: v.cuda() for k, v in hf_to_megatron(hf_weights, arch).items()}, strict=False)
    result["missing_keys"] = [k for k in missing.missing_keys if not k.endswith("_extra_state")]
    result["unexpected_keys"] = list(missing.unexpected_keys)
    mc_model.eval()
    ids = torch.randint(0, CONFIG["vocab_size"], (1, args.tokens), device="cuda")
    positions = torch.arange(args.tokens, device="cuda").unsqueeze(0)
    with torch.no_grad():
        hf_lp = token_logprobs(hf_model(ids).logits, ids)
        mc_lp = token_logprobs(mc_model(ids, positions, None), ids)
    diff = (hf_lp - mc_lp).abs()
    result["logprob_abs_diff"] = {"max": diff.max().item(), "mean": diff.mean().item(),
                                  "p99": diff.quantile(0.99).item()}
    result["logprob_mean"] = {"hf": hf_lp.mean().item(), "megatron": mc_lp.mean().item()}

    # HF -> torch_dist -> HF, bit for bit
    print(json.dumps(result["logprob_abs_diff"]), flush=True)
    start = time.perf_counter()
    os.makedirs(f"{work}/torch_dist")
    dist_checkpointing.save(mc_model.sharded_state_dict(), f"{work}/torch_dist")
    result["torch_dist_save_s"] = time.perf_counter() - start
    fresh = build_gpt(arch, config, CONFIG["max_position_embeddings"]).to(dtype).cuda()
    loaded = dist_checkpointing.load(fresh.sharded_state_dict(), f"{work}/torch_dist")
    fresh.load_state_dict(loaded, strict=False)
    back = megatron_to_hf({k: v for k, v in fresh.state_dict().items()
                           if not k.endswith("_extra_state")}, arch)
    mismatched = [k for k, v in hf_weights.items() if not torch.equal(back[k].cpu(), v.cpu())]
    result["round_trip"] = {"tensors": len(hf_weights), "mismatched": mismatched,
                            "same_names": sorted(back) == sorted(hf_weights)}
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
