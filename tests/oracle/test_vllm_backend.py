"""The vLLM rollout backend's conversions, on vLLM 0.33's real objects (CPU; no engine runs).

Set up and run like test_vllm.py (`make oracle-vllm`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

vllm_platforms = pytest.importorskip("vllm.platforms")
from vllm.platforms.cpu import CpuPlatform  # noqa: E402

vllm_platforms._current_platform = CpuPlatform()

from vllm import SamplingParams as VllmSamplingParams  # noqa: E402
from vllm.logprobs import Logprob  # noqa: E402
from vllm.outputs import CompletionOutput  # noqa: E402

from runtime.backends.vllm_rollout import engine_kwargs, sampling_params, to_generation  # noqa: E402
from runtime.interfaces import GenerationRequest, SamplingParams  # noqa: E402
from runtime.routing import ReplayLayout, local_routes  # noqa: E402
from vime import pipeline  # noqa: E402
from vime.emit.vllm import vllm_args  # noqa: E402
from vime.parse import Source  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def compiled_args(name: str) -> list[str]:
    spec = ROOT / "specs" / f"{name}.toml"
    result = pipeline.run(Source(str(spec), spec.read_text()), [], spec.parent)
    return [token for group in vllm_args(result.plan) for token in group]


def test_engine_kwargs_are_vllms_engine_arguments_of_the_plan():
    kwargs = engine_kwargs(compiled_args("qwen3_30b_24gpu_eplb"))
    assert kwargs["model"] == "/shared/models/Qwen3-30B-A3B"
    assert (kwargs["tensor_parallel_size"], kwargs["data_parallel_size"]) == (8, 3)
    assert kwargs["enable_expert_parallel"] and kwargs["enable_eplb"]
    assert kwargs["eplb_config"].num_redundant_experts == 16
    assert kwargs["enable_return_routed_experts"] and kwargs["enable_sleep_mode"]
    assert kwargs["logprobs_mode"] == "processed_logprobs"
    assert kwargs["distributed_executor_backend"] == "ray"


def test_sampling_params_are_vllms():
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=64,
                            stop_token_ids=(151645,), return_routed_experts=True)
    out = sampling_params(params, GenerationRequest(prompt_ids=(1, 2, 3), seed=42))
    assert isinstance(out, VllmSamplingParams)
    assert (out.temperature, out.top_p, out.max_tokens, out.seed, out.logprobs, out.n) == (
        0.7, 0.9, 64, 42, 0, 1)
    assert out.stop_token_ids == [151645]


def _completion(routes=True, logprobs=True, finish="stop"):
    tokens = [11, 12, 13]
    return CompletionOutput(
        index=0, text="", token_ids=tokens, cumulative_logprob=-1.5,
        logprobs=[{t: Logprob(logprob=-0.5 * (i + 1), rank=1)} for i, t in enumerate(tokens)]
        if logprobs else None,
        routed_experts=np.arange(6 * 2 * 4, dtype=np.uint8).reshape(6, 2, 4) if routes else None,
        finish_reason=finish)


def test_completion_becomes_a_generation_with_routes_the_actor_can_replay():
    gen = to_generation(_completion(finish="length"), want_routes=True)
    assert gen.token_ids == [11, 12, 13] and gen.finish_reason == "length"
    assert gen.log_probs == [-0.5, -1.0, -1.5]
    assert gen.routed_experts.dtype == np.int32 and gen.routed_experts.shape == (6, 2, 4)
    # prompt of 4 + 3 response tokens = 7 tokens; vLLM routed the first 6
    routes = local_routes([gen.routed_experts], [7], moe_layers=2, layout=ReplayLayout())
    assert routes.shape == (7, 2, 4) and np.array_equal(routes[:6], gen.routed_experts)


def test_missing_pieces_are_errors_not_silent_zeros():
    with pytest.raises(ValueError, match="no log-probs"):
        to_generation(_completion(logprobs=False), want_routes=False)
    with pytest.raises(ValueError, match="enable-return-routed-experts"):
        to_generation(_completion(routes=False), want_routes=True)
    assert to_generation(_completion(routes=False), want_routes=False).routed_experts is None
