"""On a GPU (or the CPU, for a dry run): a small random model of the DeepSeek-V3 and GLM-4.5
families, written by transformers' save_pretrained, against the Megatron backend's model of it
(runtime/megatron/mapping.py, runtime/megatron/model.py) and, with --vllm, against vLLM
serving the same folder.

    python benchmarks/gpu/families_hf_vs_megatron.py --out $OUT/families.json          # H200
    python benchmarks/gpu/families_hf_vs_megatron.py --out $OUT/families.json --vllm   # + vLLM
    python benchmarks/gpu/families_hf_vs_megatron.py --out /tmp/f.json --device cpu --fp32

For each family it reports: the Megatron weights that transformers' checkpoint does not fill
(none expected), the log-prob gap between transformers and Megatron (bf16 on the GPU; fp32
on the CPU measured 1.9e-06), the bit-exactness of Megatron -> HF, and with --vllm the
log-prob gap between vLLM's prompt_logprobs and Megatron and the share of vLLM's routed
experts (--enable-return-routed-experts, routed experts only) that Megatron's routers pick too.
The shapes are small but keep each family's features: MLA with a query latent, 2 shared
experts, 8 groups of 4 routed experts (2 groups a token, as DeepSeek-V3 picks 4 of 8 for top-8: megatron-core sums top_k ÷ topk_group scores a group, transformers and vLLM 2) with the expert bias, dense first layer (DeepSeek-V3);
QKV bias, q/k norm, half rotary, 1 shared expert (GLM-4.5). Heads of 128 (qk 192, v 128 for
MLA) and MLA's latent of 512 (cache rows of 512 + 64, FlashMLA's only size) so that vLLM's
GPU attention kernels take them. With --vllm the prompt's ids are those of the toy task's
tokenizer saved beside the model (vLLM 0.26 generates only with a tokenizer).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

from benchmarks.gpu.tiny_moe import shape_and_tokenizer
from runtime.megatron.mapping import hf_to_megatron, megatron_to_hf, unfuse_experts
from runtime.megatron.model import build_gpt, transformer_config
from runtime.megatron.routing import moe_layer_routes
from vime.resolve.model import arch_from_config

_COMMON = {
    "vocab_size": 32768, "hidden_size": 1024, "intermediate_size": 2048,
    "moe_intermediate_size": 512, "num_hidden_layers": 4, "num_experts_per_tok": 4,
    "first_k_dense_replace": 1, "norm_topk_prob": True, "tie_word_embeddings": False,
    "max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
    "hidden_act": "silu", "initializer_range": 0.02,
}
FAMILIES = {
    "deepseek_v3": {
        **_COMMON, "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
        "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 512,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "n_routed_experts": 32, "n_shared_experts": 2, "n_group": 8,
        "topk_group": 2, "routed_scaling_factor": 2.5,
        # as DeepSeek-V3's config.json: vLLM routes by softmax without the bias without them
        "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    },
    "glm4_moe": {
        **_COMMON, "model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"],
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
        "partial_rotary_factor": 0.5, "attention_bias": True, "use_qk_norm": True,
        "n_routed_experts": 32, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
        "routed_scaling_factor": 2.5,
    },
}


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def save_family(name: str, folder: str, dtype: torch.dtype):
    """transformers' model of the family, saved as the hub would hold it (the expert bias
    in fp32, drawn ~N(0, 0.1) so that it moves the routing), with the toy task's tokenizer
    beside it for vLLM; the model, on the CPU."""
    import transformers

    config = FAMILIES[name]
    kind = (transformers.DeepseekV3Config if config["model_type"] == "deepseek_v3"
            else transformers.Glm4MoeConfig)
    hf_config = kind(**{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(1234)
    model = transformers.AutoModelForCausalLM.from_config(hf_config).to(dtype)
    for key, buffer in model.named_buffers():
        if key.endswith("e_score_correction_bias"):
            buffer.data = torch.randn(buffer.shape) * 0.1
    model.save_pretrained(folder)
    shape_and_tokenizer("tiny")[1].save_pretrained(folder)
    return model.eval()


def megatron_routes(model, ids, positions):
    """Megatron's log-probs with its routers' own choice, and that choice per MoE layer."""
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    RouterReplay.clear_global_indices()
    RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
    with torch.no_grad():
        logits = model(ids, positions, None)
    routes = [r.clone() for r in RouterReplay.get_recorded_data()]
    RouterReplay.clear_global_router_replay_action()
    return token_logprobs(logits, ids), routes


def vllm_side(folder: str, ids: list[int]) -> tuple[list[float], object]:
    """vLLM's prompt log-probs of `ids` and its routed experts, [tokens, decoder layers, top_k]
    (a column per decoder layer, a dense layer's left 0), from an engine in a process of its
    own: this process holds Megatron's NCCL group, which an in-process vLLM would take as its
    world, and one engine per process leaves no state behind for the next family's."""
    import subprocess
    import sys

    request = os.path.join(folder, "vllm_request.json")
    with open(request, "w") as fh:
        json.dump({"folder": folder, "ids": ids}, fh)
    subprocess.run([sys.executable, __file__, "--vllm-child", request], check=True)
    with open(request + ".out") as fh:
        answer = json.load(fh)
    return answer["logprobs"], answer["routed"]


def vllm_child(request: str) -> None:
    """The engine's side of vllm_side: vLLM 0.26 generates only with a tokenizer (the folder
    has the toy task's, benchmarks/gpu/tiny_moe.py's), and returns routed experts from its V1
    model runner (runtime/backends/vllm_compat.py)."""
    from runtime.backends import vllm_compat

    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER",
                          "1" if vllm_compat.routed_experts_need_v2_runner() else "0")
    from vllm import LLM, SamplingParams

    with open(request) as fh:
        asked = json.load(fh)
    ids = asked["ids"]
    llm = LLM(model=asked["folder"], dtype="bfloat16", enforce_eager=True, max_model_len=4096,
              gpu_memory_utilization=0.5, enable_return_routed_experts=True)
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
    out = llm.generate([{"prompt_token_ids": ids}], params)[0]
    logprobs = [entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], ids[1:],
                                                                 strict=True)]
    routed = getattr(out, "routed_experts", None)
    if routed is None and out.outputs:
        routed = getattr(out.outputs[0], "routed_experts", None)
    with open(request + ".out", "w") as fh:
        json.dump({"logprobs": logprobs,
                   "routed": None if routed is None else [[list(map(int, k)) for k in row]
                                                          for row in routed]}, fh)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--fp32", action="store_true", help="both models in fp32")
    parser.add_argument("--vllm", action="store_true", help="also vLLM on the saved folder")
    parser.add_argument("--families", nargs="*", default=sorted(FAMILIES))
    parser.add_argument("--vllm-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_child:
        vllm_child(args.vllm_child)
        return
    import transformers
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.router_replay import RouterReplay

    cpu = args.device == "cpu"
    if cpu:
        # before cpu_streams replaces torch.cuda.Stream, which their annotations name
        import transformers.models.deepseek_v3.modeling_deepseek_v3  # noqa: F401
        import transformers.models.glm4_moe.modeling_glm4_moe  # noqa: F401

        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
        from megatroncpu import cpu_streams

        cpu_streams()
    torch.distributed.init_process_group("gloo" if cpu else "nccl",
                                         init_method="tcp://127.0.0.1:29513", world_size=1, rank=0)
    parallel_state.initialize_model_parallel(1, 1)
    if not cpu:
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(1234)
    dtype = torch.float32 if args.fp32 else torch.bfloat16
    result: dict = {"transformers": transformers.__version__, "torch": torch.__version__,
                    "device": "cpu" if cpu else torch.cuda.get_device_name(),
                    "dtype": str(dtype), "families": {}}
    work = tempfile.mkdtemp()
    for name in args.families:
        config = FAMILIES[name]
        arch = arch_from_config(config)
        folder = f"{work}/{name}"
        hf_model = save_family(name, folder, dtype).to(args.device)
        from safetensors.torch import load_file

        saved = unfuse_experts(load_file(f"{folder}/model.safetensors"))
        precision = (dict(bf16=False, params_dtype=torch.float32, pipeline_dtype=torch.float32)
                     if args.fp32 else {})
        RouterReplay.clear_global_router_replay_instances()
        megatron_config = transformer_config(arch, moe_enable_routing_replay=True,
                                             use_cpu_initialization=cpu, **precision)
        model = build_gpt(arch, megatron_config, config["max_position_embeddings"],
                          experts="sequential" if cpu else None).to(dtype).to(args.device).eval()
        loaded = model.load_state_dict(
            {k: v.to(args.device) for k, v in hf_to_megatron(saved, arch).items()}, strict=False)
        state = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
        back = megatron_to_hf(state, arch)
        torch.manual_seed(7)
        # with --vllm, ids the toy tokenizer has (vLLM refuses a prompt id beyond it)
        high = len(shape_and_tokenizer("tiny")[1]) if args.vllm else config["vocab_size"]
        ids = torch.randint(0, high, (1, args.tokens), device=args.device)
        positions = torch.arange(args.tokens, device=args.device).unsqueeze(0)
        with torch.no_grad():
            hf_lp = token_logprobs(hf_model(ids).logits, ids)
        mc_lp, routes = megatron_routes(model, ids, positions)
        gap = (hf_lp - mc_lp).abs()
        family = {
            "params_total": arch.params_total,
            "missing_keys": [k for k in loaded.missing_keys if not k.endswith("_extra_state")],
            "round_trip_mismatched": [k for k, v in saved.items()
                                      if not torch.equal(back[k].cpu(), v.to(back[k].dtype))],
            "hf_vs_megatron_logprob": {"max": gap.max().item(), "mean": gap.mean().item(),
                                       "p99": gap.float().quantile(0.99).item()},
            "logprob_mean": {"hf": hf_lp.mean().item(), "megatron": mc_lp.mean().item()},
        }
        if args.vllm:
            del hf_model
            vllm_lp, routed = vllm_side(folder, ids[0].tolist())
            vgap = (torch.tensor(vllm_lp) - mc_lp[0].cpu()).abs()
            family["vllm_vs_megatron_logprob"] = {"max": vgap.max().item(),
                                                  "mean": vgap.mean().item()}
            if routed is not None:
                import numpy as np

                # vLLM's columns are decoder layers, Megatron's recorded routes MoE layers
                vllm_routes = torch.from_numpy(moe_layer_routes(
                    np.asarray(routed, dtype=np.int64), arch.moe_layers))
                rows = min(len(vllm_routes), len(routes[0]))
                same = sum(len(set(a.tolist()) & set(b.tolist()))
                           for layer, mine in enumerate(routes)
                           for a, b in zip(vllm_routes[:rows, layer], mine[:rows].cpu(),
                                           strict=True))
                family["route_match"] = same / vllm_routes[:rows].numel()
        result["families"][name] = family
        print(name, json.dumps(family), flush=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
