"""Write a small Qwen3-MoE with transformers' `save_pretrained` for the live vLLM runs:
config.json, safetensors and the toy task's word-level tokenizer (runtime/toy.py), so that
vime, megatron-core and vLLM all read the same folder.

    python benchmarks/gpu/tiny_moe.py build/tiny-qwen3-moe                 # specs/tiny_h200.toml
    python benchmarks/gpu/tiny_moe.py DIR --shape qwen3-30b-a3b --layers 4 # a 30B-A3B slice
    python benchmarks/gpu/tiny_moe.py build/tiny-qwen3-moe-tools \
        --prompts specs/data/tiny_arithmetic_tools.jsonl              # specs/tiny_h200_tools.toml

The weights are random (seeded); --shape qwen3-30b-a3b takes Qwen3-30B-A3B's dimensions
(hidden 2048, 128 experts of 768, top-8, vocab 151,936) with fewer layers.
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
    config = transformers.Qwen3MoeConfig(
        **shape, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-6,
        bos_token_id=tokenizer.convert_tokens_to_ids(toy.BOS_TURN),
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        torch_dtype="bfloat16")
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = transformers.Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    out = Path(args.out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
          f"{shape['num_hidden_layers']} layers, vocab {shape['vocab_size']}")


if __name__ == "__main__":
    main()
