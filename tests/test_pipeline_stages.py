"""Pipeline parallelism in the compiler: the stages' layers (even, or an uneven first or last
stage as Megatron's --decoder-first/last-pipeline-num-layers), their rules (V205, V209), the
memory of each stage with the busiest named, and the 1F1B schedule's micro-batches (V216).
Megatron's own parser and layer split judge the same specs in tests/oracle/test_megatron_args.py.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specsupport import ROOT, codes, run_spec

from vime.emit import plan_json
from vime.emit.megatron import megatron_args
from vime.plan.memory import GiB, padded_vocab, stage_shard
from vime.plan.stages import bubble_fraction, in_flight, split_layers
from vime.render import plan_text

SEED = ROOT / "specs" / "qwen3_30b.toml"
DSV3 = ROOT / "specs" / "tiny_h200_dsv3.toml"
# Qwen3-235B-A22B's 94 layers over 32 GPUs: tp 2 × pp 4, ep 8
PP4 = ["cluster.nodes=4", "train.parallel.tp=2", "train.parallel.pp=4", "train.parallel.ep=8",
       "model.arch.num_hidden_layers=94"]
PP2 = ["train.parallel.tp=2", "train.parallel.pp=2", "train.parallel.ep=4"]


def _errors(result) -> list[tuple[str, str]]:
    return [(d.code, d.message) for d in result.diagnostics if d.severity == "error"]


@pytest.mark.parametrize(("layers", "pp", "first", "last", "split"), [
    (48, 2, None, None, (24, 24)),
    (94, 4, None, 22, (24, 24, 24, 22)),
    (94, 4, 22, None, (22, 24, 24, 24)),
    (94, 4, 23, 23, (23, 24, 24, 23)),
    (48, 2, 20, None, (20, 28)),
    (48, 2, 20, 28, (20, 28)),
    (4, 4, 1, None, (1, 1, 1, 1)),
    (61, 4, None, 13, (16, 16, 16, 13)),  # DeepSeek-R1's upstream split
])
def test_layers_split_as_megatron_builds_them(layers, pp, first, last, split):
    found = split_layers(layers, pp, first, last)
    assert found.problem is None and found.layers == split and sum(split) == layers


@pytest.mark.parametrize(("layers", "pp", "first", "last", "problem"), [
    (94, 4, None, None, "94 layers do not split evenly over 4 stages"),
    (94, 4, 23, None, "94 layers − 23 = 71 layers do not split evenly over the 3 middle stages"),
    (48, 2, 20, 20, "first + last stage = 40 layers, but the model has 48"),
    (94, 4, 50, 47, "94 layers − 50 − 47 = -3 layers"),  # Megatron's modulo passes −3 % 3
    (4, 4, 2, None, "4 layers − 2 = 2 layers do not split evenly"),  # 3 stages, 2 layers
    (48, 1, 48, None, "needs pp ≥ 2"),
    (48, 2, 0, None, "a stage needs at least 1 layer"),  # the schema's minimum, for the API
])
def test_refused_splits_say_why(layers, pp, first, last, problem):
    found = split_layers(layers, pp, first, last)
    assert found.layers == () and problem in found.problem


def test_94_layers_over_pp_4_plans_as_24_24_24_22():
    result = run_spec(SEED, [*PP4, "train.parallel.last_stage_layers=22"])
    assert result.ok, _errors(result)
    stages = result.plan.pipeline.stages
    assert [(s.first_layer, s.num_layers) for s in stages] == [(0, 24), (24, 24), (48, 24),
                                                               (72, 22)]
    assert [s.embedding for s in stages] == [True, False, False, False]
    assert [s.output for s in stages] == [False, False, False, True]
    argv = [t for group in megatron_args(result.plan) for t in group]
    assert argv[argv.index("--decoder-last-pipeline-num-layers") + 1] == "22"
    assert "--decoder-first-pipeline-num-layers" not in argv
    assert "24 + 24 + 24 + 22 layers" in plan_text(result.plan)


def test_94_layers_without_a_split_are_told_the_uneven_last_stage():
    result = run_spec(SEED, PP4)
    (diag,) = [d for d in result.diagnostics if d.code == "V205"]
    assert diag.key == "train.parallel.pp"
    assert "last_stage_layers = 22 (24 + 24 + 24 + 22 layers)" in diag.help
    assert run_spec(SEED, [*PP4, "train.parallel.last_stage_layers=22"]).ok


def test_first_stage_23_over_pp_4_is_refused_with_the_nearest_fix():
    result = run_spec(SEED, [*PP4, "train.parallel.first_stage_layers=23"])
    assert not result.ok and result.plan is None
    (diag,) = [d for d in result.diagnostics if d.code == "V205"]
    assert diag.key == "train.parallel.first_stage_layers"
    assert diag.location is not None and diag.location.line >= 1
    assert "71 layers do not split evenly over the 3 middle stages" in diag.message
    assert diag.help == "first_stage_layers = 22 (22 + 24 + 24 + 24 layers)"
    assert {".".join(map(str, path)) for path, _ in diag.related} == {"train.parallel.pp"}
    fixed = run_spec(SEED, [*PP4, "train.parallel.first_stage_layers=22"])
    assert fixed.ok, _errors(fixed)


def test_uneven_stage_keys_need_a_pipeline():
    result = run_spec(SEED, ["train.parallel.first_stage_layers=24",
                             "train.parallel.last_stage_layers=24"])
    found = [d for d in result.diagnostics if d.code == "V209"]
    assert {d.key for d in found} == {"train.parallel.first_stage_layers",
                                      "train.parallel.last_stage_layers"}
    assert "V205" not in codes(result)  # one cause, one diagnostic


def test_first_stage_holds_the_embeddings_and_last_the_output_layer():
    spec = run_spec(SEED, [*PP4, "train.parallel.last_stage_layers=22"]).spec
    first, middle, _, last = run_spec(
        SEED, [*PP4, "train.parallel.last_stage_layers=22"]).plan.pipeline.stages
    arch = spec.arch
    vocab_matrix = arch.hidden_size * padded_vocab(arch.vocab_size, 2) / 2
    assert stage_shard(spec, first).dense - stage_shard(spec, middle).dense == pytest.approx(
        vocab_matrix)
    per_layer = stage_shard(spec, middle).total / 24
    # the last stage: 22 layers, the output layer and the final norm
    assert stage_shard(spec, last).total == pytest.approx(
        22 * per_layer + vocab_matrix + arch.hidden_size)


def test_loss_head_is_charged_on_the_last_stage_only():
    result = run_spec(SEED, [*PP2, "cluster.gpu=H200"])
    from vime.plan.memory import stage_phase

    first, last = result.plan.pipeline.stages
    gpu = result.spec.derived.gpu_memory_gib * GiB
    names = [{t.name for t in stage_phase(result.spec, gpu, s).terms} for s in (first, last)]
    assert "logits" not in names[0] and "logits" in names[1]


def test_in_flight_micro_batches_follow_1f1b_warmup():
    # stage i of p holds min(p − i, m): p − i − 1 warm-up forwards and one more
    assert [in_flight(i, 4, 8) for i in range(4)] == [4, 3, 2, 1]
    assert [in_flight(i, 4, 2) for i in range(4)] == [2, 2, 2, 1]
    assert in_flight(0, 1, 5) == 1
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)


def test_first_stage_activations_are_its_micro_batches_in_flight():
    sets = [*PP4, "train.parallel.first_stage_layers=23", "train.parallel.last_stage_layers=23",
            "train.dynamic_batch=false", "rollout.batch_size=32", "train.global_batch_size=64",
            "cluster.gpu=H200", 'train.recompute="selective"']
    result = run_spec(SEED, sets)
    assert result.ok, _errors(result)
    from vime.plan.memory import stage_phase

    stages = result.plan.pipeline.stages
    assert result.plan.pipeline.micro_batches == 16  # 64 ÷ (1 × dp 4)
    assert [s.in_flight for s in stages] == [4, 3, 2, 1]
    gpu = result.spec.derived.gpu_memory_gib * GiB

    def activations(stage):
        return next(t.bytes for t in stage_phase(result.spec, gpu, stage).terms
                    if t.name == "activations")

    # stages 1 and 2 hold 24 layers each: 3 and 2 micro-batches' worth
    assert activations(stages[1]) / activations(stages[2]) == pytest.approx(3 / 2)


def test_busiest_stage_is_named_and_judged():
    result = run_spec(SEED, [*PP2, "cluster.gpu=H200"])
    mem = result.plan.memory
    peaks = [m.peak for m in mem.stages]
    assert mem.busiest_stage == peaks.index(max(peaks))
    assert mem.train.peak == max(peaks)
    obj = json.loads(plan_json.dumps(plan_json.plan_object(
        "specs/qwen3_30b.toml", result.diagnostics, result.spec, result.plan)))
    assert obj["memory"]["train_busiest_stage"] == mem.busiest_stage
    pipe = obj["train"]["pipeline"]
    assert pipe["busiest_stage"] == mem.busiest_stage
    assert [s["num_layers"] for s in pipe["stages"]] == [24, 24]
    assert [s["train_peak_gib"] for s in pipe["stages"]] == [round(p / GiB, 2) for p in peaks]
    text = plan_text(result.plan)
    assert f"busiest stage {mem.busiest_stage}: peak {mem.train.peak / GiB:.1f} GiB (layers 24–47" in text
    # the memory rule speaks of that stage: a GPU too small for it
    small = run_spec(SEED, [*PP2, "cluster.gpu_memory_gib=20"])
    (v801,) = [d for d in small.diagnostics if d.code == "V801"]
    assert f"on pipeline stage {mem.busiest_stage}, the busiest of 2" in v801.message


def test_dense_first_layers_live_on_the_first_stage():
    # 4 layers, the first 2 dense (DeepSeek-V3's first_k_dense_replace), over pp 2
    result = run_spec(DSV3, ["cluster.gpus_per_node=2", "train.parallel.pp=2",
                             "model.arch.num_hidden_layers=4", "model.arch.first_k_dense_replace=2"])
    assert result.ok, _errors(result)
    first, last = result.plan.pipeline.stages
    assert (first.num_moe_layers, last.num_moe_layers) == (0, 2)
    assert stage_shard(result.spec, first).expert == 0 < stage_shard(result.spec, last).expert


def test_pp_1_plans_have_no_pipeline_keys():
    result = run_spec(SEED)
    assert result.plan.pipeline is None and len(result.plan.memory.stages) == 1
    obj = plan_json.plan_object("specs/qwen3_30b.toml", result.diagnostics, result.spec,
                                result.plan)
    assert "pipeline" not in obj["train"] and "train_busiest_stage" not in obj["memory"]
    assert "pipeline:" not in plan_text(result.plan)


def test_fewer_micro_batches_than_stages_warns_with_the_bubble_and_a_fix():
    sets = [*PP2, "train.dynamic_batch=false", "train.micro_batch_size=4"]
    result = run_spec(SEED, sets)
    (diag,) = [d for d in result.diagnostics if d.code == "V216"]
    assert diag.severity == "warning" and result.ok
    assert "1 micro-batch per step on each dp rank for pp = 2 stages" in diag.message
    assert "(pp − 1) ÷ (m + pp − 1) = 1 ÷ 2 = 50%" in diag.message
    assert diag.help.startswith("micro_batch_size = 2")
    assert "V216" not in codes(run_spec(SEED, [*PP2, "train.dynamic_batch=false",
                                               "train.micro_batch_size=2"]))
    text = plan_text(run_spec(SEED, [*PP2, "train.dynamic_batch=false"]).plan)
    assert "m = 4 micro-batches per step per dp rank = global batch 8 ÷ (micro batch 1 × dp 2)" in text
    assert "(p − 1) ÷ (m + p − 1) = 1 ÷ 5 = 20% of a step" in text


def test_dynamic_batch_states_one_schedule_for_every_stage():
    result = run_spec(SEED, PP2)
    assert result.spec.train.dynamic_batch and result.plan.pipeline.micro_batches is None
    text = plan_text(result.plan)
    assert "runs the most any rank packs (all-reduced, as slime does): one schedule" in text
    assert "≤ 4 per step per dp rank (2 with every sample at full length); fewer than 2 idle" in text
    # one sample a dp rank per step cannot fill 4 stages, however it packs
    few = run_spec(SEED, [*PP4, "train.parallel.last_stage_layers=22", "rollout.batch_size=2",
                          "train.global_batch_size=4"])
    (diag,) = [d for d in few.diagnostics if d.code == "V216"]
    assert diag.key == "train.global_batch_size" and "1 sample per step" in diag.message


def test_import_maps_megatrons_uneven_stage_flags():
    from vime.importer import import_argv

    # run-qwen3-235B-A22B.sh's PERF_ARGS (THUDM/slime scripts/)
    result = import_argv(["--tensor-model-parallel-size", "4", "--sequence-parallel",
                          "--pipeline-model-parallel-size", "4", "--context-parallel-size", "2",
                          "--expert-model-parallel-size", "16",
                          "--decoder-last-pipeline-num-layers", "22",
                          "--decoder-first-pipeline-num-layers", "24"])
    assert result.values["train.parallel.pp"] == 4
    assert result.values["train.parallel.last_stage_layers"] == 22
    assert result.values["train.parallel.first_stage_layers"] == 24
    assert not [f for f in result.findings if "pipeline-num-layers" in f.message]


def test_megatrons_flag_name_as_a_key_points_at_the_stage_key():
    result = run_spec(SEED, ["train.parallel.decoder_last_pipeline_num_layers=22"])
    (diag,) = [d for d in result.diagnostics if d.code == "V002"]
    assert "did you mean train.parallel.last_stage_layers?" in diag.help


def test_forecast_counts_the_pipelines_idle_share():
    from vime.plan import forecast

    static = [*PP2, "train.dynamic_batch=false", "cluster.gpu=H200"]
    result = run_spec(SEED, static)  # m = 4 micro-batches over 2 stages: busy 4 ÷ 5
    found, spec = result.plan.forecast, result.spec
    length = spec.rollout.max_prompt_len + spec.rollout.max_response_len
    tokens = spec.derived.samples_per_rollout * length
    flops = forecast.forward_flops_per_token(spec) * tokens
    log_probs = next(line for line in found.lines if line.name == "log-probs")
    assert log_probs.seconds == pytest.approx(
        flops / spec.train.num_gpus / forecast.FORWARD_FLOPS_PER_S * 5 / 4)
    assert "pp 2: 80% busy, 4 micro-batches" in log_probs.note
    flat = run_spec(SEED, ["train.dynamic_batch=false", "cluster.gpu=H200"]).plan.forecast
    assert "busy" not in next(line.note for line in flat.lines if line.name == "log-probs")


def test_a_crowded_first_stage_is_told_to_hold_fewer_layers():
    spec = ROOT / "specs" / "qwen3_235b_pp4.toml"  # stage 0: 24 layers, 4 micro-batches in flight
    result = run_spec(spec, ["cluster.gpu_memory_gib=39"])
    (diag,) = [d for d in result.diagnostics if d.code == "V801"]
    assert "on pipeline stage 0, the busiest of 4" in diag.message
    assert ("train.parallel.first_stage_layers = 22 (22 + 25 + 25 + 22 layers: 34.9 GiB on the "
            "busiest stage)") in diag.help
    fixed = run_spec(spec, ["cluster.gpu_memory_gib=39", "train.parallel.first_stage_layers=22"])
    assert "V801" not in codes(fixed) and fixed.ok


def test_no_fix_of_fewer_than_1024_tokens_per_gpu():
    # the last stage at 34.9 of 36 GiB: fewer tokens cannot give it 10% headroom
    result = run_spec(SEED, [*PP2, "cluster.gpu_memory_gib=36"])
    (diag,) = [d for d in result.diagnostics if d.code == "V801"]
    assert "max_tokens_per_gpu ≤ 0" not in diag.help and "max_tokens_per_gpu" not in diag.help


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(2, 12), dense=st.integers(0, 3), pp=st.sampled_from([2, 3, 4]),
       first=st.none() | st.integers(1, 12), last=st.none() | st.integers(1, 12),
       static=st.booleans())
def test_any_uneven_split_plans_or_is_refused_with_a_code(layers, dense, pp, first, last, static):
    """A DeepSeek-V3-like model (dense first layers) over any pipeline: V205 refuses exactly
    the splits split_layers refuses; what plans has one stage per GPU of a pipeline group, the
    model's layers and MoE layers over them, and renders."""
    sets = [f"cluster.gpus_per_node={pp}", f"train.parallel.pp={pp}",
            f"model.arch.num_hidden_layers={layers}",
            f"model.arch.first_k_dense_replace={min(dense, layers - 1)}",
            f"train.dynamic_batch={str(not static).lower()}"]
    sets += [f"train.parallel.first_stage_layers={first}"] * (first is not None)
    sets += [f"train.parallel.last_stage_layers={last}"] * (last is not None)
    result = run_spec(DSV3, sets)
    refused = split_layers(layers, pp, first, last).problem is not None
    assert ("V205" in codes(result)) == refused, (sets, codes(result))
    if not result.ok:
        assert [d for d in result.diagnostics if d.severity == "error"]
        return
    stages = result.plan.pipeline.stages
    assert len(stages) == pp and sum(s.num_layers for s in stages) == layers
    assert sum(s.num_moe_layers for s in stages) == result.spec.arch.num_moe_layers
    assert [s.first_layer for s in stages] == [sum(s.num_layers for s in stages[:i])
                                               for i in range(pp)]
    assert len(result.plan.memory.stages) == pp
    assert max(len(line) for line in plan_text(result.plan).splitlines()) <= 100
    json.loads(plan_json.dumps(plan_json.plan_object(
        "spec.toml", result.diagnostics, result.spec, result.plan)))
