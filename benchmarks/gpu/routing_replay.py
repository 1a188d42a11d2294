"""On a GPU: routes laid out by runtime/megatron/routing.py, replayed through megatron-core's
RouterReplay, force exactly those experts in every MoE layer of a real GPTModel.

    python benchmarks/gpu/routing_replay.py --out $OUT/routing_replay.json

(megatron-core's TopKRouter needs CUDA, so this cannot run on the CPU machines.)
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from runtime.megatron.model import build_gpt, transformer_config
from runtime.megatron.routing import ReplayLayout, local_routes, per_layer
from vime.resolve.model import arch_from_config

CONFIG = {"model_type": "qwen3_moe", "num_hidden_layers": 3, "hidden_size": 256,
          "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1024,
          "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 16,
          "num_experts_per_tok": 4, "mlp_only_layers": [0], "max_position_embeddings": 1024}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    torch.distributed.init_process_group("nccl", init_method="tcp://127.0.0.1:29513",
                                         world_size=1, rank=0)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(7)
    arch = arch_from_config(CONFIG)
    config = transformer_config(arch, moe_enable_routing_replay=True)
    model = build_gpt(arch, config, 1024).to(torch.bfloat16).cuda().eval()
    seen: list[torch.Tensor] = []
    for module in model.modules():
        if isinstance(module, TopKRouter):
            module.register_forward_hook(lambda _m, _i, out: seen.append(out[1].detach()))

    lengths = [40, 25]  # two samples packed
    rng = np.random.default_rng(0)
    moe_layers = arch.num_moe_layers
    routed = [np.stack([np.stack([rng.choice(arch.num_experts, arch.topk, replace=False)
                                  for _ in range(moe_layers)]) for _ in range(n - 1)]).astype(np.uint8)
              for n in lengths]
    routes = local_routes(routed, lengths, moe_layers, ReplayLayout())
    ids = torch.randint(0, CONFIG["vocab_size"], (1, sum(lengths)), device="cuda")
    positions = torch.arange(sum(lengths), device="cuda").unsqueeze(0)
    with torch.no_grad():
        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
        natural = model(ids, positions, None).float()
        recorded = [r.clone() for r in RouterReplay.get_recorded_data()]
        RouterReplay.clear_global_indices()

        seen.clear()
        RouterReplay.set_replay_data([torch.from_numpy(a).cuda() for a in per_layer(routes)])
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        forced = model(ids, positions, None).float()
        forced_maps = list(seen)
        RouterReplay.clear_global_indices()

        RouterReplay.set_replay_data(recorded)
        again = model(ids, positions, None).float()
    chosen = [sorted(torch.nonzero(layer[t]).flatten().tolist())
              for layer in forced_maps for t in range(layer.shape[0])]
    wanted = [sorted(routes[t, layer].tolist())
              for layer in range(moe_layers) for t in range(routes.shape[0])]
    mismatches = [(i, c, w) for i, (c, w) in enumerate(zip(chosen, wanted, strict=False)) if c != w]
    result = {
        "moe_layers": moe_layers, "tokens": int(routes.shape[0]),
        "routers_seen_in_forced_pass": [list(t.shape) for t in forced_maps],
        "replay_instances": len(RouterReplay.global_router_replay_instances),
        "mismatches": len(mismatches), "first_mismatches": mismatches[:3],
        "forced_routes_match": chosen == wanted,
        "forced_changes_logits": float((forced - natural).abs().max()),
        "replaying_recorded_routes_max_diff": float((again - natural).abs().max()),
    }
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
