"""V7xx file checks: the torch_dist checkpoint on disk against the run's layout.

resolve reads vime_layout.json beside model.torch_dist_checkpoint when that folder is on the
machine vime runs on (Spec.torch_dist_layout); these rules only compare and report."""

from __future__ import annotations

import json
import shlex

from vime.check.registry import Finding, rule
from vime.resolve import LAYOUT_FILE, LAYOUT_SIZES
from vime.resolve.spec import Spec


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
