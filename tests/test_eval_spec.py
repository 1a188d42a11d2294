"""[eval] and the dynamic-sampling keys in the compiler: inherited defaults, the engines'
context (V506, V802 and --max-model-len see the evaluation's responses) and `vime plan`."""

from __future__ import annotations

from specsupport import ROOT

from vime import pipeline
from vime.parse import Source

EVAL_SPEC = ROOT / "specs" / "qwen3_30b_eval.toml"
SEED = ROOT / "specs" / "qwen3_30b.toml"


def _run(spec, *sets: str):
    return pipeline.run(Source(str(spec), spec.read_text()), list(sets), spec_dir=spec.parent)


def test_a_dataset_inherits_what_it_leaves_out_from_the_rollout_and_the_data():
    result = _run(SEED, 'eval.datasets=[{name = "aime", prompt_data = "aime.jsonl", '
                  'temperature = 0.6}]', "rollout.temperature=0.9")
    (dataset,) = result.spec.eval.datasets
    assert (dataset.temperature, dataset.top_p, dataset.max_response_len) == (0.6, 1.0, 8192)
    assert (dataset.input_key, dataset.reward, dataset.n_samples_per_prompt) == \
        ("prompt", "deepscaler", 1)
    assert result.spec.origin("eval.datasets[0].max_response_len").detail == \
        "rollout.max_response_len"
    assert result.spec.max_model_len == 1024 + 8192


def test_the_engines_context_holds_the_longest_eval_response():
    result = _run(EVAL_SPEC)
    assert result.ok and result.spec.max_model_len == 1024 + 16384
    assert result.plan.memory.rollout.max_len == 17408
    # beyond the model's 40960 positions: V506 points at the dataset's key
    found = [d for d in _run(EVAL_SPEC, 'eval.datasets=[{name = "aime", prompt_data = "a.jsonl", '
                                        'max_response_len = 40000}]').diagnostics
             if d.code == "V506"]
    assert [d.key for d in found] == ["eval.datasets[0].max_response_len"]
    assert "32 + " not in found[0].message and "1024 + 40000 = 41024" in found[0].message


def test_the_kv_cache_must_hold_one_evaluation_sequence():
    # 0.153 of the GPU leaves ~13k KV tokens: a rollout sequence (9216) fits, an eval one
    # (17408) does not
    with_eval = _run(EVAL_SPEC, "inference.gpu_memory_utilization=0.153")
    without = _run(EVAL_SPEC, "inference.gpu_memory_utilization=0.153", "eval.datasets=[]")
    assert "V802" not in {d.code for d in without.diagnostics}
    (v802,) = [d for d in with_eval.diagnostics if d.code == "V802"]
    assert "an eval dataset's max_response_len = 17408" in v802.message


def test_plan_shows_the_eval_batch_and_dynamic_sampling(capsys):
    from vime import cli

    assert cli.main(["plan", str(EVAL_SPEC), "--set", "rollout.dynamic_sampling=true",
                     "--set", "rollout.over_sampling_batch_size=8"]) == 0
    out = capsys.readouterr().out
    assert "eval (every 20 rollouts, at start, at end); engines' max_model_len 17408" in out
    assert "16 samples per prompt, ≤ 16384 tokens, temperature 1, top-p 1; pass@1,2,4,8,16" in out
    assert "refilled by 8 prompts per attempt, at most 4 attempts per rollout" in out


def test_progress_lines_show_each_eval_and_the_final_weights_apart(tmp_path):
    from vime.launch.progress import Progress, rollout_line

    evaluated = {"eval/aime/acc": 0.25, "eval/aime/pass@1": 0.25, "eval/aime/pass@16": 0.5,
                 "eval/math/acc": 0.5}
    line = rollout_line({"rollout": 20, "reward/mean": 0.4, "throughput/generate_tokens_per_s": 9,
                         "time/generate": 1.5, **evaluated}, 40, None)
    # after the phases: a line's words keep their order with or without an evaluation
    assert "reward 0.400 | 9 tok/s | gen 1.50 s | eval aime acc 0.25 pass@16 0.50 | eval math " \
        "acc 0.50 | ETA" in line
    assert rollout_line({"rollout": 40, **evaluated}, 40, None) == \
        "final weights | eval aime acc 0.25 pass@16 0.50 | eval math acc 0.50"
    progress = Progress(tmp_path, 2, quiet=True, started=0.0)
    progress.records = [{"rollout": 0, "reward/mean": 0.1}, {"rollout": 1, "reward/mean": 0.3},
                        {"rollout": 2, **evaluated}]
    assert "rollouts 0 to 1 of 2" in progress.summary(until=60.0)
    assert "reward 0.100 -> 0.300" in progress.summary(until=60.0)
