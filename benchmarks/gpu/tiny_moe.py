"""Write a small MoE model with transformers' `save_pretrained` for the live vLLM runs:
config.json, safetensors and the toy task's word-level tokenizer (runtime/toy.py), so that
vime, megatron-core and vLLM all read the same folder.

    python benchmarks/gpu/tiny_moe.py build/tiny-qwen3-moe                 # specs/tiny_h200.toml
    python benchmarks/gpu/tiny_moe.py DIR --shape qwen3-30b-a3b --layers 4 # a 30B-A3B slice
    python benchmarks/gpu/tiny_moe.py build/tiny-qwen3-moe-tools \
        --prompts specs/data/tiny_arithmetic_tools.jsonl              # specs/tiny_h200_tools.toml
    python benchmarks/gpu/tiny_moe.py build/tiny-dsv3 --shape deepseek-v3-tiny  # tiny_h200_dsv3
    python benchmarks/gpu/tiny_moe.py build/tiny-glm4-moe --shape glm4-moe-tiny # tiny_h200_glm

The weights are random (seeded); --shape qwen3-30b-a3b takes Qwen3-30B-A3B's dimensions
(hidden 2048, 128 experts of 768, top-8, vocab 151,936) with fewer layers. The two family
shapes are the specs' [model.arch] (tests/test_support.py holds them equal).
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SHAPES = {
    # the tiny CPU spec's model, with heads of 64 (vLLM's GPU attention kernels take them)
    "tiny": dict(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, intermediate_size=512,
                 moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2,
                 max_position_embeddings=128, vocab_size=64),
    "qwen3-30b-a3b": dict(num_hidden_layers=48, hidden_size=2048, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, intermediate_size=6144,
                          moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                          max_position_embeddings=40960, vocab_size=151936),
    # DeepSeek-V3 with one dense layer and two MoE layers: MLA with a query latent and the
    # latent sizes of the real model (kv_lora_rank 512, qk heads of 128 + 64, values of 128:
    # those vLLM's MLA kernels on an H200 take, FlashMLA's 576-wide cache rows), one shared
    # expert, sigmoid scores with the expert bias, two groups of which one is used (each group
    # scored by its best 2, as megatron-core scores it for top_k 2 / topk_group 1), and
    # DeepSeek-V3's 16 heads
    "deepseek-v3-tiny": dict(
        model_type="deepseek_v3", num_hidden_layers=3, first_k_dense_replace=1,
        hidden_size=256, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=128,
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        intermediate_size=512, moe_intermediate_size=128, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=128,
        vocab_size=64),
    # GLM-4.5 with one dense layer and two MoE layers: grouped-query attention with QKV bias,
    # q/k norms and rotary over half of each 64-wide head, one shared expert
    "glm4-moe-tiny": dict(
        model_type="glm4_moe", num_hidden_layers=3, first_k_dense_replace=1, hidden_size=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, partial_rotary_factor=0.5,
        attention_bias=True, use_qk_norm=True, intermediate_size=512,
        moe_intermediate_size=128, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.5,
        norm_topk_prob=True, max_position_embeddings=128, vocab_size=64),
}

# what every shape's config.json holds besides its dimensions, by model_type; no MTP layer
# (num_nextn_predict_layers, 1 by transformers' default): vLLM serves one only as a draft
# model and the actor trains none. DeepSeek-V3's scoring_func and topk_method, as its own
# config.json has them: transformers v5 does not write them, and vLLM's deepseek_v2.py
# then routes by softmax without the expert bias
_FIXED = {
    "qwen3_moe": dict(decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True),
    "deepseek_v3": dict(hidden_act="silu", num_nextn_predict_layers=0, scoring_func="sigmoid",
                        topk_method="noaux_tc"),
    "glm4_moe": dict(hidden_act="silu", num_nextn_predict_layers=0),
}


PROMPTS = ROOT / "specs" / "data" / "tiny_arithmetic.jsonl"


def shape_and_tokenizer(name: str, layers: int | None = None,
                        prompts: Path = PROMPTS) -> tuple[dict, object]:
    """A shape of SHAPES (with `layers` layers) and the word-level tokenizer of a toy task's
    prompts, the vocabulary at least the tokenizer's (also benchmarks/gpu/rollout_bench.py's)."""
    from runtime import toy

    shape = dict(SHAPES[name])
    if layers:
        shape["num_hidden_layers"] = layers
    tokenizer = toy.build_tokenizer(toy.prompt_texts(str(prompts), "prompt", "label"))
    shape["vocab_size"] = max(shape["vocab_size"], len(tokenizer))
    return shape, tokenizer


def main() -> None:
    import torch
    import transformers

    from runtime import toy

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--prompts", type=Path, default=PROMPTS,
                        help="the JSONL prompts whose words make the tokenizer")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    shape, tokenizer = shape_and_tokenizer(args.shape, args.layers, args.prompts)
    model_type = shape.pop("model_type", "qwen3_moe")
    config = transformers.AutoConfig.for_model(
        model_type, **_FIXED[model_type], **shape,
        tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-6,
        bos_token_id=tokenizer.convert_tokens_to_ids(toy.BOS_TURN),
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        torch_dtype="bfloat16")
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    out = Path(args.out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
          f"{shape['num_hidden_layers']} layers, vocab {shape['vocab_size']}")


if __name__ == "__main__":
    main()
