"""Renderers: diagnostics (human, concise) and the plan as text for a 100-column terminal.
JSON lives in vime.emit.plan_json; all three read the same Diagnostic model."""

from __future__ import annotations

import shlex
import textwrap

from vime.check import disk
from vime.diagnostics import Diagnostic
from vime.layout import COORDINATES
from vime.plan import Plan
from vime.plan.evidence import KINDS, LEGEND, MARKS
from vime.plan.memory import RAY_OBJECT_STORE_FRACTION
from vime.plan.stages import describe_split
from vime.plan.torch_memory import torch_memory, uses_torch_backend
from vime.words import count_unit, plural

WIDTH = 100


# train.transformer_impl as the plan says it (runtime/megatron/model.py decides auto at start)
def _dispatch(spec, layout) -> str:
    """How the actor's MoE layers send tokens to other ranks' experts
    (train.moe_token_dispatcher)."""
    if spec.train.moe_token_dispatcher == "alltoall":
        return f"alltoall (NCCL all-to-all over ep {layout.ep})"
    return (f"flex, {spec.train.moe_flex_backend} over etp × ep = {layout.etp * layout.ep} "
            "ranks (deep_ep on every training node)")


_LAYER_SPEC = {
    "auto": "auto (Transformer Engine where it imports on the nodes, else local)",
    "transformer_engine": "Transformer Engine (TE attention, fused norms, TEGroupedMLP)",
    "local": "local (torch SDPA attention, grouped-GEMM experts)",
}


def _sequence_path(spec) -> str:
    """How the actor lays a micro-batch's samples out (runtime/backends/megatron_train.py,
    packing): packed into one row under the Megatron backend with pack_sequences and cp = 1,
    else padded to the longest, and why."""
    origin = spec.origin("train.pack_sequences").describe()
    if spec.train.backend != "megatron":
        return f"padded to the longest sample (the {spec.train.backend} backend pads)"
    if not spec.train.pack_sequences:
        return f"padded to the longest sample (pack_sequences = false, from {origin})"
    if spec.train.parallel.cp > 1:
        return (f"padded to the longest sample (cp = {spec.train.parallel.cp}: packed "
                "sequences need cp = 1)")
    return f"packed into one row, no padding (pack_sequences, from {origin})"


def human(diag: Diagnostic) -> str:
    lines = [f"{diag.severity}[{diag.code}]: {diag.message}"]
    loc = diag.location
    if loc is not None:
        gutter = " " * len(str(loc.line))
        lines.append(f"{gutter}--> {loc.file}:{loc.line}:{loc.col}")
        if loc.text:
            lines += [f"{gutter} |", f"{loc.line} | {loc.text}",
                      f"{gutter} | {' ' * (loc.col - 1)}^"]
    for path, where in diag.related:
        lines.append(f"  = {'.'.join(map(str, path))} at {where.file}:{where.line}:{where.col}")
    if diag.help:
        lines.append(f"help: {diag.help}")
    return "\n".join(lines) + "\n"


def concise(diag: Diagnostic) -> str:
    loc = diag.location
    where = f"{loc.file}:{loc.line}:{loc.col}: " if loc else ""
    tail = f" (help: {diag.help})" if diag.help else ""
    return f"{where}{diag.severity}[{diag.code}] {diag.key}: {diag.message}{tail}\n"


def summary(diagnostics: list[Diagnostic]) -> str:
    errors = sum(d.severity == "error" for d in diagnostics)
    warnings = len(diagnostics) - errors
    return f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}\n"


# -- plan as text ------------------------------------------------------------------------

def _groups_line(name: str, flat: list[int], size: int, limit: int = 6) -> str:
    """The number and size of one kind's groups (Layout.members: flat, `size` ranks each) and
    the first few; a group longer than the line is cut at WIDTH ranks, which the line's own cut
    at WIDTH characters hides."""
    count = len(flat) // size
    shown = " ".join("[" + ",".join(map(str, flat[i * size:i * size + min(size, WIDTH)])) + "]"
                     for i in range(min(limit, count)))
    more = f" … {count - limit} more" if count > limit else ""
    text = f"  {name:<4} {count:>3} × {size}: {shown}{more}"
    return text if len(text) <= WIDTH else text[: WIDTH - 1] + "…"


# A plan of many nodes or engines prints the first few and the last one and says which it left
# out, as numpy prints a long array (4,096 nodes × 64 GPUs in full are 23-43 MB of text, a
# line per engine and a block per node); `vime plan --json` lists every one. Up to SHOWN_IN_FULL
# of each, and an engine's nodes up to NODES_LISTED, the text is what it always was.
SHOWN_IN_FULL = 16
NODES_SHOWN = 2  # first nodes shown beyond SHOWN_IN_FULL, then the last
ENGINES_SHOWN = 6  # first engines shown beyond SHOWN_IN_FULL (as many as groups), then the last
NODES_LISTED = 8  # an engine on more nodes names them as a range: "nodes 0–15"


def _shown(count: int, first: int) -> list[int]:
    """The items of `count` the text prints: all of them, or the first ones and the last."""
    return list(range(count)) if count <= SHOWN_IN_FULL else [*range(first), count - 1]


def _nodes(first: int, last: int) -> str:
    """Nodes first to last as a range: "node 3", "nodes 0–4095"."""
    return f"node {first}" if first == last else f"nodes {first}–{last}"


def _cluster_picture(plan: Plan) -> list[str]:
    """A block of rows per node shown (more when its GPUs do not fit in one): the GPU, then
    the actor rank, its coordinates and the engine on each GPU."""
    spec, engines, layout = plan.spec, plan.engines, plan.layout
    gpn, nodes = spec.cluster.gpus_per_node, _shown(spec.cluster.nodes, NODES_SHOWN)
    actor = len(plan.ranks)
    label = 9
    per_row = max(1, min(gpn, (WIDTH - label) // 7))
    cell = max(5, min(9, (WIDTH - label) // per_row))
    gpus = [node * gpn + gpu for node in nodes for gpu in range(gpn)]
    coords = [layout.coordinates(g) if g < actor else None for g in gpus]

    def cells(values) -> list[str]:  # · where the GPU has no rank or no engine
        return [("·" if value is None else str(value)).ljust(cell) for value in values]

    rows = {"": [f"gpu{gpu}".ljust(cell) for gpu in range(gpn)] * len(nodes),
            "rank": cells(g if g < actor else None for g in gpus)}
    for axis in COORDINATES:
        rows[axis] = cells(None if c is None else c[axis] for c in coords)
    used = engines.start + len(engines) * engines.size
    rows["engine"] = cells(f"e{(g - engines.start) // engines.size}"
                           if engines.start <= g < used else None for g in gpus)
    # the last cell of a line unpadded (as the lines' rstrip did)
    starts = range(0, gpn, per_row)
    for end in (min(first + per_row, gpn) - 1 for first in starts):
        for row in rows.values():
            row[end::gpn] = list(map(str.rstrip, row[end::gpn]))
    lines = []
    for shown, node in enumerate(nodes):
        if shown and node != nodes[shown - 1] + 1:
            lines.append(f"… {_nodes(nodes[shown - 1] + 1, node - 1)} not shown "
                         f"({plural(node - 1 - nodes[shown - 1], 'node')}; "
                         "`vime plan --json` lists every GPU)")
        for first in starts:
            lines.append(f"node {node}" + ("" if first == 0 else " (cont.)"))
            block = slice(shown * gpn + first, shown * gpn + min(first + per_row, gpn))
            lines += [f"  {name:<{label - 2}}" + "".join(row[block]) for name, row in rows.items()]
    return lines


def _engine_lines(plan: Plan) -> list[str]:
    """A line per engine shown: they differ only in their index and nodes."""
    e = plan.engines
    experts = (f"{e.physical_experts} physical experts ({e.redundant_experts} redundant), "
               f"{e.experts_per_gpu} per GPU" if e.physical_experts else "dense")
    gpn = e.gpus_per_node

    def nodes_of(index: int) -> tuple[int, int]:  # an engine's GPUs are consecutive
        first = e.start + index * e.size
        return first // gpn, (first + e.size - 1) // gpn

    lines, shown = [], _shown(len(e), ENGINES_SHOWN)
    for at, index in enumerate(shown):
        if at and index != shown[at - 1] + 1:
            left_out = range(shown[at - 1] + 1, index)
            lines.append(f"  … e{left_out[0]}–e{left_out[-1]} not shown "
                         f"({plural(len(left_out), 'engine')} like these, on "
                         f"{_nodes(nodes_of(left_out[0])[0], nodes_of(left_out[-1])[1])})")
        first, last = nodes_of(index)
        if first == last or last - first >= NODES_LISTED:
            where = _nodes(first, last)
        else:
            where = "nodes " + ",".join(map(str, range(first, last + 1)))
        lines.append(f"  e{index}: TP {e.tp} × DP {e.dp}, EP {e.ep}, {where}; {experts}")
    return lines


PLANNING_ONLY = ("PLANNING ONLY: vime's runtime cannot run this model or its engines' quantization "
                 "(V102, V124 below); the layout, "
                 "groups and memory\nare shown for study, and `vime compile` and `vime submit` "
                 "refuse the spec.\n\n")


def plan_text(plan: Plan) -> str:
    spec, layout, batch = plan.spec, plan.layout, plan.batch
    arch, d = spec.arch, spec.derived
    out = [f"vime plan: {spec.experiment.name}", ""]
    torch_only = spec.train.backend == spec.inference.backend == "torch"
    if torch_only:
        # cluster.gpu only feeds the Megatron/vLLM memory model; torch runs on what it finds
        cards = f"{plural(spec.cluster.gpus_per_node, 'GPU')} = {plural(d.world_size, 'GPU')}"
    else:
        mem = f", {d.gpu_memory_gib:g} GiB each" if d.gpu_memory_gib else ""
        cards = (f"{spec.cluster.gpus_per_node} {spec.cluster.gpu} = "
                 f"{plural(d.world_size, 'GPU')}{mem}")
    cluster = f"cluster   {plural(spec.cluster.nodes, 'node')} × {cards};"
    sharing = ("colocated: actor and rollout share every GPU" if spec.train.colocate else
               f"actor on {plural(spec.train.num_gpus, 'GPU')}, rollout on "
               f"{spec.inference.num_gpus}")
    # a cluster of thousands of nodes puts the second half on a line of its own
    out += ([f"{cluster} {sharing}"] if len(cluster) + 1 + len(sharing) <= WIDTH
            else [cluster, f"          {sharing}"])
    if torch_only:
        out.append("          torch backends: each rank and engine takes a CUDA device where there "
                   "is one, else the CPU")
    moe = (f"{arch.num_experts} experts, top-{arch.topk}, {arch.num_moe_layers}/{arch.num_layers} "
           "MoE layers" if arch.is_moe else "dense")
    out.append(f"model     {arch.model_type}: {arch.num_layers} layers, hidden {arch.hidden_size}, "
               f"{arch.num_attention_heads} heads / {arch.num_kv_heads} KV, {moe}")
    sizes = (f"          {count_unit(arch.params_total)} parameters, "
             f"{count_unit(arch.params_active)} active per token")
    origin = f"(from {spec.origin('model.arch').describe()})"
    # a long path (config.json of an absolute checkpoint folder) goes on its own line
    out += ([f"{sizes} {origin}"] if len(sizes) + len(origin) < 100
            else [sizes, f"          {origin}"])
    engine = "vLLM" if spec.inference.backend == "vllm" else spec.inference.backend
    out += ["", f"GPUs (Megatron coordinates of the actor rank; e = {engine} engine)"]
    out += _cluster_picture(plan)
    why_dp = f"{spec.train.num_gpus} ÷ (tp {layout.tp} × cp {layout.cp} × pp {layout.pp})"
    why_edp = f"{spec.train.num_gpus} ÷ (etp {layout.etp} × ep {layout.ep} × pp {layout.pp})"
    sp = " + sp" if spec.train.parallel.sequence_parallel else ""
    actor = "Megatron actor" if spec.train.backend == "megatron" else f"{spec.train.backend} actor"
    out += ["", f"{actor} (groups as RankGenerator, order tp-cp-ep-dp-pp)",
            f"  dense:  tp {layout.tp}{sp}, cp {layout.cp}, pp {layout.pp}, dp {layout.dp} = {why_dp}",
            f"  expert: ep {layout.ep}, etp {layout.etp}, edp {layout.edp} = {why_edp}"]
    out += [_groups_line(name, flat, size) for name, (flat, size) in layout.members().items()]
    if spec.train.backend == "megatron":
        line = f"  layer spec: {_LAYER_SPEC[spec.train.transformer_impl]}"
        origin = f"(from {spec.origin('train.transformer_impl').describe()})"
        out += ([f"{line} {origin}"] if len(line) + len(origin) < 100
                else [line, f"              {origin}"])
        if spec.arch.is_moe:
            out.append(f"  MoE dispatch: {_dispatch(spec, layout)}")
    out.append(f"  micro-batches: {_sequence_path(spec)}")
    if spec.train.extra_args:  # after vime's own flags in megatron.args
        out.append(f"  extra Megatron flags: {shlex.join(spec.train.extra_args)}")
    out += _pipeline_lines(plan)
    rollout = "vLLM" if spec.inference.backend == "vllm" else spec.inference.backend
    out += ["", f"{rollout} rollout: {plural(len(plan.engines), 'engine')} of "
            f"{plural(spec.inference.gpus_per_engine, 'GPU')}"]
    out += _engine_lines(plan)
    out += ["", "batch"]
    out.append(f"  {plural(batch.rollout_batch_size, 'prompt')} × "
               f"{plural(batch.n_samples_per_prompt, 'sample')} = "
               f"{plural(batch.samples_per_rollout, 'sample')} per rollout = "
               f"{plural(batch.steps_per_rollout, 'step')} "
               f"× global batch {batch.global_batch_size}")
    if batch.dynamic_batch:
        out.append(f"  {plural(batch.samples_per_dp_rank, 'sample')} per dp rank per step, packed into "
                   f"micro-batches of ≤ {batch.max_tokens_per_gpu} tokens per GPU (dynamic)")
    else:
        out.append(f"  {plural(batch.samples_per_dp_rank, 'sample')} per dp rank per step = "
                   f"{plural(batch.micro_batches_per_step, 'micro-batch', 'micro-batches')} of "
                   f"{batch.micro_batch_size}")
    out.append(f"  {plural(spec.rollout.num_rollout, 'rollout')} → "
               f"{plural(spec.rollout.num_rollout * batch.steps_per_rollout, 'optimizer step')}")
    out.append(f"  {_algorithm_line(spec)}")
    out.append(f"  {_lr_line(spec.train.optimizer)}")
    out += _hf_lines(spec)
    out += disk.plan_lines(spec)
    out += _sampling_lines(spec)
    out += _async_lines(spec)
    out += _function_lines(spec)
    out += _eval_lines(spec)
    out += _memory_text(plan)
    out += _colocation_text(plan)
    out += _forecast_text(plan)
    out += _folders_lines(spec)
    return "\n".join(out) + "\n"


def _folders_lines(spec) -> list[str]:
    """The absolute folders a run of the spec writes, and the rule its relative paths follow."""
    found = spec.run_folders
    if found is None:
        return []
    out = ["", "writes (experiment.output_dir is read from the folder vime runs in, the data and "
           "model", "        paths from the spec's folder: docs/spec.md, \"Paths\")",
           f"  job folders  {found.experiment}/<job id>/",
           f"  checkpoints  {found.checkpoints}/"
           + (f" ({found.checkpoints_key})" if found.checkpoints_key == "model.save" else "")]
    return out


def _function_lines(spec) -> list[str]:
    """The rollout function and its limits: what bounds a multi-turn sample."""
    roll = spec.rollout
    if not roll.function:
        return []
    turns = roll.max_turns or 8
    return [f"  rollout function {roll.function}: ≤ {plural(turns, 'turn')} of ≤ "
            f"{roll.max_response_len} tokens, ≤ {roll.sample_tokens} tokens after",
            f"    the prompt (engines' max_model_len {roll.max_prompt_len} + "
            f"{spec.max_model_len - roll.max_prompt_len} = {spec.max_model_len})"]


def _algorithm_line(spec) -> str:
    algo = spec.algorithm
    return (f"advantages {algo.advantage_estimator}, loss {algo.loss_aggregation}, clip "
            f"[1 − {algo.eps_clip:g}, 1 + {algo.eps_clip_high:g}]"
            + (" on the sequence ratio" if algo.advantage_estimator == "gspo" else ""))


def _hf_lines(spec) -> list[str]:
    """HF model folders of checkpoint.save_hf_interval (none when it is 0)."""
    every, rollouts = spec.checkpoint.save_hf_interval, spec.rollout.num_rollout
    if not every:
        return []
    count = rollouts // every + (1 if rollouts % every else 0)
    folder = spec.run_folders.checkpoints if spec.run_folders else spec.model.save
    return [f"  HF model folder every {plural(every, 'rollout')} and after the last "
            f"({plural(count, 'folder')}): {folder}/hf/rollout_XXXXXX/"]


def _lr_line(opt) -> str:
    warmup = (f"warmup {plural(opt.lr_warmup_iters, 'step')} to {opt.lr:g}, "
              if opt.lr_warmup_iters else f"lr {opt.lr:g}, ")
    if opt.lr_decay_style == "constant":
        return warmup + "then constant"
    return warmup + f"{opt.lr_decay_style} decay to {opt.min_lr:g} at step {opt.lr_decay_iters}"


def _sampling_lines(spec) -> list[str]:
    """Dynamic sampling and overlong handling, when on."""
    roll, out = spec.rollout, []
    if roll.dynamic_sampling:
        extra = f", then {roll.dynamic_sampling_filter}" if roll.dynamic_sampling_filter else ""
        out.append(f"  dynamic sampling: groups of equal rewards dropped{extra}")
        out.append(f"    refilled by {plural(roll.over_sampling_batch_size, 'prompt')} per "
                   f"attempt, at most {plural(roll.dynamic_sampling_max_attempts, 'attempt')} "
                   "per rollout")
    if roll.overlong == "mask":
        out.append(f"  overlong: responses cut at {roll.max_response_len} tokens get advantage 0")
    elif roll.overlong == "penalty":
        start = roll.max_response_len - roll.overlong_buffer_len
        out.append(f"  overlong: reward − (length − {start}) ÷ {roll.overlong_buffer_len} × "
                   f"{roll.overlong_penalty_factor:g} beyond {start} tokens")
    return out


def _eval_lines(spec) -> list[str]:
    """The evaluation batch: when, and each dataset's samples and sampling."""
    ev = spec.eval
    if not ev.datasets:
        return []
    when = [f"every {plural(ev.interval, 'rollout')}"] if ev.interval else []
    when += ["at start"] * ev.at_start + ["at end"] * ev.at_end
    out = ["", f"eval ({', '.join(when) or 'never: no interval, at_start or at_end'}); "
           f"engines' max_model_len {spec.max_model_len}"]
    for d in ev.datasets:
        ks = ",".join(str(k) for k in pass_at_ks(d.n_samples_per_prompt))
        out.append(f"  {d.name}: {d.prompt_data}, reward {d.reward}")
        out.append(f"    {plural(d.n_samples_per_prompt, 'sample')} per prompt, ≤ "
                   f"{d.max_response_len} tokens, temperature {d.temperature:g}, "
                   f"top-p {d.top_p:g}; pass@{ks}")
    return out


def pass_at_ks(n: int) -> list[int]:
    """The k of pass@k reported for n samples per prompt: 1, 2, 4, ... and n."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return ks if ks[-1] == n else [*ks, n]


def _pipeline_lines(plan: Plan) -> list[str]:
    """The stages (pp > 1): their layers, the 1F1B schedule's micro-batches and its bubble,
    and the busiest stage's training peak."""
    pipe = plan.pipeline
    if pipe is None:
        return []
    spec, stages = plan.spec, pipe.stages
    out = [f"  pipeline: {pipe.pp} stages of {describe_split(tuple(s.num_layers for s in stages))} layers "
           "(1F1B); stage 0 holds the embeddings,",
           f"    stage {pipe.pp - 1} the final norm, the output layer and the loss head"]
    if pipe.micro_batches is not None:
        m, p = pipe.micro_batches, pipe.pp
        out += [f"    m = {plural(m, 'micro-batch', 'micro-batches')} per step per dp rank = "
                f"global batch {spec.train.global_batch_size} ÷ (micro batch "
                f"{spec.train.micro_batch_size} × dp {plan.layout.dp});",
                f"    the stages idle (p − 1) ÷ (m + p − 1) = {p - 1} ÷ {m + p - 1} = "
                f"{pipe.bubble:.0%} of a step"]
    else:
        out += [f"    dynamic_batch: micro-batches of ≤ {spec.train.max_tokens_per_gpu} tokens, "
                "as many as each step needs; every rank",
                "    runs the most any rank packs (all-reduced, as slime does): one schedule for "
                "every stage;",
                f"    ≤ {pipe.most_micro_batches} per step per dp rank "
                f"({pipe.full_length_micro_batches} with every sample at full length); "
                f"fewer than {pipe.pp} idle stages"]
    mem = plan.memory
    if mem is not None and mem.stages:
        busiest = mem.stages[mem.busiest_stage].stage
        what = [f"layers {busiest.first_layer}–{busiest.last_layer}" if busiest.num_layers > 1
                else f"layer {busiest.first_layer}"]
        what += ["embeddings"] * busiest.embedding + ["loss head"] * busiest.output
        line = f"    busiest stage {busiest.index}: peak {mem.train.peak / 1024**3:.1f} GiB"
        held = (f"({', '.join(what)}; "
                f"{plural(busiest.in_flight, 'micro-batch', 'micro-batches')} in flight)")
        out += ([f"{line} {held}"] if len(line) + 1 + len(held) <= WIDTH
                else [line, f"      {held}"])
    return out


def _stage_peaks_lines(mem) -> list[str]:
    """Which pipeline stage the train lines are of, and every stage's peak (the first and last
    six of a long pipeline)."""
    peaks = [f"{m.stage.index}: {m.peak / 1024**3:.1f}," for m in mem.stages]
    if len(peaks) > 12:
        peaks = [*peaks[:6], "…", *peaks[-6:]]
    peaks[-1] = peaks[-1].rstrip(",")
    lines, line = [], f"    (pipeline stage {mem.busiest_stage}, the busiest; each stage's peak in GiB:"
    for part in peaks:
        if len(line) + len(part) + 2 > WIDTH:
            lines.append(line)
            line = "     "
        line += f" {part}"
    return [*lines, line + ")"]


def _forecast_text(plan: Plan) -> list[str]:
    found = plan.forecast
    if found is None:
        return []
    out = ["", f"step forecast per rollout ({found.mode}; every sample at max length): "
           f"{found.total:.1f} s"]
    for line in found.lines:
        share = line.seconds / found.total if found.total else 0.0
        text = (f"  {line.name:<12}{line.seconds:7.2f} s {share:4.0%} {line.basis.mark} "
                f"{line.note}")
        out.append(text if len(text) <= WIDTH else text[: WIDTH - 1] + "…")
    if found.asynchronous != "off":
        out.append(_async_forecast(found))
    out.append("  how each line was calibrated: docs/forecast.md; `vime plan --json`, "
               "forecast.phases[].basis")
    return out


def _async_forecast(found) -> str:
    """The step of rollout.async = "one_step": generation beside log-probs and training when
    they have GPUs of their own, else the total."""
    if not found.overlapped:
        return (f"  one-step async: {found.step:.1f} s, the total: actor and engines share "
                "the GPUs, no overlap counted")
    return (f"  one-step async: max(generate {found.seconds('generate'):.1f}, log-probs + train "
            f"{found.seconds('log-probs', 'train'):.1f}) + weight sync + overhead = "
            f"{found.step:.1f} s per rollout")


def _async_lines(spec) -> list[str]:
    """What overlaps with what under rollout.async = "one_step"."""
    roll, train, inference = spec.rollout, spec.train, spec.inference
    if roll.async_mode == "off":
        return []
    where = ("the same GPUs, both resident" if train.colocate
             else f"the engines' {plural(inference.num_gpus, 'GPU')} and the actor's "
             f"{train.num_gpus}")
    return [f"  async one_step: rollout k+1 generates (weights version k) while the actor "
            f"trains on rollout k, on {where}",
            f"    weights pushed between generations; samples lag 1 version "
            f"(max_staleness {roll.max_staleness})"]


def _colocation_text(plan: Plan) -> list[str]:
    found = plan.colocation
    if found is None:
        return []
    what = ("resident: no offload, no sleep" if found.mode == "resident"
            else "taking turns: the actor offloads, the engines sleep")
    return ["", f"colocation: {what} (train.offload = \"{found.setting}\")",
            *textwrap.wrap(found.why, WIDTH - 2, initial_indent="  ", subsequent_indent="  ")]


def _memory_text(plan: Plan) -> list[str]:
    mem = plan.memory
    if uses_torch_backend(plan.spec):
        torch = torch_memory(plan.spec)
        if torch is None:
            return ["", "memory: not planned (no model architecture)"]
        return ["", "memory (torch backends: fp32, the whole model on each device; activations "
                "not counted)",
                f"  actor rank  {_size(torch.actor_bytes)}  weights, gradients and 2 Adam moments",
                f"  engine      {_size(torch.engine_bytes)}  weights"]
    if mem is None:
        return ["", "memory: not planned (unknown GPU memory; set cluster.gpu_memory_gib)"]
    gib = 1024**3
    out = ["", f"memory per GPU ({mem.gpu_bytes / gib:g} GiB)",
           "  " + "  ".join(f"{MARKS[k]} {LEGEND[k]}" for k in KINDS)]
    roll = mem.rollout
    for phase in (mem.train, roll.phase):
        shares = phase.by_basis()
        out.append(f"  {phase.name:<8} peak {phase.peak / gib:6.1f} GiB, "
                   f"headroom {phase.headroom:.0%}; the peak by basis: "
                   + " ".join(f"{MARKS[k]} {shares[k] / gib:.1f}" for k in KINDS) + " GiB")
        if phase is mem.train and len(mem.stages) > 1:
            out += _stage_peaks_lines(mem)
        for term in phase.terms:
            line = f"    {term.name:<18}{term.bytes / gib:7.1f} {term.basis.mark} {term.note}".rstrip()
            out.append(line if len(line) <= WIDTH else line[: WIDTH - 1] + "…")
    out.append(f"  KV cache: {roll.kv_tokens} tokens per DP rank = {roll.sequences_at_once} "
               f"sequences of {roll.max_len} tokens at once per engine")
    out.append(f"            (a rollout gives each engine {plural(roll.samples_per_engine, 'sample')})")
    out.append("  what each mark rests on and the error seen: `vime plan --json`, "
               "memory.breakdown[].basis")
    if mem.host_terms:
        # the same total and parts as V804 (vime/check/memory.py) compares with the node
        if mem.host_capacity is not None:
            out.append(f"  host per node: {mem.host_per_node / gib:.1f} of "
                       f"{mem.host_capacity / gib:.1f} GiB, Ray's object store included")
        else:
            least = mem.host_per_node / (1 - RAY_OBJECT_STORE_FRACTION)
            out.append(f"  host per node: {mem.host_per_node / gib:.1f} GiB + Ray's object store "
                       f"({RAY_OBJECT_STORE_FRACTION:.0%} of the node): nodes of ≥ "
                       f"{least / gib:.1f} GiB")
        line = "   "
        for i, t in enumerate(mem.host_terms):
            part = (f" {t.name} {t.bytes / gib:.1f} {t.basis.mark}"
                    + (" +" if i < len(mem.host_terms) - 1 else ""))
            if len(line) + len(part) > WIDTH:
                out.append(line)
                line = "   "
            line += part
        out.append(line)
    return out


def _size(value: float) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= size:
            return f"{value / size:6.1f} {unit}"
    return f"{value:6.0f} B"
