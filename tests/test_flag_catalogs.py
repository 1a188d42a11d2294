"""inference.extra_args against vLLM's flag catalogs (V511-V517, V507/V508 by any spelling) and
vime's own megatron.args / vllm.args against the catalogs (vime/data/*-flags-*.json, written
by vime/flags/generate.py; tests/oracle/test_*_flags.py compare them with the libraries)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from specsupport import ROOT, run_text

from vime import flags
from vime.check.engine_flags import SGLANG_FLAGS, VIME_VLLM_FLAGS
from vime.emit.megatron import megatron_args
from vime.emit.vllm import vllm_args

SEED = ROOT / "specs" / "qwen3_30b.toml"
SPECS = sorted((ROOT / "specs").glob("*.toml"))


def plan(*extra: str, sets=()):
    value = json.dumps(list(extra))
    return run_text(SEED.read_text(), [f"inference.extra_args={value}", *sets],
                    name="specs/qwen3_30b.toml", spec_dir=SEED.parent)


def clean(result) -> bool:
    """No diagnostic but V730's and V732's: the seed's model folder and prompt file are a
    cluster's, not on this machine."""
    return not [d for d in result.diagnostics if d.code not in ("V730", "V732")]


def found(result, code):
    return [d for d in result.diagnostics if d.code == code]


def test_the_issues_three_examples_are_caught_with_the_librarys_words():
    [ep] = found(plan("--enable-ep-moe"), "V511")
    assert ep.severity == "error" and "--enable-expert-parallel" in ep.help
    assert "inference.expert_parallel" in ep.help  # the flag vime sets: the key, not the flag
    [dtype] = found(plan("--kv-cache-dtype=FP8"), "V512")
    assert dtype.severity == "error" and "fp8_e4m3" in dtype.message
    assert dtype.help == "--kv-cache-dtype=fp8 (the values are case-sensitive)"
    [dcp] = found(plan("--decode-context-parallel-size=2"), "V516")
    assert ("--enable-return-routed-experts is incompatible with context parallelism "
            "(DCP/PCP > 1).") in dcp.message
    assert not found(plan("--decode-context-parallel-size=2", sets=["train.routing_replay=false"]),
                     "V516")


def test_flags_are_read_as_vllms_parser_reads_them():
    # underscores are dashes; a unique prefix is the flag (a warning); a switch's false form
    assert plan("--max_num_seqs=64").ok and clean(plan("--max_num_seqs=64"))
    [abbrev] = found(plan("--max-num-seq=64"), "V511")
    assert abbrev.severity == "warning" and "--max-num-seqs" in abbrev.message
    [amb] = found(plan("--max-num=64"), "V511")
    assert amb.severity == "error" and "ambiguous" in amb.message
    [twice] = found(plan("--enforce-eager", "--no-enforce-eager"), "V514")
    assert twice.key == "inference.extra_args[1]"
    assert not found(plan("--compilation-config.mode=3", "--compilation-config.cudagraph_mode=NONE"),
                     "V514")
    [need] = found(plan("--max-num-seqs"), "V513")
    assert "expected one argument" in need.message
    [dotted] = found(plan("--max-num-seqs.x=1"), "V513")
    assert "not a JSON flag" in dotted.message
    [bad_json] = found(plan("--compilation-config={mode: 3"), "V512")
    assert "JSON" in bad_json.message
    assert clean(plan("--max-num-batched-tokens=16k", "--attention-backend=None"))


def test_a_flag_some_versions_lack_is_a_warning_with_the_spelling_all_take():
    [only_033] = found(plan("--disable-prefix-caching", sets=["train.routing_replay=false"]),
                       "V511")
    assert only_033.severity == "warning" and "0.26.0 or 0.32.0" in only_033.message
    assert only_033.help == "--no-enable-prefix-caching, which every version takes"


def test_v507_and_v508_know_every_spelling():
    """Before the catalogs, V507 compared the text before '=' with its table, and V508 only
    --no-enable-prefix-caching: these passed."""
    [tp] = found(plan("--tensor_parallel_size=2"), "V507")
    assert "--tensor-parallel-size" in tp.message
    assert found(plan("--no-enable-sleep-mode"), "V507")
    assert found(plan("--disable-prefix-caching"), "V508")


def test_kv_connectors_vllm_refuses_with_routed_experts():
    nixl = '--kv-transfer-config={"kv_connector": "MultiConnector", "kv_connector_extra_config": ' \
        '{"connectors": [{"kv_connector": "MooncakeConnector"}]}}'
    [refused] = found(plan(nixl), "V517")
    assert refused.severity == "error" and "incompatible with MooncakeConnector" in refused.message
    [other] = found(plan("--kv-transfer-config.kv_connector=LMCacheConnectorV1",
                         "--kv-transfer-config.kv_role=kv_both"), "V517")
    assert other.severity == "warning" and "0.26" in other.message


def test_specs_and_their_emitted_vllm_args_are_in_every_catalog():
    cat = flags.catalog("vllm")
    assert cat.versions == ("0.26.0", "0.32.0", "0.33.0")
    for spec in SPECS:
        result = run_text(spec.read_text(), [], name=f"specs/{spec.name}", spec_dir=spec.parent)
        assert not [d.code for d in result.diagnostics if d.code.startswith("V51")], spec.name
        for group in vllm_args(result.plan):
            if group[0].startswith("--"):
                assert set(cat.entries(group[0])) == set(cat.versions), (spec.name, group[0])
    for option in [*VIME_VLLM_FLAGS, *SGLANG_FLAGS.values()]:
        if option.startswith("--"):
            assert cat.entries(option), option


def test_megatron_args_vime_emits_are_megatron_ls_flags():
    """Every flag of megatron.args in Megatron-LM's parser (catalog from megatron-core 0.19.2's
    megatron.training.arguments), given a value exactly when it takes one, inside its choices."""
    cat = flags.catalog("megatron")
    assert cat.versions == ("0.19.2",)
    for spec in SPECS:
        result = run_text(spec.read_text(), [], name=f"specs/{spec.name}", spec_dir=spec.parent)
        for flag, *values in megatron_args(result.plan):
            entry = cat.newest(flag)
            assert entry, (spec.name, flag)
            entry = entry[1]
            assert bool(values) == entry.get("value", True), (spec.name, flag)
            if "choices" in entry and values:
                assert values[0] in map(str, entry["choices"]), (spec.name, flag, values)


@pytest.mark.parametrize("impl, flag", [
    ("transformer_engine", [["--transformer-impl", "transformer_engine"]]),
    ("local", [["--transformer-impl", "local"]]), ("auto", [])])
def test_megatron_args_name_the_layer_spec_only_when_the_spec_forces_one(impl, flag):
    """auto is decided on the training nodes, so megatron.args leaves Megatron-LM's flag out;
    a forced one is the flag, inside its choices in Megatron-LM's parser."""
    result = plan(sets=[f'train.transformer_impl="{impl}"'])
    emitted = [group for group in megatron_args(result.plan) if group[0] == "--transformer-impl"]
    assert emitted == flag
    choices = flags.catalog("megatron").newest("--transformer-impl")[1]["choices"]
    assert all(values in choices for _, values in emitted)


def test_the_catalogs_are_small_and_read_only_when_extra_args_has_flags():
    sizes = [p.stat().st_size for p in (ROOT / "vime" / "data").glob("vllm-flags-*.json")]
    assert len(sizes) == 3 and sum(sizes) < 150_000
    code = ("import sys; from vime import flags, pipeline; from vime.parse import Source; "
            "p = sys.argv[1]; r = pipeline.run(Source(p, open(p).read()), [], None); "
            "assert r.ok; print(flags.catalog.cache_info().currsize)")
    proc = subprocess.run([sys.executable, "-c", code, str(SEED)], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.stdout.strip() == "0", proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ["--enable-ep-moe", "--tp-size", "--mem-fraction-static"])
def test_sglang_flags_get_vllms_name(name):
    [d] = found(plan(f"{name}=1" if name != "--enable-ep-moe" else name), "V511")
    assert SGLANG_FLAGS[name] in d.help
