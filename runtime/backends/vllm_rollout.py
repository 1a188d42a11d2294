"""The vLLM rollout backend (vLLM 0.33): one engine = one `vllm.LLM` with the engine arguments
vime compiled (`vllm.args`, checked against vLLM's own parser in tests/oracle/test_vllm.py).

- Generation: token-id prompts, one sample per request with the request's seed (so a resumed
  run samples the same), `logprobs=0` for the sampled token's log-prob (vime emits
  `--logprobs-mode processed_logprobs`: after temperature, and after top-p when top_p < 1),
  and with routing replay the routed experts of every token (`--enable-return-routed-experts`,
  which needs the V2 model runner: VLLM_USE_V2_MODEL_RUNNER=1 is set before the engine starts).
- Weights: each bucket (HF names) goes to every worker through `collective_rpc` and the
  model's own `load_weights`, the path vLLM's examples use for in-place updates; the version
  counter moves when the last bucket of a version arrives. vLLM's weight-transfer engine
  (IPC when colocated, NCCL otherwise) is the faster path for large models (not wired yet).
- Sleep and wake map to `LLM.sleep(level)` / `LLM.wake_up(tags)` (`--enable-sleep-mode`).

What has and has not been executed is in docs/vllm.md: vLLM needs a GPU this project's
machines do not have with vLLM installed, so the conversions below are tested on vLLM's real
objects on CPU, and the engine calls are not.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from runtime.interfaces import (
    Generation,
    GenerationRequest,
    RolloutBackend,
    SamplingParams,
    WeightBucket,
)
from runtime.slices import EngineSlice


def engine_kwargs(args: Sequence[str]) -> dict:
    """vime's vllm.args -> the keyword arguments of `vllm.LLM`, through vLLM's own parser."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    engine_args = EngineArgs.from_cli_args(parser.parse_args(list(args)))
    defaults = EngineArgs(model=engine_args.model)
    return {name: value for name, value in vars(engine_args).items()
            if value != getattr(defaults, name, object()) or name == "model"}


def sampling_params(params: SamplingParams, request: GenerationRequest):
    from vllm import SamplingParams as VllmSamplingParams

    return VllmSamplingParams(
        n=1, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
        stop_token_ids=list(params.stop_token_ids), seed=request.seed, logprobs=0,
        detokenize=False, skip_special_tokens=False)


def to_generation(completion, want_routes: bool) -> Generation:
    """A vLLM CompletionOutput -> vime's Generation (sampled tokens, their log-probs, routes)."""
    tokens = list(completion.token_ids)
    if completion.logprobs is None:
        raise ValueError("vLLM returned no log-probs: SamplingParams(logprobs=0) was not honoured")
    log_probs = [float(completion.logprobs[i][token].logprob) for i, token in enumerate(tokens)]
    routes = None
    if want_routes:
        if completion.routed_experts is None:
            raise ValueError("routed experts asked for but not returned: the engine needs "
                             "--enable-return-routed-experts")
        routes = np.asarray(completion.routed_experts).astype(np.int32)
    finish = "length" if completion.finish_reason == "length" else "stop"
    return Generation(token_ids=tokens, log_probs=log_probs, finish_reason=finish,
                      routed_experts=routes)


def _load_bucket(worker, tensors: dict) -> int:
    """Runs inside each vLLM worker (collective_rpc): HF-named tensors into the model."""
    model = worker.model_runner.model
    loaded = model.load_weights(weights=list(tensors.items()))
    return len(loaded) if loaded is not None else len(tensors)


class VllmRolloutBackend(RolloutBackend):
    def __init__(self):
        self.llm = None
        self.version = 0
        self.asleep = False

    def start(self, slice: EngineSlice) -> None:
        from vllm import LLM

        self.slice = slice
        kwargs = engine_kwargs(slice.args)
        if kwargs.get("enable_return_routed_experts"):
            os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
        self.llm = LLM(**kwargs)

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        if self.asleep:
            raise RuntimeError("generate() while the engine sleeps: wake() first")
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        outputs = self.llm.generate(prompts, [sampling_params(params, r) for r in requests],
                                    use_tqdm=False)
        return [to_generation(out.outputs[0], params.return_routed_experts) for out in outputs]

    def update_weights(self, bucket: WeightBucket) -> None:
        if bucket.tensors:
            self.llm.collective_rpc(_load_bucket, args=(bucket.tensors,))
        if bucket.last:
            self.version = bucket.version

    def weight_version(self) -> int:
        return self.version

    def sleep(self, level: int = 1) -> None:
        self.llm.sleep(level=level)
        self.asleep = True

    def wake(self, tags: Sequence[str] = ("weights", "kv_cache")) -> None:
        self.llm.wake_up(tags=list(tags))
        self.asleep = False

    def stop(self) -> None:
        self.llm = None

