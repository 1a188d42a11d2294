"""V7xx file checks: checkpoints on disk against the run.

resolve reads vime_layout.json beside model.torch_dist_checkpoint (Spec.torch_dist_layout,
V705 and V706) and the vime_checkpoint.json of the checkpoint a submit would resume from
(Spec.resume_checkpoint, V708 and V709), when they are on the machine vime runs on; these
rules only compare and report."""

from __future__ import annotations

import json
import shlex

from vime.check.registry import Finding, rule
from vime.resolve import LAYOUT_FILE, LAYOUT_SIZES
from vime.resolve.spec import ResumeCheckpoint, Spec
from vime.run_checkpoint import FORMATS, arch_differences, arch_values


def _run_sizes(spec: Spec) -> dict[str, int]:
    return {name: getattr(spec.train.parallel, name) for name in LAYOUT_SIZES}


def _convert_help(spec: Spec, folder: str) -> str:
    sizes = _run_sizes(spec)
    target = folder.rstrip("/") + "".join(f"_{name}{size}" for name, size in sizes.items())
    command = shlex.join(["vime", "convert", *spec.invocation, "--to", "torch_dist",
                          "-o", target])
    return f"{command}, then model.torch_dist_checkpoint = {json.dumps(target)}"


@rule("V705", "torch-dist-layout-matches-run", severity="warning", enforced_by="megatron")
def torch_dist_layout_matches_run(spec: Spec):
    """The torch_dist checkpoint was saved with another tp/pp/ep/etp than this run uses.

    With the Megatron backend model.torch_dist_checkpoint holds the initial and reference
    weights (megatron.args: --load), and megatron-core's dist-checkpointing reshards a
    checkpoint saved under another layout while it loads it. For expert parallelism that is
    very slow or hangs: the seed's troubleshooting says the checkpoint's EP must equal
    --expert-model-parallel-size, "otherwise load_checkpoint may be extremely slow or
    hang" (resharding enumerates the global shard grid of every expert tensor on every
    rank, Megatron-LM issue #7275), and the job only finds out after the queue wait, with
    every GPU of the allocation idle. vime reads the layout from the vime_layout.json that
    `vime convert` writes beside the checkpoint, when that folder is readable where vime
    runs; a folder that is not there is not checked.
    Fix: write a checkpoint in this run's layout, `vime convert SPEC --to torch_dist -o
    NEW_FOLDER` (the help line gives the exact command), and set model.torch_dist_checkpoint
    to NEW_FOLDER; or set train.parallel to the layout the checkpoint was saved with."""
    saved = spec.torch_dist_layout
    if spec.train.backend != "megatron" or saved is None or saved.sizes is None:
        return
    run = _run_sizes(spec)
    differ = [name for name in LAYOUT_SIZES if saved.sizes[name] != run[name]]
    if not differ:
        return
    was = " ".join(f"{name}={saved.sizes[name]}" for name in differ)
    now = " ".join(f"{name}={run[name]}" for name in differ)
    yield Finding("model.torch_dist_checkpoint",
                  f"the checkpoint was saved with {was}; this run uses {now}: megatron-core "
                  "reshards on load, which for expert parallelism is very slow or hangs (the "
                  "seed's troubleshooting)",
                  help=_convert_help(spec, saved.folder),
                  related=tuple(f"train.parallel.{name}" for name in differ))


@rule("V706", "torch-dist-layout-unknown", severity="warning", enforced_by="megatron")
def torch_dist_layout_unknown(spec: Spec):
    """The torch_dist checkpoint has no readable vime_layout.json: its layout is unknown.

    V705 compares the tp/pp/ep/etp a torch_dist checkpoint was saved with against the run's,
    because megatron-core reshards a checkpoint of another layout while it loads, which
    for expert parallelism is very slow or hangs (the seed's troubleshooting). That layout
    is recorded in vime_layout.json, written by `vime convert`; a checkpoint converted by
    another tool (slime's convert_hf_to_torch_dist.py, Megatron's own scripts) has none, and
    vime cannot tell whether loading it will reshard. Checked only when the folder is on
    the machine vime runs on, for the Megatron backend.
    A warning rather than a quieter level: vime's diagnostics are errors or warnings in
    every renderer and in `vime plan --json`, a warning never fails a command, and with
    --strict a layout vime cannot verify is what a user asked to stop on.
    Fix: convert with `vime convert SPEC --to torch_dist -o NEW_FOLDER`, which records the
    layout; or, when you know the layout the checkpoint was saved with, write it into the
    folder as vime_layout.json: {"tp": 4, "pp": 1, "ep": 8, "etp": 1}."""
    saved = spec.torch_dist_layout
    if spec.train.backend != "megatron" or saved is None or saved.problem is None:
        return
    example = json.dumps(_run_sizes(spec))
    yield Finding("model.torch_dist_checkpoint",
                  f"{saved.folder} {saved.problem}: vime cannot tell which tp/pp/ep/etp it "
                  "was saved with",
                  help=f"{_convert_help(spec, saved.folder)}; or, if it was saved with this "
                  f"run's layout, write {example} into {saved.folder}/{LAYOUT_FILE}")


# ------------------------------------------------------------------ the checkpoint a resume loads

def _start_over(spec: Spec, saved: ResumeCheckpoint) -> str:
    if saved.folder_key != "experiment.output_dir":
        return f"set {saved.folder_key} to another folder"
    command = shlex.join(["vime", "submit", "--fresh", *spec.invocation])
    return (f"`{command}` (a new run beside this one; nothing is deleted) or another "
            "experiment.output_dir")


def _fix(spec: Spec, saved: ResumeCheckpoint, resume_with: str) -> str:
    return f"to resume it, {resume_with}; to start over instead, {_start_over(spec, saved)}"


def _arch_key(spec: Spec, name: str) -> str:
    """The key that gave this run's value of a config.json key."""
    if name in spec.model.arch:
        return f"model.arch.{name}"
    kind = spec.origin("model.arch").kind
    return {"config.json": "model.hf_checkpoint", "preset": "model.preset"}.get(kind, "model.arch")


def _toml(value) -> str:
    return json.dumps(value)  # ints, booleans, strings and lists of ints read the same in TOML


@rule("V708", "resume-checkpoint-fits-model", enforced_by="vime")
def resume_checkpoint_fits_model(spec: Spec):
    """The checkpoint this run would resume from was written by another model or backend.

    `vime submit` resumes from the newest checkpoint of model.load, else model.save, else
    <output_dir>/<experiment.name>/checkpoints. After a change of [model.arch] (or of
    config.json, or the preset) that resume loads tensors of the old shapes into the new
    model: the torch backend fails in load_state_dict with one `size mismatch for ...` line
    per tensor (`RayTaskError(RuntimeError): ray::TrainWorker.load()`, 40 s after the
    submit), the Megatron backend in dist-checkpointing; a checkpoint of the other
    training backend is missing the files this one reads (train/model_optim.pt for torch,
    train/torch_dist/ for megatron). Every checkpoint vime writes holds a
    vime_checkpoint.json with the values that decide its tensors (the model type, layers,
    hidden size, heads, key-value heads, head dim, vocabulary, tied embeddings, which layers
    are dense, the MLP and expert widths, the expert count) and its backend; vime compares
    them with the spec when that folder is on the machine vime runs on. A checkpoint written
    before the record existed is not checked. rope_theta, rms_norm_eps and the router's
    top-k do not shape a tensor and are not compared.
    `vime convert` does not help here: it converts model.hf_checkpoint into the initial
    weights (model.torch_dist_checkpoint), not a run's checkpoint with its optimizer state,
    and no conversion changes a model's shape.
    Fix: to resume the run, set the spec back to the values the checkpoint was written with
    (the message lists them); to train the new model, start a new run: `vime submit --fresh
    SPEC` makes <experiment.name>-2 beside the old run and deletes nothing, or set another
    experiment.output_dir (or, when the spec sets them, another model.load / model.save)."""
    saved = spec.resume_checkpoint
    if saved is None:
        return
    if saved.record is None:
        yield Finding(saved.folder_key,
                      f"{saved.record_path} {saved.problem}: vime cannot tell which model and "
                      f"layout wrote {saved.checkpoint}, the checkpoint a submit resumes from",
                      help=f"if this run wrote it, resume as before; otherwise "
                      f"{_start_over(spec, saved)}", severity="warning")
        return
    record = saved.record
    if record["train_backend"] != spec.train.backend:
        written = FORMATS.get(record["train_backend"])
        reads = FORMATS.get(spec.train.backend)
        yield Finding("train.backend",
                      f"{saved.checkpoint}, the checkpoint a submit resumes from, was written "
                      f"by the {record['train_backend']} training backend (format "
                      f"{written.name if written else record.get('format')}, {saved.record_path})"
                      f"; this run's {spec.train.backend} backend reads "
                      f"{reads.name if reads else spec.train.backend} checkpoints and cannot "
                      "load it",
                      help=_fix(spec, saved, f"set train.backend = {_toml(record['train_backend'])}"),
                      related=(saved.folder_key,))
    if spec.arch is None:
        return
    now = arch_values(spec.arch)
    differ = arch_differences(record["arch"], now)
    if not differ:
        return
    keys = [_arch_key(spec, name) for name in differ]
    written = all(name in spec.model.arch for name in differ)
    source = "[model.arch]" if written else spec.origin("model.arch").describe()
    values = "; ".join(f"{name} {_toml(record['arch'][name])} in the checkpoint, "
                       f"{_toml(now[name])} in this spec" for name in differ)
    yield Finding(keys[0],
                  f"{saved.checkpoint}, the checkpoint a submit resumes from, was written by "
                  f"another model: {values} (the checkpoint's from {saved.record_path}, this "
                  f"spec's from {source}); loading it would fail on the first tensor of "
                  "another shape, after the job has started",
                  help=_fix(spec, saved, "set " + ", ".join(
                      f"model.arch.{name} = {_toml(record['arch'][name])}" for name in differ)),
                  related=(*keys[1:], saved.folder_key))


@rule("V709", "resume-checkpoint-loads-under-layout", enforced_by="megatron")
def resume_checkpoint_loads_under_layout(spec: Spec):
    """The checkpoint this run would resume from was saved under a layout its format cannot load.

    The Megatron backend saves a run's checkpoint with megatron-core's dist-checkpointing
    (train/torch_dist/): the model's tensors are stored by their global shape and reshard to
    any tp/pp/ep/etp, but the distributed optimizer's state is stored in megatron-core's
    `dp_reshardable` form, one tensor per gradient bucket of this rank's parameters, which
    (megatron-core 0.19, optimizer/distrib_optimizer.py) "allows checkpoint resharding only
    in DP dimension": under another tp, pp, ep or etp the load fails in dist-checkpointing
    ("Number of unpadded elements in each bucket need to be the same in current run ... and
    checkpoint", or keys it cannot find) after the job has started. dp, edp and cp may
    change (cp does not shape a parameter). Every rank also loads its own rng_rank<r>.pt
    (its RNG state and Adam's step count), so a run may have fewer training ranks than the
    one that saved it, not more. The torch backend's checkpoints (rank 0's whole model and
    optimizer) load under any number of data-parallel ranks, and it has no other
    parallelism. vime reads the layout from the vime_checkpoint.json that every checkpoint
    holds (a checkpoint written before it existed is not checked).
    `vime convert` does not reshard a run's checkpoint: it converts model.hf_checkpoint into
    model.torch_dist_checkpoint, the initial weights, which V705 compares.
    Fix: to resume the run, set train.parallel (and the number of training GPUs) back to the
    layout the checkpoint was saved with (the message gives it); to train under the new
    layout, start a new run: `vime submit --fresh SPEC` (a new run beside the old one,
    nothing deleted), or another experiment.output_dir (or model.load / model.save)."""
    saved = spec.resume_checkpoint
    if saved is None or saved.record is None or saved.record["train_backend"] != spec.train.backend:
        return
    written = FORMATS.get(spec.train.backend)
    if written is None:
        return
    layout = saved.record["layout"]
    parallel = spec.train.parallel
    now = {name: getattr(parallel, name) for name in written.must_match}
    differ = [name for name in written.must_match if layout[name] != now[name]]
    if differ:
        was = " ".join(f"{name}={layout[name]}" for name in differ)
        uses = " ".join(f"{name}={now[name]}" for name in differ)
        keys = [f"train.parallel.{name}" for name in differ]
        yield Finding(keys[0],
                      f"{saved.checkpoint}, the checkpoint a submit resumes from, was saved with "
                      f"{was} ({saved.record_path}); this run uses {uses}: its {written.name} "
                      f"format loads only under the {', '.join(written.must_match)} it was saved "
                      "with (megatron-core's distributed optimizer state reshards over data "
                      "parallelism only)",
                      help=_fix(spec, saved, "set " + ", ".join(
                          f"train.parallel.{name} = {layout[name]}" for name in differ)),
                      related=(*keys[1:], saved.folder_key))
    ranks = spec.train.num_gpus
    if not written.more_ranks and ranks > layout["ranks"]:
        yield Finding("train.num_gpus",
                      f"{saved.checkpoint}, the checkpoint a submit resumes from, was saved by "
                      f"{layout['ranks']} training ranks ({saved.record_path}); this run has "
                      f"{ranks}: every rank loads its own rng_rank<r>.pt, which ranks "
                      f"{layout['ranks']} to {ranks - 1} do not have",
                      help=_fix(spec, saved, f"train on at most {layout['ranks']} GPUs"),
                      related=(saved.folder_key,))
