"""Held-out failure kinds (tests/fixtures/foresight/): `vime plan` of each spec reports the
kind's code at its key, and the rule's explanation cites the public report the kind comes
from. Beside each rule, correct but unusual specs that must stay clean of it."""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest
from specsupport import ROOT, run_spec

from vime import check, cli
from vime.check.quantization import card_capability, quantization

FORESIGHT = ROOT / "tests" / "fixtures" / "foresight"
CASES = tomllib.loads((FORESIGHT / "cases.toml").read_text())
CONCISE = re.compile(r"^\S+:\d+:\d+: (?P<severity>error|warning)\[(?P<code>V\d+)\] (?P<key>\S+):")


def plan_concise(spec: Path, capsys, *sets: str) -> list[tuple[str, str, str]]:
    """(severity, code, key) of each diagnostic `vime plan --format concise` prints."""
    argv = ["plan", str(spec), "--format", "concise"]
    for item in sets:
        argv += ["--set", item]
    cli.main(argv)
    out = capsys.readouterr()
    return [(m["severity"], m["code"], m["key"]) for line in (out.out + out.err).splitlines()
            if (m := CONCISE.match(line))]


@pytest.mark.parametrize("name", sorted(CASES))
def test_held_out_kind_is_caught_before_the_queue(name, capsys):
    case = CASES[name]
    found = plan_concise(FORESIGHT / name / "spec.toml", capsys)
    assert (case["severity"], case["code"], case["key"]) in found, found
    # no other error (but those the case lists as `also`): the spec is otherwise one that runs
    assert {c for s, c, _ in found if s == "error"} <= {case["code"], *case.get("also", [])}, found
    assert case["url"] in check.explain(case["code"]), "the rule cites the report"


def test_every_case_folder_is_listed():
    folders = {p.name for p in FORESIGHT.iterdir() if p.is_dir()}
    assert folders == set(CASES)


def _copy(name: str, tmp_path: Path) -> Path:
    """A case's folder in tmp_path, to change one file of it."""
    target = tmp_path / name
    shutil.copytree(FORESIGHT / name, target)
    return target


def _codes(spec: Path, *sets: str) -> set[str]:
    result = run_spec(spec, sets)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics if d.severity == "error"]
    return {d.code for d in result.diagnostics}


def _with_config(folder: Path, **patch) -> None:
    config = json.loads((folder / "model" / "config.json").read_text())
    (folder / "model" / "config.json").write_text(json.dumps({**config, **patch}))


# ---------------------------------------------------------------- V120-V122: quantization

def test_quantization_read_from_config_json():
    assert quantization({"quantization_config": {"quant_method": "fp8",
                                                 "weight_block_size": [128, 128]}}).fp8_weights
    awq = quantization({"quantization_config": {"quant_method": "awq", "bits": 4}})
    assert awq.detail == "AWQ 4-bit" and not awq.fp8_weights
    w4 = quantization({"quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}}})
    assert w4.detail == "compressed-tensors (int4 weights)" and not w4.fp8_weights
    fp8_ct = quantization({"quantization_config": {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}})
    assert fp8_ct.fp8_weights
    for plain in ({}, {"quantization_config": None}, {"quantization_config": {}},
                  {"quantization_config": {"quant_method": ""}}):
        assert quantization(plain) is None


def test_quantized_names_the_bf16_release(tmp_path):
    folder = _copy("fp8-checkpoint-as-actor-start", tmp_path)
    (folder / "model").rename(folder / "Qwen3-30B-A3B-FP8")
    result = run_spec(folder / "spec.toml", ['model.hf_checkpoint="Qwen3-30B-A3B-FP8"'])
    (diag,) = [d for d in result.diagnostics if d.code == "V120"]
    assert "(Qwen3-30B-A3B for Qwen3-30B-A3B-FP8)" in diag.help
    assert "without their scales" in diag.message and result.plan is None


@pytest.mark.parametrize("quantization_config", [None, {}])
def test_config_json_without_a_method_is_bf16(tmp_path, quantization_config):
    folder = _copy("fp8-checkpoint-as-actor-start", tmp_path)
    _with_config(folder, quantization_config=quantization_config)
    assert not {"V120", "V121"} & _codes(folder / "spec.toml")


def test_fp8_kv_cache_on_bf16_weights_is_clean():
    """--kv-cache-dtype=fp8 quantizes the cache, not the weights the push updates."""
    spec = FORESIGHT / "moe-backend-for-fp8-experts" / "spec.toml"
    assert not {"V120", "V121", "V122"} & _codes(spec, 'inference.moe_backend="triton"',
                                                 'inference.extra_args=["--kv-cache-dtype=fp8"]')


@pytest.mark.parametrize("backend, gpu", [("flashinfer_cutlass", "H100"),
                                          ("flashinfer_cutlass", "B200"),
                                          ("flashinfer_trtllm", "B200"),
                                          ("batched_triton", "A100-80GB"),
                                          ("auto", "H200")])
def test_moe_backends_that_run_on_the_card_are_clean(backend, gpu):
    spec = FORESIGHT / "moe-backend-for-fp8-experts" / "spec.toml"
    assert "V122" not in {d.code for d in run_spec(
        spec, [f'inference.moe_backend="{backend}"', f'cluster.gpu="{gpu}"']).diagnostics}


def test_moe_backend_on_an_unknown_card_is_not_judged():
    spec = FORESIGHT / "moe-backend-blackwell-only-on-h100" / "spec.toml"
    result = run_spec(spec, ['cluster.gpu="MI300X"', "cluster.gpu_memory_gib=192"])
    assert "V122" not in {d.code for d in result.diagnostics}


# ---------------------------------------------------------------- V734-V736: the files

def test_metadata_keys_every_record_has_are_clean(tmp_path):
    folder = _copy("metadata-key-not-in-records", tmp_path)
    rows = [dict(json.loads(line), extra_info={"level": 1})
            for line in (folder / "prompts.jsonl").read_text().splitlines()]
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "V734" not in _codes(folder / "spec.toml")


def test_metadata_key_missing_from_a_later_record_names_its_line(tmp_path):
    folder = _copy("metadata-key-not-in-records", tmp_path)
    rows = [json.loads(line) for line in (folder / "prompts.jsonl").read_text().splitlines()]
    rows = [dict(r, extra_info={}) for r in rows[:3]] + rows[3:]
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_spec(folder / "spec.toml")
    (diag,) = [d for d in result.diagnostics if d.code == "V734"]
    assert "prompts.jsonl:4" in diag.message and "prompt, label" in diag.help


def test_chat_template_in_its_own_file_is_found(tmp_path):
    """transformers 5 saves the template as chat_template.jinja beside tokenizer_config.json."""
    folder = _copy("base-model-without-chat-template", tmp_path)
    (folder / "model" / "chat_template.jinja").write_text("{{ messages[0].content }}")
    assert "V735" not in _codes(folder / "spec.toml")


def test_base_model_without_template_and_without_chat_template_is_clean():
    spec = FORESIGHT / "base-model-without-chat-template" / "spec.toml"
    assert "V735" not in _codes(spec, "data.apply_chat_template=false")


def test_some_empty_labels_warn_with_the_share(tmp_path):
    folder = _copy("labels-all-null", tmp_path)
    rows = [json.loads(line) for line in (folder / "prompts.jsonl").read_text().splitlines()]
    rows[0]["label"], rows[2]["label"] = "7", "15"
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_spec(folder / "spec.toml")
    (diag,) = [d for d in result.diagnostics if d.code == "V736"]
    assert diag.severity == "warning" and "2 of the first 4 records" in diag.message
    assert result.ok


def test_custom_reward_without_labels_is_clean(tmp_path):
    """A reward of one's own (here a server) may score without labels."""
    spec = FORESIGHT / "labels-all-null" / "spec.toml"
    assert "V736" not in _codes(spec, 'rollout.reward="http://rewards.internal:8000/score"')


# ---------------------------------------------------------------- V441, V442, V518, V525, V710

@pytest.mark.parametrize("edit", [
    ("n_samples_per_prompt = 8", "n_samples_per_prompt = 1"),  # greedy pass@1
    ("temperature = 0.0", "temperature = 0.6"),  # pass@8 over sampled responses
])
def test_evaluations_that_measure_are_clean(edit, tmp_path):
    folder = _copy("greedy-eval-pass-at-k", tmp_path)
    spec = folder / "spec.toml"
    assert edit[0] in spec.read_text()
    spec.write_text(spec.read_text().replace(*edit))
    assert "V525" not in _codes(spec)


@pytest.mark.parametrize("sets", [
    ["checkpoint.save_interval=300"],
    ["rollout.num_rollout=40", "checkpoint.save_interval=1000"],  # a short run: one checkpoint
])
def test_checkpoint_cadences_that_keep_a_resume_point_are_clean(sets):
    assert "V441" not in _codes(FORESIGHT / "checkpoint-only-at-end" / "spec.toml", *sets)


@pytest.mark.parametrize("sets", [
    ["checkpoint.save_interval=20"],  # its first save by half the limit
    ["rollout.num_rollout=30"],  # a run that ends, and saves, inside one job
    ['cluster.slurm.time="5-00:00:00"'],  # a partition of long jobs
    ['cluster.gpu="MI300X"'],  # no forecast for a card vime does not know: nothing said
])
def test_first_saves_before_the_time_limit_are_clean(sets):
    spec = FORESIGHT / "first-save-after-time-limit" / "spec.toml"
    assert "V443" not in _codes(spec, *sets)


def test_first_save_after_the_limit_names_the_numbers_and_the_largest_interval():
    spec = FORESIGHT / "first-save-after-time-limit" / "spec.toml"
    (found,) = [d for d in run_spec(spec).diagnostics if d.code == "V443"]
    assert "200 rollouts" in found.message and "'04:00:00' (4.0 h)" in found.message
    # 353 s a rollout: 20 rollouts are 2.0 h, half the 4-hour limit; 21 are past it
    assert found.help.startswith("save_interval = 20 ")
    # the conservative reading: a quarter of the forecast's 19.6 h (4.9 h) past the limit
    assert "V443" not in _codes(spec, 'cluster.slurm.time="05:00:00"')
    assert "V443" in _codes(spec, 'cluster.slurm.time="04:50:00"')


@pytest.mark.parametrize("sets", [["checkpoint.on_corrupt=\"stop\""], ["checkpoint.keep_last=2"]])
def test_keep_last_with_a_fallback_is_clean(sets):
    assert "V442" not in _codes(FORESIGHT / "keep-last-one-fallback-previous" / "spec.toml", *sets)


@pytest.mark.parametrize("config", [
    '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}',
    '{"method": "suffix", "num_speculative_tokens": 8}',
])
def test_speculation_without_draft_weights_is_clean(config):
    spec = FORESIGHT / "speculative-mtp-draft" / "spec.toml"
    assert "V518" not in _codes(spec, f"inference.extra_args=['--speculative-config={config}']")


def test_eagle_draft_model_is_reported():
    spec = FORESIGHT / "speculative-mtp-draft" / "spec.toml"
    config = '{"method": "eagle3", "model": "/shared/eagle3-qwen3-30b", "num_speculative_tokens": 3}'
    assert "V518" in _codes(spec, f"inference.extra_args=['--speculative-config={config}']")


@pytest.mark.parametrize("sets", [
    ['rollout.reward="http://rewards.cluster.internal:8000/score"'],
    ['rollout.reward="http://10.0.3.17:8000/score"'],
])
def test_reward_servers_the_nodes_reach_are_clean(sets):
    spec = FORESIGHT / "reward-server-localhost-two-nodes" / "spec.toml"
    assert "V710" not in _codes(spec, *sets)


def test_loopback_reward_in_a_one_node_job_is_clean():
    """`vime submit --local` and a one-node job may run the server beside the driver."""
    spec = ROOT / "specs" / "qwen3_30b.toml"
    assert "V710" not in _codes(spec, 'rollout.reward="http://localhost:8000/score"')


# ---------------------------------------------------------------- V312: the router's settings

DSV3 = ROOT / "specs" / "tiny_h200_dsv3.toml"
ROUTERS = {  # [model.arch] overrides of tiny_h200_dsv3 (8 experts, top 2, n_group 2, topk_group 1)
    "softmax scores with the expert bias": (['model.arch.scoring_func="softmax"'], True),
    "3 groups of 8 experts": (["model.arch.n_group=3"], True),
    "4 of 2 groups": (["model.arch.num_experts_per_tok=8", "model.arch.topk_group=4"], True),
    "softmax without the bias": (['model.arch.scoring_func="softmax"',
                                  'model.arch.topk_method="greedy"'], False),
    "4 groups of 2 experts": (["model.arch.n_group=4"], False),
    "the spec as written": ([], False),
}


@pytest.mark.parametrize("name", ROUTERS)
def test_router_settings_as_megatron_core_judges_them(name):
    """The oracle: megatron-core's TransformerConfig, built by the Megatron backend's own
    transformer_config from the planned architecture, refuses exactly what V312 reports."""
    from runtime.megatron.model import transformer_config

    sets, refused = ROUTERS[name]
    result = run_spec(DSV3, sets)
    assert ("V312" in {d.code for d in result.diagnostics}) is refused
    if refused:
        with pytest.raises((ValueError, AssertionError)):
            transformer_config(result.spec.arch)
    else:
        transformer_config(result.spec.arch)


# ---------------------------------------------------------------- V737: prompt lengths

# the pre-tokenizer regexes of Qwen2/Qwen3's and DeepSeek-V3's tokenizer.json
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_SPLITS = (r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
                   r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?"""
                   r"""[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def _bpe(splits: tuple[str, ...], corpus: list[str]):
    """A byte-level BPE of 20,000 tokens with these pre-tokenizer splits, trained on corpus
    (the tokenizers library the runtime's transformers tokenizers run on)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=20000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return tokenizer


def test_fewest_tokens_is_a_lower_bound_of_byte_level_bpe():
    """Trained on the very text it then encodes (its merges at their most effective), neither
    tokenizer makes fewer tokens than the bound, on the docs' lines and on random strings of
    marks, CJK, digits and punctuation."""
    import random

    from vime.check.data_files import fewest_tokens

    corpus = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))]
    tokenizers = [_bpe((QWEN_SPLIT,), corpus * 3), _bpe(DEEPSEEK_SPLITS, corpus * 3)]
    lines = [line for text in corpus for line in text.splitlines()]
    pick = random.Random(47)
    alphabet = "abcXYZ 0123456789_-'\n\t.,;é\u0301汉字नमस्ते²½<|>ｆ"
    texts = lines + ["e\u0301te\u0301", "don't", "x=1234567; foo_bar(baz)", "<|im_start|>u<|im_end|>"]
    texts += ["".join(pick.choice(alphabet) for _ in range(pick.randint(1, 60)))
              for _ in range(2000)]
    for tokenizer in tokenizers:
        below = [t for t in texts if len(tokenizer.encode(t).ids) < fewest_tokens(t)]
        assert not below, below[:3]
    assert sum(fewest_tokens(line) for line in lines) > 50_000  # the docs are not trivial


def _prompts(folder: Path, prompts: list) -> None:
    (folder / "prompts.jsonl").write_text("".join(
        json.dumps({"prompt": p, "label": "7"}) + "\n" for p in prompts))


def test_prompts_within_max_prompt_len_are_clean(tmp_path):
    folder = _copy("prompts-longer-than-max-prompt-len", tmp_path)
    _prompts(folder, ["What is 3 + 4?", [{"role": "user", "content": "Add 3 and 4."}]])
    assert "V737" not in _codes(folder / "spec.toml")


def test_some_overlong_prompts_warn_with_the_share(tmp_path):
    folder = _copy("prompts-longer-than-max-prompt-len", tmp_path)
    _prompts(folder, ["What is 3 + 4?", "word " * 40, "What is 5 + 6?"])
    result = run_spec(folder / "spec.toml")
    (diag,) = [d for d in result.diagnostics if d.code == "V737"]
    assert diag.severity == "warning" and "1 of the 3 records" in diag.message
    assert "at least 40 at" in diag.message and result.ok


def test_a_file_longer_than_the_sample_is_a_warning_even_when_all_are_over(tmp_path):
    """Only the first 20 records are read: later ones may fit, and the driver would train."""
    folder = _copy("prompts-longer-than-max-prompt-len", tmp_path)
    _prompts(folder, ["word " * 12] * 25)
    result = run_spec(folder / "spec.toml")
    (diag,) = [d for d in result.diagnostics if d.code == "V737"]
    assert diag.severity == "warning" and "20 of the first 20 records" in diag.message


# ---------------------------------------------------------------- V526: evaluations that never run

@pytest.mark.parametrize("edit", [
    ("at_end = false", "at_end = true"),  # the final weights only
    ("interval = 5000", "interval = 500"),
])
def test_evaluations_that_come_due_are_clean(edit, tmp_path):
    folder = _copy("evaluation-never-runs", tmp_path)
    spec = folder / "spec.toml"
    assert edit[0] in spec.read_text()
    spec.write_text(spec.read_text().replace(*edit, 1))
    assert "V526" not in _codes(spec)


def test_no_interval_and_no_end_points_at_at_end(tmp_path):
    folder = _copy("evaluation-never-runs", tmp_path)
    spec = folder / "spec.toml"
    spec.write_text(spec.read_text().replace("interval = 5000\n", "", 1))
    (diag,) = [d for d in run_spec(spec).diagnostics if d.code == "V526"]
    assert diag.key == "eval.at_end" and "no eval.interval" in diag.message


# ---------------------------------------------------------------- V123: positions

CONTEXT = "context-past-trained-positions"


def test_a_longer_rotary_table_within_the_trained_context_is_clean():
    """[model.arch] max_position_embeddings above config.json's only sizes Megatron's table."""
    spec = FORESIGHT / CONTEXT / "spec.toml"
    assert "V123" not in _codes(spec, "rollout.max_response_len=32768")


def test_allowing_long_max_model_len_is_a_warning_about_the_positions():
    spec = FORESIGHT / CONTEXT / "spec.toml"
    result = run_spec(spec, ['cluster.env.VLLM_ALLOW_LONG_MAX_MODEL_LEN="1"'])
    (diag,) = [d for d in result.diagnostics if d.code == "V123"]
    assert diag.severity == "warning" and "not trained on" in diag.message and result.ok


def test_a_scaled_rotary_embedding_is_not_judged_here(tmp_path):
    folder = _copy(CONTEXT, tmp_path)
    _with_config(folder, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                       "original_max_position_embeddings": 40960})
    assert "V123" not in {d.code for d in run_spec(folder / "spec.toml").diagnostics}


def test_nested_label_names_the_answer_inside_it():
    result = run_spec(FORESIGHT / "label-nested-verl-format" / "spec.toml")
    (diag,) = [d for d in result.diagnostics if d.code == "V736"]
    assert "a JSON object or list, not an answer" in diag.message
    assert "reward_model.ground_truth" in diag.help and "jq" in diag.help


def test_numeric_labels_are_clean(tmp_path):
    folder = _copy("labels-all-null", tmp_path)
    rows = [json.loads(line) for line in (folder / "prompts.jsonl").read_text().splitlines()]
    (folder / "prompts.jsonl").write_text("".join(
        json.dumps(dict(r, label=i * 7)) + "\n" for i, r in enumerate(rows)))
    assert "V736" not in _codes(folder / "spec.toml")


def test_a_resumed_actor_reads_its_checkpoint_and_v121_judges_the_engines(tmp_path):
    """A run checkpoint to resume from is what the actor loads; the engines still load the
    quantized folder, into which the resumed actor pushes bf16."""
    checkpoint = tmp_path / "runs" / "qwen3-30b-a3b-grpo" / "checkpoints" / "rollout_000009"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text('{"format": 1, "rollout": 9, "next_rollout": 10}')
    (checkpoint / "vime_checkpoint.json").write_text('{"record": 1}')
    result = run_spec(FORESIGHT / "fp8-checkpoint-as-actor-start" / "spec.toml",
                      [f'experiment.output_dir="{tmp_path / "runs"}"'])
    assert result.spec.resume_checkpoint is not None
    found = {d.code for d in result.diagnostics}
    assert "V121" in found and "V120" not in found


# ---------------------------------------------------------------- V126: FP8 on the card

@pytest.mark.parametrize(("written", "known"), [
    ("A100-80GB", ("A100-80GB", 80)), ("NVIDIA A100-SXM4-80GB", ("A100-80GB", 80)),
    ("A10", ("A10", 86)), ("NVIDIA A10G", ("A10G", 86)), ("Tesla T4", ("T4", 75)),
    ("Tesla V100-SXM2-32GB", ("V100", 70)), ("L40S", ("L40S", 89)), ("H200", ("H200", 90)),
    ("MI300X", None),
])
def test_card_capability_as_cluster_gpu_names_it(written, known):
    assert card_capability(written) == known


@pytest.mark.parametrize("sets", [
    ['cluster.gpu="H100"'],  # FP8 tensor cores
    ['cluster.gpu="L40S"'],  # Ada, 8.9: the lowest with FP8 matmuls
    ['inference.quantization="none"'],  # bf16 engines on the A100s
    ['cluster.gpu="MI300X"', "cluster.gpu_memory_gib=192"],  # a card vime does not know
])
def test_fp8_where_the_card_computes_it_is_clean(sets):
    spec = FORESIGHT / "fp8-rollout-on-a100" / "spec.toml"
    assert "V126" not in {d.code for d in run_spec(spec, sets).diagnostics}


def test_fp8_below_the_marlin_kernel_is_an_error_with_vllms_message():
    spec = FORESIGHT / "fp8-rollout-on-a100" / "spec.toml"
    (found,) = [d for d in run_spec(spec, ['cluster.gpu="V100"']).diagnostics
                if d.code == "V126"]
    assert found.severity == "error"
    assert "Minimum capability: 75. Current capability: 70." in found.message
    (marlin,) = [d for d in run_spec(spec).diagnostics if d.code == "V126"]
    assert marlin.severity == "warning" and "Marlin" in marlin.message


def test_fp8_checkpoint_served_on_a100_is_reported_at_the_checkpoint():
    spec = FORESIGHT / "fp8-engine-bf16-push" / "spec.toml"
    result = run_spec(spec, ['cluster.gpu="A100-80GB"'])
    found = [(d.key, d.severity) for d in result.diagnostics if d.code == "V126"]
    assert found == [("model.hf_checkpoint", "warning")]
    assert "V126" not in {d.code for d in run_spec(spec).diagnostics}  # its H100s


@pytest.mark.parametrize("backend", ["deep_gemm", "flashinfer_cutlass"])
def test_fp8_experts_on_a100_refuse_hopper_kernels(backend):
    spec = FORESIGHT / "fp8-rollout-on-a100" / "spec.toml"
    sets = [f'inference.moe_backend="{backend}"']
    found = [d for d in run_spec(spec, sets).diagnostics
             if d.code in ("V122", "V126") and d.key == "inference.moe_backend"]
    assert [(d.code, d.severity) for d in found] == [("V126", "error")]  # not V122's bf16 text
    assert "does not support the deployment configuration" in found[0].message
    # on H100s vLLM runs both kernels on FP8 experts
    assert not [d for d in run_spec(spec, sets + ['cluster.gpu="H100"']).diagnostics
                if d.key == "inference.moe_backend"]
