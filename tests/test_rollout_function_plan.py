"""A rollout function's samples are max_prompt_len + max_total_tokens long: the plan sizes the
engines' context, the KV cache's sequences and the actor's micro-batches by that, and the
emitted vLLM and Megatron arguments say so."""

from __future__ import annotations

from specsupport import ROOT, run_spec

from vime import render
from vime.emit import megatron, vllm

SPEC = ROOT / "specs" / "qwen3_30b.toml"
FUNCTION = ('rollout.function="runtime.toy_tools:rollout"', "rollout.max_total_tokens=20000")


def _flag(lines: list[list[str]], name: str) -> str:
    return next(line[1] for line in lines if line[0] == name)


def test_the_longest_multi_turn_sample_sizes_the_plan():
    single, multi = run_spec(SPEC), run_spec(SPEC, FUNCTION)
    assert single.ok and multi.ok, [(d.code, d.message) for d in multi.diagnostics]
    prompt = multi.spec.rollout.max_prompt_len
    assert single.spec.max_model_len == prompt + single.spec.rollout.max_response_len
    assert multi.spec.max_model_len == prompt + 20000
    assert multi.plan.memory.rollout.max_len == prompt + 20000
    # fewer of the longer sequences fit in the same KV cache
    assert multi.plan.memory.rollout.sequences_at_once < single.plan.memory.rollout.sequences_at_once
    assert _flag(vllm.vllm_args(multi.plan), "--max-model-len") == str(prompt + 20000)
    assert _flag(megatron.megatron_args(multi.plan), "--seq-length") == str(prompt + 20000)



def test_vime_plan_names_the_function_and_its_limits():
    text = render.plan_text(run_spec(ROOT / "specs" / "tiny_cpu_tools.toml").plan)
    assert ("  rollout function runtime.toy_tools:rollout: ≤ 2 turns of ≤ 6 tokens, ≤ 18 "
            "tokens after\n    the prompt (engines' max_model_len 32 + 18 = 50)") in text
