"""Prompt data: JSONL keys, chat templates, length filtering, the seeded order and its state;
the toy tokenizer."""

from __future__ import annotations

import json

import pytest

from runtime import toy
from runtime.core.slices import DataConfig
from runtime.rl.data import PromptSampler, read_prompts


@pytest.fixture
def tokenizer():
    return toy.build_tokenizer(["What is 3 + 4?", "Compute 12 - 5.", "7"])


def _data(tmp_path, rows, **overrides) -> DataConfig:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    values = dict(prompt_data=path, input_key="question", label_key="answer",
                  apply_chat_template=True, shuffle=True, max_prompt_len=64, seed=3)
    values.update(overrides)
    return DataConfig(**values)


def test_chat_template_for_strings_and_message_lists(tmp_path, tokenizer):
    rows = [{"question": "What is 3 + 4?", "answer": "7"},
            {"question": [{"role": "user", "content": "Compute 12 - 5."}], "answer": 7}]
    prompts, dropped = read_prompts(_data(tmp_path, rows), tokenizer)
    assert dropped == 0 and [p.label for p in prompts] == ["7", 7]
    assert prompts[0].text == "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.convert_ids_to_tokens(list(prompts[1].token_ids)) == [
        "<|im_start|>", "user", "Compute", "1", "2", "-", "5", ".", "<|im_end|>",
        "<|im_start|>", "assistant"]


def test_without_chat_template_a_string_is_used_as_written(tmp_path, tokenizer):
    rows = [{"question": "What is 3 + 4?", "answer": "7"}]
    prompts, _ = read_prompts(_data(tmp_path, rows, apply_chat_template=False), tokenizer)
    assert prompts[0].text == "What is 3 + 4?" and len(prompts[0].token_ids) == 6
    rows = [{"question": [{"role": "user", "content": "hi"}], "answer": "7"}]
    with pytest.raises(ValueError, match="needs data.apply_chat_template"):
        read_prompts(_data(tmp_path, rows, apply_chat_template=False), tokenizer)


def test_long_prompts_are_dropped_and_counted(tmp_path, tokenizer):
    rows = [{"question": "What is 3 + 4?", "answer": "7"},
            {"question": "What is 3 + 4? " * 10, "answer": "7"}]
    prompts, dropped = read_prompts(_data(tmp_path, rows, max_prompt_len=20), tokenizer)
    assert len(prompts) == 1 and dropped == 1 and prompts[0].index == 0
    with pytest.raises(ValueError, match="no prompt of at most"):
        read_prompts(_data(tmp_path, rows, max_prompt_len=3), tokenizer)


def test_missing_keys_name_the_line(tmp_path, tokenizer):
    rows = [{"question": "What is 3 + 4?", "answer": "7"}, {"prompt": "x", "answer": "7"}]
    with pytest.raises(ValueError, match=r"prompts.jsonl:2: no key 'question'"):
        read_prompts(_data(tmp_path, rows), tokenizer)


def test_sampler_visits_every_prompt_each_epoch_in_a_seeded_order(tmp_path, tokenizer):
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(5)]
    prompts, _ = read_prompts(_data(tmp_path, rows), tokenizer)
    sampler = PromptSampler(prompts, seed=3, shuffle=True)
    first = [p.index for p in sampler.next_batch(5)]
    second = [p.index for p in sampler.next_batch(5)]
    assert sorted(first) == sorted(second) == list(range(5))
    assert first != second  # a new permutation per epoch
    assert first == [p.index for p in PromptSampler(prompts, 3, True).next_batch(5)]
    assert [p.index for p in PromptSampler(prompts, 3, False).next_batch(7)] == [0, 1, 2, 3, 4, 0, 1]


def test_sampler_state_resumes_the_same_sequence(tmp_path, tokenizer):
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(5)]
    prompts, _ = read_prompts(_data(tmp_path, rows), tokenizer)
    straight = PromptSampler(prompts, 9, True)
    expected = [[p.index for p in straight.next_batch(3)] for _ in range(6)]
    stopped = PromptSampler(prompts, 9, True)
    got = [[p.index for p in stopped.next_batch(3)] for _ in range(2)]
    state = json.loads(json.dumps(stopped.state_dict()))  # as a checkpoint stores it
    resumed = PromptSampler(prompts, 9, True)
    resumed.load_state_dict(state)
    got += [[p.index for p in resumed.next_batch(3)] for _ in range(4)]
    assert got == expected
    with pytest.raises(ValueError, match="taken with 5 prompts"):
        PromptSampler(prompts[:4], 9, True).load_state_dict(state)


def test_toy_tokenizer_splits_answers_into_format_tokens(tokenizer):
    ids = tokenizer("\\boxed{12} Answer: 7", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["\\boxed{", "1", "2", "}", "Answer", ":", "7"]
    assert tokenizer.decode(ids) == "\\boxed{ 1 2 } Answer : 7"
    assert tokenizer.convert_ids_to_tokens(tokenizer("zebra")["input_ids"]) == ["<unk>"]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id == 0
    # the same texts give the same ids (the vocabulary is sorted)
    again = toy.build_tokenizer(["7", "Compute 12 - 5.", "What is 3 + 4?"])
    assert again.get_vocab() == tokenizer.get_vocab()


def test_no_two_requests_of_a_run_share_a_seed():
    # a rollout of more than 100,003 samples, and an evaluation's indices from 2**40 (runtime/
    # rl/evaluation.py), beside the next rollouts' samples
    from runtime.rl.data import request_seed
    from runtime.rl.evaluation import EVAL_SAMPLE_BASE

    samples = [*range(99_990, 100_020), *range(200_000, 200_010), EVAL_SAMPLE_BASE,
               EVAL_SAMPLE_BASE + 1]
    seeds = [request_seed(7, rollout, sample) for rollout in range(4) for sample in samples]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= seed < 1 << 62 for seed in seeds)
    # a resumed run draws what the first one drew
    assert seeds == [request_seed(7, rollout, sample) for rollout in range(4) for sample in samples]
