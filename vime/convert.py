"""`vime convert`: the command that converts a spec's checkpoint between HF safetensors and
Megatron's torch_dist (runtime/megatron/convert.py), one process per GPU of the layout."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from vime.emit.resolved import arch_as_config
from vime.layout import Layout
from vime.resolve.spec import Spec


class ConvertError(Exception):
    """No conversion to run: no target folder, nothing to convert back, or the target exists."""


@dataclass(frozen=True)
class Conversion:
    source: str
    target: str
    layout: Layout  # the fewest ranks that hold the spec's layout, one GPU per rank
    command: tuple[str, ...]


def conversion(spec: Spec, to: str, output: str | None, single_gpu: bool) -> Conversion:
    """Plan the conversion of the spec's checkpoint to `to` ("torch_dist" or "hf").

    Raises:
        ConvertError: no target folder is set, there is nothing to convert back, or the
            target exists.
    """
    model = spec.model
    if to == "torch_dist":
        source, target = model.hf_checkpoint, output or model.torch_dist_checkpoint
        if not target:
            raise ConvertError("set model.torch_dist_checkpoint in the spec, or -o FOLDER")
    else:
        if not model.torch_dist_checkpoint:
            raise ConvertError("model.torch_dist_checkpoint is not set: nothing to convert back")
        source = model.torch_dist_checkpoint
        target = output or model.torch_dist_checkpoint.rstrip("/") + "_hf"
    if Path(target).exists():
        raise ConvertError(f"{target} exists; vime convert never overwrites a checkpoint")
    parallel = spec.train.parallel
    layout = Layout.smallest() if single_gpu else Layout.smallest(
        tp=parallel.tp, pp=parallel.pp, ep=parallel.ep, etp=parallel.etp)
    # the architecture inline, not in a temporary file: the command printed is one that works
    # after a --dry-run too
    arch = json.dumps(arch_as_config(spec), sort_keys=True, separators=(",", ":"))
    launcher = [sys.executable] if layout.world_size == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={layout.world_size}"]
    # the tokenizer files of model.hf_checkpoint go beside the weights
    tokenizer = ("--tokenizer-from", model.hf_checkpoint) if to == "hf" and \
        model.hf_checkpoint and Path(model.hf_checkpoint).is_dir() else ()
    command = (*launcher, "-m", "runtime.megatron.convert", "--to", to,
               f"--tp={layout.tp}", f"--pp={layout.pp}", f"--ep={layout.ep}",
               f"--etp={layout.etp}", "--arch", arch, *tokenizer, source, target)
    return Conversion(source, target, layout, command)
