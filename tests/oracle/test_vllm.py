"""Oracle: vime's vllm.args parse with vLLM 0.33's own engine-argument parser into the engine
the plan describes, and vime's experts-per-GPU equals vLLM's own expert placement.

vLLM needs a GPU platform to build its parser; on this CPU-only machine the platform is set
to vLLM's CpuPlatform before `vllm.engine.arg_utils` is imported (the only thing changed;
shared/reference/vllm.md, "Running vLLM's own argument parser on a CPU-only machine").
Set up with tests/oracle/setup-vllm.sh (a 9.4 GB venv), run with `make oracle-vllm`.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

vllm_platforms = pytest.importorskip("vllm.platforms")
from vllm.platforms.cpu import CpuPlatform  # noqa: E402

vllm_platforms._current_platform = CpuPlatform()

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.model_executor.layers.fused_moe.expert_map_manager import (  # noqa: E402
    determine_expert_map,
)
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

from vime import pipeline  # noqa: E402
from vime.emit import argfile  # noqa: E402
from vime.emit.vllm import vllm_args  # noqa: E402
from vime.parse import Source  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.toml"))
PARSER = EngineArgs.add_cli_args(FlexibleArgumentParser())


def plan(spec: Path, sets=()):
    result = pipeline.run(Source(str(spec), spec.read_text()), list(sets), spec.parent)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics]
    return result


def engine_args(result) -> EngineArgs:
    argv = argfile.parse(argfile.render(vllm_args(result.plan)))
    return EngineArgs.from_cli_args(PARSER.parse_args(argv))


@pytest.mark.parametrize("spec", SPECS + [ROOT / "specs" / "qwen3_30b.toml"],
                         ids=[s.stem for s in SPECS] + ["with-extra-args"])
def test_vllm_parses_vimes_arguments_into_the_planned_engine(spec, request):
    sets = []
    if request.node.callspec.id == "with-extra-args":
        sets = ['inference.extra_args=["--max-num-seqs=64", "--enable-chunked-prefill"]']
    result = plan(spec, sets)
    args, inf, engine = engine_args(result), result.spec.inference, result.plan.engines[0]
    assert args.model == result.spec.model.hf_checkpoint
    assert (args.tensor_parallel_size, args.data_parallel_size) == (engine.tp, engine.dp)
    assert args.enable_expert_parallel == inf.expert_parallel
    assert args.enable_eplb == inf.eplb.enabled
    if inf.eplb.enabled:
        assert args.eplb_config.num_redundant_experts == inf.eplb.num_redundant_experts
        assert args.eplb_config.window_size == inf.eplb.window_size
        assert args.eplb_config.step_interval == inf.eplb.step_interval
    assert args.gpu_memory_utilization == inf.gpu_memory_utilization
    assert args.max_model_len == result.spec.rollout.max_prompt_len + result.spec.rollout.max_response_len
    sizes = inf.cudagraph_capture_sizes
    assert args.cudagraph_capture_sizes == (list(sizes) if sizes else None)
    assert args.enable_sleep_mode == result.spec.train.colocate
    assert args.enable_return_routed_experts == result.spec.train.routing_replay
    assert args.seed == result.spec.experiment.seed
    assert args.logprobs_mode == "processed_logprobs"
    assert args.distributed_executor_backend == ("ray" if len(engine.nodes) > 1 else None)
    if inf.moe_backend != "auto":
        assert args.moe_backend == inf.moe_backend
    if sets:
        assert args.max_num_seqs == 64 and args.enable_chunked_prefill is True


def test_an_unknown_flag_is_rejected_by_vllm():
    with pytest.raises(SystemExit) as exit_:
        PARSER.parse_args(["--model", "x", "--tensor-paralel-size", "2"])
    assert exit_.value.code == 2


@settings(max_examples=150, deadline=None, derandomize=True)
@given(experts=st.sampled_from([8, 16, 60, 64, 128, 160, 256]),
       nodes=st.sampled_from([1, 2, 3]), engine_gpus=st.sampled_from([1, 2, 4, 8]),
       vllm_dp=st.sampled_from([1, 2]), redundant=st.integers(0, 40), eplb=st.booleans())
def test_experts_per_gpu_equal_vllms_placement(experts, nodes, engine_gpus, vllm_dp, redundant,
                                               eplb):
    if engine_gpus % vllm_dp:
        return
    gpus = engine_gpus * nodes if engine_gpus == 8 else engine_gpus
    ep = gpus
    if eplb:
        redundant = (-experts) % ep + ep * (redundant % 3)
        if ep == 1:
            return
    else:
        redundant = 0
    sets = [f"cluster.nodes={nodes}", f"model.arch.num_experts={experts}", "train.parallel.ep=1",
            "train.parallel.tp=4", f"inference.gpus_per_engine={gpus}",
            f"inference.data_parallel_size={vllm_dp}", "inference.expert_parallel=true",
            f"inference.eplb.enabled={str(eplb).lower()}",
            f"inference.eplb.num_redundant_experts={redundant}",
            "cluster.gpu=H200", "train.max_tokens_per_gpu=4096"]
    source = (ROOT / "specs" / "qwen3_30b.toml")
    result = pipeline.run(Source(str(source), source.read_text()), sets, source.parent)
    errors = [d for d in result.diagnostics if d.severity == "error"]
    if errors:  # layouts vime rejects for other reasons carry nothing to compare
        return
    engine = result.plan.engines[0]
    assert engine.ep == ep
    physical = experts + redundant
    local = [determine_expert_map(ep, rank, physical)[0] for rank in range(ep)]
    assert sum(local) == engine.physical_experts == physical
    assert max(local) == engine.experts_per_gpu == math.ceil(physical / ep)
