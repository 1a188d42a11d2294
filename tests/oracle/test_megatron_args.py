"""Oracle: the megatron.args vime emits pass Megatron-LM's own parse_args + validate_args
(megatron.training ships in the megatron-core 0.19 wheel), vime's Megatron rules reject what
Megatron rejects, and vime's weights + optimizer memory equals
megatron.training.theoretical_memory_usage for the same arguments.

Patched, because they query a GPU that this machine does not have (nothing else is patched):
- megatron.training.arguments.get_device_arch_version -> 9 (Hopper), called by validate_args
  for tp > 1 or cp > 1 (the CUDA_DEVICE_MAX_CONNECTIONS check);
- torch.cuda.get_device_capability -> (9, 0), called for --moe-grouped-gemm.
Environment set as a launcher would: WORLD_SIZE (the actor's GPUs), RANK=0,
CUDA_DEVICE_MAX_CONNECTIONS=1.
Transformer Engine is not installed here, so the argv gets `--no-rope-fusion` (TE's fused
RoPE; TransformerConfig refuses the default without TE). That is a kernel choice, not a
layout or batch rule, and vime's emitted arguments leave it at Megatron's default for runs
that have TE.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("megatron.training.arguments")

import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from megatron.training import arguments  # noqa: E402
from megatron.training import theoretical_memory_usage as tmu  # noqa: E402
from megatron.training.argument_utils import core_transformer_config_from_args  # noqa: E402
from megatron.training.vocab_utils import calculate_padded_vocab_size  # noqa: E402

from vime import pipeline  # noqa: E402
from vime.emit.megatron import megatron_args  # noqa: E402
from vime.parse import Source  # noqa: E402
from vime.plan.memory import GiB, actor_shard  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.toml"))
SEED = ROOT / "specs" / "qwen3_30b.toml"


def megatron_parse(argv: list[str], world_size: int):
    """Megatron's parse_args + validate_args + TransformerConfig on vime's argv."""
    env = {"WORLD_SIZE": str(world_size), "RANK": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    if importlib.util.find_spec("transformer_engine") is None:
        argv = [*argv, "--no-rope-fusion"]
    with warnings.catch_warnings(), mock.patch.dict(os.environ, env), \
            mock.patch.object(sys, "argv", ["pretrain_gpt.py", *argv]), \
            mock.patch.object(arguments, "get_device_arch_version", return_value=9), \
            mock.patch.object(torch.cuda, "get_device_capability", return_value=(9, 0)), \
            mock.patch("builtins.print"):
        warnings.simplefilter("ignore")
        args = arguments.parse_args()
        arguments.validate_args(args, {})
        args.padded_vocab_size = calculate_padded_vocab_size(
            args.vocab_size, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size,
            logging_enabled=False)
        core_transformer_config_from_args(args)
    return args


def plan(spec: Path, sets=()):
    result = pipeline.run(Source(str(spec), spec.read_text()), list(sets), spec.parent)
    return result


def argv_of(result) -> list[str]:
    return [token for group in megatron_args(result.plan) for token in group]


@pytest.mark.parametrize("spec", SPECS, ids=[s.stem for s in SPECS])
def test_every_spec_is_accepted_by_megatron(spec):
    result = plan(spec)
    assert result.ok
    args = megatron_parse(argv_of(result), result.spec.train.num_gpus)
    assert args.data_parallel_size == result.plan.layout.dp
    assert args.global_batch_size == result.spec.train.global_batch_size


layouts = st.fixed_dictionaries({
    "nodes": st.sampled_from([1, 2, 4]),
    "tp": st.sampled_from([1, 2, 4, 8]),
    "cp": st.sampled_from([1, 2]),
    "pp": st.sampled_from([1, 2, 4]),
    "ep": st.sampled_from([1, 2, 4, 8, 16]),
    "etp": st.sampled_from([1, 2]),
    "offload": st.booleans(),
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "dynamic": st.booleans(),
})


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(layouts)
def test_what_vime_accepts_megatron_accepts_and_memory_agrees(layout):
    sets = [f"cluster.nodes={layout['nodes']}", "cluster.gpu=H200",
            f"train.parallel.tp={layout['tp']}", f"train.parallel.cp={layout['cp']}",
            f"train.parallel.pp={layout['pp']}", f"train.parallel.ep={layout['ep']}",
            f"train.parallel.etp={layout['etp']}", f"train.recompute=\"{layout['recompute']}\"",
            f"train.dynamic_batch={str(layout['dynamic']).lower()}",
            f"train.parallel.sequence_parallel={str(layout['tp'] > 1).lower()}",
            f"train.optimizer.cpu_offload={str(layout['offload']).lower()}",
            f"train.optimizer.overlap_cpu_optimizer_d2h_h2d={str(layout['offload']).lower()}",
            "rollout.batch_size=64", "train.max_tokens_per_gpu=4096",
            "inference.gpus_per_engine=8", "inference.expert_parallel=true",
            "train.global_batch_size=128"]
    result = plan(SEED, sets)
    megatron_codes = {"V201", "V202", "V203", "V204", "V205", "V211", "V212", "V301", "V402"}
    rejected = {d.code for d in result.diagnostics if d.severity == "error"} & megatron_codes
    if not result.ok:
        return  # the rejection side is tested below, rule by rule
    assert not rejected
    args = megatron_parse(argv_of(result), result.spec.train.num_gpus)
    # weights + optimizer: megatron's formula divides dense state by dp (not dp × cp) and
    # knows nothing of CPU offload; compare where both model the same thing
    if layout["cp"] == 1 and not layout["offload"]:
        ours = actor_shard(result.spec)
        theirs = tmu.compute_weight_and_optimizer_memory(args) / GiB
        dp, edp = result.plan.layout.dp, result.plan.layout.edp
        vime = (ours.dense * (6 + 12 / dp) + ours.expert * (6 + 12 / edp)) / GiB
        assert vime == pytest.approx(theirs, rel=2e-3), (layout, vime, theirs)


def _rejects(argv: list[str], world_size: int) -> bool:
    try:
        megatron_parse(argv, world_size)
    except (AssertionError, ValueError, RuntimeError):
        return True
    except SystemExit:  # argparse: a flag Megatron does not know (allow_abbrev=False)
        return True
    return False


def _replace(argv: list[str], flag: str, value: str | None) -> list[str]:
    out = list(argv)
    if flag in out:
        index = out.index(flag)
        if value is None:
            del out[index]
        else:
            out[index + 1] = value
    elif value is not None:
        out += [flag, value]
    return out


@pytest.mark.parametrize(("code", "sets", "flag", "value"), [
    ("V201", ["train.parallel.cp=2"], "--tensor-model-parallel-size", "8"),  # 8 GPUs, tp8 × cp2
    ("V203", [], "--num-attention-heads", "30"),  # 30 heads over tp 4
    ("V204", [], "--num-query-groups", "6"),  # 6 KV groups vs tp 4
    ("V205", ["train.parallel.tp=2", "train.parallel.pp=2", "train.parallel.ep=4"],
     "--num-layers", "47"),
    ("V211", [], "--use-precision-aware-optimizer", None),  # CPU offload without it
    ("V301", [], "--num-experts", "100"),  # 100 experts over ep 8
])
def test_megatron_rejects_what_vime_rejects(code, sets, flag, value):
    good = plan(SEED, sets)
    assert good.ok
    argv = argv_of(good)
    assert not _rejects(argv, good.spec.train.num_gpus)
    broken = _replace(argv, flag, value)
    assert _rejects(broken, good.spec.train.num_gpus), f"Megatron accepted what {code} rejects"
    # and vime rejects the same change made in the spec
    spec_change = {
        "V201": ["train.parallel.tp=8", "train.parallel.cp=2"],
        "V203": ["model.arch.num_attention_heads=30"],
        "V204": ["model.arch.num_key_value_heads=6"],
        "V205": ["model.arch.num_hidden_layers=47"],
        "V211": ["train.optimizer.precision_aware=false"],
        "V301": ["model.arch.num_experts=100"],
    }[code]
    again = plan(SEED, [*sets, *spec_change])
    assert code in {d.code for d in again.diagnostics}


def test_global_batch_rule_matches_megatrons_microbatch_calculator():
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    for gbs, mbs, dp in [(8, 1, 2), (8, 1, 3), (24, 2, 6), (24, 4, 3), (6, 1, 4)]:
        try:
            ConstantNumMicroBatchesCalculator(gbs, mbs, dp, False, 0)
            megatron_ok = True
        except AssertionError:
            megatron_ok = False
        tp = 8 // dp if 8 % dp == 0 else None
        if tp is None:  # vime's side: 24 GPUs of tp 8 / dp 3
            sets = ["cluster.nodes=3", "train.parallel.tp=8", "train.parallel.ep=8"]
            dp_vime = 3
        else:
            sets = [f"train.parallel.tp={tp}"]
            dp_vime = dp
        if dp_vime != dp:
            continue
        result = plan(SEED, [*sets, "train.dynamic_batch=false", f"train.micro_batch_size={mbs}",
                             f"rollout.batch_size={gbs}", "rollout.n_samples_per_prompt=1",
                             f"train.global_batch_size={gbs}"])
        assert ("V402" not in {d.code for d in result.diagnostics}) == megatron_ok, (gbs, mbs, dp)


@pytest.mark.parametrize("impl", ["local", "transformer_engine"])
def test_a_forced_layer_spec_reaches_megatrons_transformer_impl(impl):
    result = plan(SEED, [f'train.transformer_impl="{impl}"'])
    assert result.ok
    assert megatron_parse(argv_of(result), result.spec.train.num_gpus).transformer_impl == impl


# Pipelines: 48 layers over pp 2, and 94 (Qwen3-235B-A22B's) over pp 4 as the upstream script
# run-qwen3-235B-A22B.sh splits them (--decoder-last-pipeline-num-layers 22), and with an
# uneven first stage too.
PIPELINES = {
    "pp2": ["train.parallel.tp=2", "train.parallel.pp=2", "train.parallel.ep=4"],
    "pp4-last22": ["cluster.nodes=4", "train.parallel.tp=2", "train.parallel.pp=4",
                   "train.parallel.ep=8", "model.arch.num_hidden_layers=94",
                   "train.parallel.last_stage_layers=22"],
    "pp4-first23-last23": ["cluster.nodes=4", "train.parallel.tp=2", "train.parallel.pp=4",
                           "train.parallel.ep=8", "model.arch.num_hidden_layers=94",
                           "train.parallel.first_stage_layers=23",
                           "train.parallel.last_stage_layers=23"],
    "pp2-first20": ["train.parallel.tp=2", "train.parallel.pp=2", "train.parallel.ep=4",
                    "train.parallel.first_stage_layers=20"],
}


@pytest.mark.parametrize("sets", PIPELINES.values(), ids=PIPELINES)
def test_pipeline_stages_are_megatrons(sets):
    """Megatron reads vime's pipeline flags back as the plan's stages: the layers each stage
    builds (get_num_layers_to_build) and where they start (get_transformer_layer_offset)."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    result = plan(SEED, sets)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics if d.severity == "error"]
    args = megatron_parse(argv_of(result), result.spec.train.num_gpus)
    par = result.spec.train.parallel
    assert args.pipeline_model_parallel_size == par.pp
    assert args.decoder_first_pipeline_num_layers == par.first_stage_layers
    assert args.decoder_last_pipeline_num_layers == par.last_stage_layers
    config = core_transformer_config_from_args(args)
    stages = result.plan.pipeline.stages
    assert [get_num_layers_to_build(config, pp_rank=s.index) for s in stages] == [
        s.num_layers for s in stages]
    assert [get_transformer_layer_offset(config, pp_rank=s.index) for s in stages] == [
        s.first_layer for s in stages]


@pytest.mark.parametrize(("flag", "value"), [
    ("--decoder-last-pipeline-num-layers", "23"),  # 94 − 23 = 71 over 3 stages
    ("--decoder-last-pipeline-num-layers", "97"),  # beyond the layers: 94 − 97 = −3 over 3
    ("--decoder-first-pipeline-num-layers", "0"),
])
def test_megatron_rejects_a_wrong_pipeline_split(flag, value):
    good = plan(SEED, PIPELINES["pp4-last22"])
    argv = argv_of(good)
    assert not _rejects(argv, good.spec.train.num_gpus)
    broken = _replace(argv, flag, value)
    if value == "97":  # megatron-core's modulo lets a negative rest through: no stage builds it
        from megatron.core.transformer.transformer_block import get_num_layers_to_build

        args = megatron_parse(broken, good.spec.train.num_gpus)
        config = core_transformer_config_from_args(args)
        assert get_num_layers_to_build(config, pp_rank=1) < 0
    else:
        assert _rejects(broken, good.spec.train.num_gpus)
    key = {"--decoder-last-pipeline-num-layers": "train.parallel.last_stage_layers",
           "--decoder-first-pipeline-num-layers": "train.parallel.first_stage_layers"}[flag]
    again = plan(SEED, [*PIPELINES["pp4-last22"], f"{key}={value}"])
    assert not again.ok


@pytest.mark.parametrize("wrong", [
    ["--decoder-last-pipeline-layers", "22"],  # a misspelt flag
    ["--decoder-last-pipeline", "22"],  # an abbreviation: Megatron's parser takes none
])
def test_the_oracle_fails_a_flag_megatron_does_not_know(wrong):
    good = plan(SEED, PIPELINES["pp4-last22"])
    argv = [t for t in argv_of(good) if t not in ("--decoder-last-pipeline-num-layers", "22")]
    assert not _rejects(argv_of(good), good.spec.train.num_gpus)
    assert _rejects([*argv, *wrong], good.spec.train.num_gpus)
    with pytest.raises(SystemExit):
        megatron_parse([*argv, *wrong], good.spec.train.num_gpus)


def test_pipeline_weights_and_optimizer_agree_with_megatrons_first_stage():
    """theoretical_memory_usage's most loaded shard is the first stage: layers ÷ pp and the
    word embeddings; vime's stage 0 of an even split holds the same (its final norm aside)."""
    from vime.plan.memory import stage_shard

    result = plan(SEED, PIPELINES["pp2"] + ["cluster.gpu=H200", "train.optimizer.cpu_offload=false",
                                           "train.optimizer.overlap_cpu_optimizer_d2h_h2d=false"])
    assert result.ok
    args = megatron_parse(argv_of(result), result.spec.train.num_gpus)
    first = stage_shard(result.spec, result.plan.pipeline.stages[0])
    dp, edp = result.plan.layout.dp, result.plan.layout.edp
    vime = (first.dense * (6 + 12 / dp) + first.expert * (6 + 12 / edp)) / GiB
    assert vime == pytest.approx(tmu.compute_weight_and_optimizer_memory(args) / GiB, rel=2e-3)


def test_vimes_layer_split_is_megatrons_on_every_small_case():
    """Every split of 1-12 layers over 2-5 stages, with no, each or both of an uneven first and
    last stage of 0 to layers + 1: vime's split_layers accepts exactly what TransformerConfig and
    get_num_layers_to_build accept with every stage holding a layer, and gives its layers
    (4,904 cases). At pp = 1 vime refuses the keys (V209), where Megatron takes first = layers."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig

    from vime.plan.stages import split_layers

    def megatrons(layers, pp, first, last):
        try:
            config = TransformerConfig(
                num_layers=layers, hidden_size=64, num_attention_heads=4,
                pipeline_model_parallel_size=pp, pipeline_dtype=torch.bfloat16,
                num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last)
            split = tuple(get_num_layers_to_build(config, pp_rank=i) for i in range(pp))
        except (ValueError, AssertionError):
            return None
        return split if min(split) >= 1 and sum(split) == layers else None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for layers in range(1, 13):
            for pp in range(2, 6):
                for first in (None, *range(layers + 2)):
                    for last in (None, *range(layers + 2)):
                        theirs = megatrons(layers, pp, first, last)
                        ours = split_layers(layers, pp, first, last)
                        assert (ours.layers or None) == theirs, (layers, pp, first, last)


# train.extra_args that vime accepts (V540-V542 clean), and what Megatron's parser makes of
# them: each sets its dest after vime's own flags
EXTRA_ACCEPTED = [
    (["--recompute-modules", "core_attn", "mlp"], "recompute_modules", ["core_attn", "mlp"]),
    (["--attention-dropout=0.25"], "attention_dropout", 0.25),
    (["--no-gradient-accumulation-fusion"], "gradient_accumulation_fusion", False),
    (["--moe-router-load-balancing-type", "none"], "moe_router_load_balancing_type", "none"),  # validate_args unwraps one
    (["--log-interval=7"], "log_interval", 7),
]


@pytest.mark.parametrize(("extra", "dest", "value"), EXTRA_ACCEPTED,
                         ids=[e[0][0] for e in EXTRA_ACCEPTED])
def test_extra_args_vime_accepts_pass_megatrons_parser(extra, dest, value):
    listed = ", ".join(f'"{e}"' for e in extra)
    result = plan(SEED, [f"train.extra_args=[{listed}]"])
    assert result.ok, [(d.code, d.message) for d in result.diagnostics if d.severity == "error"]
    args = megatron_parse(argv_of(result), result.spec.train.num_gpus)
    assert getattr(args, dest) == value


@pytest.mark.parametrize(("extra", "code"), [
    (["--lr-decay-sytle=cosine"], "V540"),
    (["--recompute_activations"], "V540"),
    (["--attention-dropout=fast"], "V542"),
    (["--no-gradient-accumulation-fusion=1"], "V542"),
    (["--moe-router-load-balancing-type=sometimes"], "V542"),
    (["--attention-dropout"], "V542"),
])
def test_megatron_refuses_the_extra_args_vime_refuses(extra, code):
    listed = ", ".join(f'"{e}"' for e in extra)
    result = plan(SEED, [f"train.extra_args=[{listed}]"])
    assert code in {d.code for d in result.diagnostics}
    clean = plan(SEED)
    assert _rejects([*argv_of(clean), *extra], clean.spec.train.num_gpus)


YARN = ('model.arch.rope_scaling={type="yarn", factor=8.0, original_max_position_embeddings=16,'
        ' mscale=0.9, mscale_all_dim=1.0}')


@pytest.mark.parametrize("sets", [[], [YARN]], ids=["rope", "yarn"])
def test_mla_rotary_reaches_megatrons_mla_config(sets):
    # MLATransformerConfig defaults rope_type to "yarn" with factor 40: megatron.args says
    # which, and YaRN's factor and mscales reach the config by name
    result = plan(ROOT / "specs" / "tiny_h200_dsv3.toml", sets)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics if d.severity == "error"]
    args = megatron_parse(argv_of(result), result.spec.train.num_gpus)
    config = core_transformer_config_from_args(args)
    yarn = result.spec.arch.rope_scaling
    if yarn is None:
        assert config.rope_type == "rope"
    else:
        assert (config.rope_type, config.rotary_scaling_factor, config.mscale,
                config.mscale_all_dim) == ("yarn", yarn.factor, yarn.mscale, yarn.mscale_all_dim)
