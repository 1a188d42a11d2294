"""vllm.args: the engine arguments of one rollout engine (vLLM 0.33 spellings,
shared/reference/vllm.md); the user's inference.extra_args come last so they win."""

from __future__ import annotations

import json

from vime.plan import Plan


def vllm_args(plan: Plan) -> list[list[str]]:
    spec = plan.spec
    inf, engine = spec.inference, plan.engines[0]
    args: list[list[str]] = [
        ["--model", spec.model.hf_checkpoint],
        ["--tensor-parallel-size", str(engine.tp)],
        ["--data-parallel-size", str(engine.dp)],
        ["--dtype", "bfloat16"],
        ["--gpu-memory-utilization", repr(inf.gpu_memory_utilization)],
        ["--max-model-len", str(spec.max_model_len)],
        ["--seed", str(spec.experiment.seed)],
        # the sampled token's log-prob after temperature and top-p (the nucleus renormalised,
        # vllm/config/model.py), as the actor computes it (runtime/core/nucleus.py)
        ["--logprobs-mode", "processed_logprobs"],
    ]
    if len(engine.nodes) > 1:
        args.append(["--distributed-executor-backend", "ray"])
    if inf.expert_parallel:
        args.append(["--enable-expert-parallel"])
    if inf.eplb.enabled:
        config = {"window_size": inf.eplb.window_size, "step_interval": inf.eplb.step_interval,
                  "num_redundant_experts": inf.eplb.num_redundant_experts}
        args += [["--enable-eplb"], ["--eplb-config", json.dumps(config, separators=(",", ":"))]]
    if inf.cudagraph_capture_sizes:
        args.append(["--cudagraph-capture-sizes", *map(str, inf.cudagraph_capture_sizes)])
    if inf.moe_backend != "auto":
        args.append(["--moe-backend", inf.moe_backend])
    if spec.train.colocate:
        args.append(["--enable-sleep-mode"])
    if spec.train.routing_replay:
        args.append(["--enable-return-routed-experts"])
    args += [[extra] for extra in inf.extra_args]
    return args
