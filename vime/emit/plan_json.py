"""plan.json / `vime plan --json`: the object described in docs/spec.md."""

from __future__ import annotations

import operator
from itertools import chain, repeat

from vime.diagnostics import Diagnostic
from vime.emit import jsontext
from vime.emit.jsontext import Chunks, Rows
from vime.plan import Plan
from vime.plan.memory import GiB
from vime.resolve.spec import Spec


def diagnostic_json(diag: Diagnostic) -> dict:
    loc = diag.location
    out = {"severity": diag.severity, "code": diag.code, "path": diag.key,
           "file": loc.file if loc else None, "line": loc.line if loc else None,
           "col": loc.col if loc else None, "message": diag.message, "help": diag.help}
    if diag.related:
        out["related"] = [{"path": ".".join(map(str, p)), "file": r.file, "line": r.line,
                           "col": r.col} for p, r in diag.related]
    return out


def _model(spec: Spec) -> dict | None:
    arch = spec.arch
    if arch is None:
        return None
    return {
        "name": spec.model.preset or spec.model.hf_checkpoint.rstrip("/").rsplit("/", 1)[-1],
        "source": spec.origin("model.arch").describe(),
        "model_type": arch.model_type, "num_layers": arch.num_layers,
        "hidden_size": arch.hidden_size, "num_attention_heads": arch.num_attention_heads,
        "num_kv_heads": arch.num_kv_heads, "head_dim": arch.head_dim,
        "vocab_size": arch.vocab_size, "num_experts": arch.num_experts, "topk": arch.topk,
        "moe_layers": arch.num_moe_layers, "params_total": arch.params_total,
        "params_active": arch.params_active,
    }


def plan_object(spec_name: str, diagnostics: list[Diagnostic], spec: Spec | None,
                plan: Plan | None) -> dict:
    """The plan as JSON data, for `dumps`. Its arrays of ranks, groups and engines are Rows and
    Chunks (vime/emit/jsontext.py): read-only sequences of the dicts and lists they stand for,
    held as columns, since a plan can have 262,144 of each (json.dumps does not know them)."""
    ok = not any(d.severity == "error" for d in diagnostics)
    out: dict = {"spec": spec_name, "ok": ok,
                 "diagnostics": [diagnostic_json(d) for d in diagnostics]}
    if spec is None:
        return out
    cluster = spec.cluster
    out["cluster"] = {"nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node,
                      "world_size": spec.derived.world_size, "gpu": cluster.gpu,
                      "gpu_memory_gib": spec.derived.gpu_memory_gib}
    out["model"] = _model(spec)
    out["colocate"] = spec.train.colocate
    out["origins"] = {key: origin.describe() for key, origin in sorted(spec.origins.items())
                      if origin.kind in ("derived", "preset", "config.json", "arch", "set")}
    if plan is None:
        return out
    layout, ranks, engines = plan.layout, plan.ranks.columns(), plan.engines
    out["train"] = {
        "num_gpus": spec.train.num_gpus, **layout.to_plan(),
        "sequence_parallel": spec.train.parallel.sequence_parallel,
        "groups": {name: Chunks(flat, size) for name, (flat, size) in layout.members().items()},
        # {"rank", "node", "gpu", then ActorRank.coords: tp, cp, dp, pp, ep, etp, edp}
        "ranks": Rows(list(ranks), list(ranks.values())),
    }
    if plan.pipeline is not None:
        out["train"]["pipeline"] = _pipeline(plan)
    count = len(engines)
    nodes, gpus = engines.gpu_columns()
    out["rollout"] = {
        "num_gpus": spec.inference.num_gpus, "gpus_per_engine": spec.inference.gpus_per_engine,
        "num_engines": count,
        "engines": Rows(
            ("engine", "tp", "dp", "ep", "nodes", "gpus", "physical_experts",
             "redundant_experts", "experts_per_gpu"),
            (range(count), [engines.tp] * count, [engines.dp] * count, [engines.ep] * count,
             _node_lists(*engines.node_ends()),
             Chunks(Rows(("node", "gpu"), (nodes, gpus)), engines.size) if count else [],
             [engines.physical_experts] * count, [engines.redundant_experts] * count,
             [engines.experts_per_gpu] * count)),
    }
    b = plan.batch
    out["batch"] = {
        "rollout_batch_size": b.rollout_batch_size, "n_samples_per_prompt": b.n_samples_per_prompt,
        "samples_per_rollout": b.samples_per_rollout, "global_batch_size": b.global_batch_size,
        "steps_per_rollout": b.steps_per_rollout, "micro_batch_size": b.micro_batch_size,
        "dynamic_batch": b.dynamic_batch, "max_tokens_per_gpu": b.max_tokens_per_gpu,
        "samples_per_dp_rank": b.samples_per_dp_rank,
        "micro_batches_per_step": b.micro_batches_per_step,
        "num_rollout": spec.rollout.num_rollout,
    }
    out["memory"] = _memory(plan)
    out["colocation"] = _colocation(plan)
    out["forecast"] = _forecast(plan)
    return out


def _pipeline(plan: Plan) -> dict:
    """The stages (pp > 1): each one's layers, what it holds beside them, the micro-batches in
    flight at 1F1B's peak and its training peak; the step's micro-batches and bubble."""
    pipe, mem = plan.pipeline, plan.memory
    peaks = {m.stage.index: m.peak for m in mem.stages} if mem is not None else {}
    return {
        "schedule": "1F1B",
        "stages": [{"stage": s.index, "first_layer": s.first_layer, "num_layers": s.num_layers,
                    "moe_layers": s.num_moe_layers, "embedding": s.embedding,
                    "output_layer": s.output, "in_flight_micro_batches": s.in_flight,
                    "train_peak_gib": _gib(peaks[s.index]) if s.index in peaks else None}
                   for s in pipe.stages],
        "busiest_stage": mem.busiest_stage if mem is not None else None,
        "micro_batches_per_step": pipe.micro_batches,
        "most_micro_batches_per_step": pipe.most_micro_batches,
        "full_length_micro_batches_per_step": pipe.full_length_micro_batches,
        "bubble_fraction": None if pipe.bubble is None else round(pipe.bubble, 4),
    }


def _forecast(plan: Plan) -> dict | None:
    found = plan.forecast
    if found is None:
        return None
    out = {"mode": found.mode, "total_s": round(found.total, 2),
           "phases": [{"name": line.name, "seconds": round(line.seconds, 3), "note": line.note,
                       "basis": {"kind": line.basis.kind, "evidence": line.basis.evidence,
                                 "sources": list(line.basis.sources)}}
                      for line in found.lines]}
    if found.asynchronous != "off":
        # rollout.async: the step as the loop runs it (vime/plan/forecast.py, Forecast.step)
        out["async"] = {"mode": found.asynchronous, "overlapped": found.overlapped,
                        "step_s": round(found.step, 2)}
    return out


def _colocation(plan: Plan) -> dict | None:
    found = plan.colocation
    if found is None:
        return None
    return {"mode": found.mode, "offload": found.setting, "why": found.why,
            "actor_gib": None if found.actor_bytes is None else _gib(found.actor_bytes),
            "engine_gib": None if found.engine_bytes is None else _gib(found.engine_bytes),
            "fits": found.fits}


def _node_lists(firsts: list[int], lasts: list[int]):
    """Engine.nodes of each engine, from its first and last node: as Chunks when all engines
    span as many nodes (they do when V502 passes)."""
    if firsts == lasts:
        return Chunks(firsts, 1)
    spans = set(map(operator.sub, lasts, firsts))
    stops = list(map(operator.add, lasts, repeat(1)))
    if len(spans) == 1:
        return Chunks(list(chain.from_iterable(map(range, firsts, stops))), spans.pop() + 1)
    return list(map(list, map(range, firsts, stops)))


def _gib(value: float) -> float:
    return round(value / GiB, 2)


def _memory(plan: Plan) -> dict | None:
    mem = plan.memory
    if mem is None:
        return None

    def basis(b):
        return {"kind": b.kind, "evidence": b.evidence, "sources": list(b.sources)}

    def terms(items):
        out = []
        for t in items:
            term = {"name": t.name, "gib": _gib(t.bytes), "note": t.note, "basis": basis(t.basis)}
            if t.parts:
                term["parts"] = terms(t.parts)
            out.append(term)
        return out

    def by_basis(phase):
        return {kind: _gib(value) for kind, value in phase.by_basis().items()}

    roll = mem.rollout
    return {
        "gpu_gib": _gib(mem.gpu_bytes),
        "train_peak_gib": _gib(mem.train.peak),
        **({"train_busiest_stage": mem.busiest_stage} if len(mem.stages) > 1 else {}),
        "rollout_peak_gib": _gib(roll.phase.peak),
        "host_gib_per_node": _gib(mem.host_per_node),
        "host_memory_gib": _gib(mem.host_capacity) if mem.host_capacity is not None else None,
        "kv_cache": {"tokens_per_dp_rank": roll.kv_tokens, "bytes_per_token": roll.kv_bytes_per_token,
                     "max_len": roll.max_len, "sequences_at_once_per_engine": roll.sequences_at_once,
                     "samples_per_engine": roll.samples_per_engine},
        "breakdown": {"train": terms(mem.train.terms), "rollout": terms(roll.phase.terms),
                      "host": terms(mem.host_terms)},
        # how much of each peak was checked against a measurement (vime/plan/evidence.py)
        "peak_by_basis_gib": {"train": by_basis(mem.train), "rollout": by_basis(roll.phase)},
    }


def dumps(obj: dict) -> str:
    """The text of plan.json: json.dumps(obj, indent=2, ensure_ascii=False) and a newline."""
    return jsontext.dumps(obj, end="\n")


def write(obj: dict, stream) -> None:
    """stream.write(dumps(obj)), a part at a time (a big plan's text is 200 MB)."""
    jsontext.write(obj, stream, end="\n")
