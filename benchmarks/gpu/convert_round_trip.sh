#!/usr/bin/env bash
# On GPUs: `vime convert` HF -> torch_dist -> HF on a random Qwen3-MoE made by transformers,
# then compare every tensor with the original. Run from the repository root with vime, its
# dependencies and megatron-core importable. Prints one JSON line.
#   TO_TORCH_DIST / TO_HF: the --set options of each direction (the layouts; one GPU per rank
#   of lcm(tp, ep × etp)); different layouts make megatron-core reshard on the way back.
set -euo pipefail
#   LAYERS: the model's layer count (default 3; a multiple of pp).
work=$(mktemp -d)
python3 - "$work" "${LAYERS:-3}" <<'PY'
import json, sys, torch, transformers
work = sys.argv[1]
config = dict(num_hidden_layers=int(sys.argv[2]), hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
              head_dim=64, vocab_size=4096, intermediate_size=1024, moe_intermediate_size=256,
              num_experts=8, num_experts_per_tok=2, mlp_only_layers=[0], max_position_embeddings=2048,
              tie_word_embeddings=False)
model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**config)).to(torch.bfloat16)
model.save_pretrained(f"{work}/hf")
spec = open("specs/qwen3_30b.toml").read()
spec = spec.replace('hf_checkpoint = "/root/Qwen3-30B-A3B"', f'hf_checkpoint = "{work}/hf"')
spec = spec.replace('torch_dist_checkpoint = "/root/Qwen3-30B-A3B_torch_dist"',
                    f'torch_dist_checkpoint = "{work}/torch dist"')
spec = spec.replace('preset = "qwen3-30b-a3b"', "")
open(f"{work}/spec.toml", "w").write(spec)
PY
common=(--set cluster.gpu=H200 --set rollout.max_response_len=1024)
read -r -a to_dist <<< "${TO_TORCH_DIST:---single-gpu}"
read -r -a to_hf <<< "${TO_HF:---single-gpu}"
python3 -m vime convert "$work/spec.toml" "${common[@]}" "${to_dist[@]}" --format concise
python3 -m vime convert "$work/spec.toml" "${common[@]}" "${to_hf[@]}" --to hf --format concise
python3 - "$work" <<'PY'
import json, sys, torch
from safetensors.torch import load_file
from runtime.megatron.mapping import unfuse_experts
work = sys.argv[1]
import glob
original = {}
for f in glob.glob(f"{work}/hf/*.safetensors"):
    original.update(load_file(f))
original = unfuse_experts(original)
back = load_file(f"{work}/torch dist_hf/model.safetensors")
layout = json.load(open(f"{work}/torch dist/vime_layout.json"))
print(json.dumps({"tensors": len(original), "same_names": sorted(back) == sorted(original),
                  "bit_identical": all(torch.equal(back[k], v) for k, v in original.items()),
                  "layout": layout}))
PY
