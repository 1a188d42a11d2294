"""Property tests: any layout either plans or fails with coded diagnostics; no input makes
vime raise; what check accepts always plans, with every GPU accounted for."""

from __future__ import annotations

import functools
import io
import json
import os
import re
import time
from contextlib import redirect_stderr, redirect_stdout

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from specsupport import LARGEST, ROOT, largest_argv, run_text
from tiers import tiered

from vime import pipeline, schema
from vime.cli import main

BASE = (ROOT / "specs" / "qwen3_30b.toml").read_text()
CODE = r"V\d{3}"

sizes = st.sampled_from([1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 64])


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 16), gpn=st.sampled_from([1, 2, 4, 6, 8]), tp=sizes, cp=sizes,
       pp=sizes, ep=sizes, etp=sizes, engine=sizes, vllm_dp=sizes, colocate=st.booleans(),
       actor=st.integers(1, 64), batch=st.integers(1, 64), samples=st.integers(1, 16),
       steps=st.integers(1, 8), eplb=st.booleans(), redundant=st.integers(0, 64))
def test_random_layouts_plan_or_fail_with_codes(nodes, gpn, tp, cp, pp, ep, etp, engine, vllm_dp,
                                                colocate, actor, batch, samples, steps, eplb,
                                                redundant):
    sets = [f"cluster.nodes={nodes}", f"cluster.gpus_per_node={gpn}",
            f"train.parallel.tp={tp}", f"train.parallel.cp={cp}", f"train.parallel.pp={pp}",
            f"train.parallel.ep={ep}", f"train.parallel.etp={etp}",
            f"inference.gpus_per_engine={engine}", f"inference.data_parallel_size={vllm_dp}",
            f"train.colocate={str(colocate).lower()}", f"rollout.batch_size={batch}",
            f"rollout.n_samples_per_prompt={samples}", f"train.steps_per_rollout={steps}",
            "train.global_batch_size=1", f"inference.eplb.enabled={str(eplb).lower()}",
            f"inference.eplb.num_redundant_experts={redundant}"]
    if not colocate:
        sets.append(f"train.num_gpus={actor}")
    sets = [s for s in sets if not s.startswith("train.global_batch_size")]
    result = run_text(BASE, sets)
    for diag in result.diagnostics:
        assert diag.code[0] == "V" and len(diag.code) == 4 and diag.location is not None
    if result.ok:
        plan = result.plan
        world = nodes * gpn
        assert len(plan.ranks) == plan.spec.train.num_gpus
        assert sorted(r for group in plan.groups["tp"] for r in group) == list(range(len(plan.ranks)))
        used = {g for e in plan.engines for g in e.gpus}
        assert len(used) == plan.spec.inference.num_gpus <= world
        if colocate:
            assert len(used) == world
        else:
            actor_gpus = {(r.node, r.gpu) for r in plan.ranks}
            assert not actor_gpus & used
        for e in plan.engines:
            assert e.tp * e.dp == engine
            assert len({node for node, _ in e.gpus}) == 1 or len(e.gpus) % gpn == 0
        assert plan.batch.global_batch_size * steps == batch * samples
    else:
        assert result.plan is None and any(d.severity == "error" for d in result.diagnostics)


toml_scalars = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False), st.booleans(),
                         st.text(max_size=8))
keys = st.sampled_from(["train.parallel.tp", "cluster.nodes", "inference.eplb", "model.arch",
                        "rollout", "train.optimizer.lr", "cluster.env.X", "model.arch.num_experts",
                        "inference.cudagraph_capture_sizes", "experiment.name", "a.b.c",
                        "train.parallel.tp.x", "model.arch.mlp_only_layers"])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(keys, toml_scalars | st.lists(toml_scalars, max_size=3)), max_size=4))
def test_any_override_values_give_diagnostics_never_exceptions(pairs):
    sets = [f"{key}={json.dumps(value)}" for key, value in pairs]
    result = run_text(BASE, sets)
    assert all(d.code.startswith("V") for d in result.diagnostics)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(max_size=200))
def test_arbitrary_text_never_raises(text):
    result = run_text(text)
    assert all(d.code.startswith("V") for d in result.diagnostics)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(0, len(BASE)), st.integers(1, 40), st.text(max_size=5))
def test_mangled_specs_never_raise(start, length, insert):
    mangled = BASE[:start] + insert + BASE[start + length:]
    result = run_text(mangled)
    assert all(d.code.startswith("V") for d in result.diagnostics)


def test_plan_output_is_byte_deterministic(capsys):
    outputs = []
    for _ in range(2):
        main(["plan", str(ROOT / "specs" / "qwen3_30b_24gpu_eplb.toml"), "--json"])
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]


INTEGER_KEYS = sorted(".".join(p) for p, sub in schema.leaves() if sub.get("type") == "integer")


huge_integers = (st.integers(-2**70, 2**70) | st.integers(0, 2**24)
                 | st.sampled_from([262144, 262143, 65536, 4096, 10**12, 2**63]))


@settings(max_examples=150, deadline=1000, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(INTEGER_KEYS), huge_integers), min_size=1, max_size=3))
def test_huge_integers_give_diagnostics_within_a_second(pairs):
    # `cp = 10**12` must not hang vime plan; hypothesis' deadline bounds every example
    result = run_text(BASE, [f"{key}={value}" for key, value in pairs])
    assert all(re.fullmatch(CODE, d.code) for d in result.diagnostics)


def _plan_cpu(argv: list[str]) -> tuple[int, float, str]:
    """(exit code, CPU seconds, what it printed) of `vime plan` run in this process; the CPU
    time, not the wall time, which other work on a shared machine stretches. The JSON of a
    plan this large (200 MB) goes to /dev/null: "" is returned for it."""
    json_out = "--json" in argv
    with (open(os.devnull, "w") if json_out else io.StringIO()) as sink, \
            redirect_stdout(sink), redirect_stderr(sink):
        started = time.process_time()
        code = main(argv)
        cpu = time.process_time() - started
        return code, cpu, "" if json_out else sink.getvalue()


@functools.cache
def _unchanged_cpu(case: str, fmt: str) -> float:
    """The CPU time of the largest spec itself, in this process on this machine (the best of
    two: the first run also warms the caches of the parser and the schema)."""
    extra = ["--json"] if fmt == "json" else []
    return min(_plan_cpu(largest_argv(case) + extra)[1] for _ in range(2))


def check_huge_integers_at_the_largest_cluster(case, pairs):
    for fmt in ("text", "json"):
        extra = ["--json"] if fmt == "json" else []
        code, cpu, printed = _plan_cpu(largest_argv(case, [f"{k}={v}" for k, v in pairs])
                                       + extra)
        bound = 2 * _unchanged_cpu(case, fmt) + 0.5
        assert code in (0, 1) and cpu < bound, (fmt, code, cpu, bound, printed[-2000:])
        if fmt == "text":
            event("planned" if code == 0 else "refused")
            # a plan of any size is a few hundred lines: the nodes and engines beyond 16 are
            # summarised
            assert printed.count("\n") < 1000


@tiered(fast=6, full=40)
def test_huge_integers_at_the_largest_cluster_plan_within_a_bound(examples):
    # From the largest cluster the schema admits most changes still plan, so this runs the
    # whole command, text and --json, where the plan has 262,144 GPUs. No integer makes the
    # plan cost more than the largest spec itself does on the same machine (2x and half a
    # second of slack: a changed parallelism can add groups); that spec's own bound is
    # test_bad_input.py's, and benchmarks/plan_startup.py times it.
    settings(max_examples=examples, deadline=None, derandomize=True, database=None,
             suppress_health_check=[HealthCheck.too_slow])(
        given(st.sampled_from(sorted(LARGEST)),
              st.lists(st.tuples(st.sampled_from(INTEGER_KEYS), huge_integers | st.integers(1, 64)),
                       min_size=1, max_size=2))(check_huge_integers_at_the_largest_cluster))()


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.binary(max_size=64), st.integers(0, len(BASE)))
def test_undecodable_bytes_give_a_diagnostic_never_an_exception(junk, at):
    data = BASE.encode()[:at] + junk + BASE.encode()[at:]
    result = pipeline.run_file("spec.toml", data, [], ROOT / "specs")
    assert all(re.fullmatch(CODE, d.code) and d.location for d in result.diagnostics)
