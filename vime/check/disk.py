"""V738: the disk a run's checkpoints take (checkpoint.keep_last checkpoints, HF folders)
against the free space of the file system that will hold them, where this machine sees it.

`forecast` is the arithmetic `vime plan` prints (`plan_lines`); the rule compares it with
shutil.disk_usage of the checkpoint folder's nearest existing parent, a read of the file
system as V730's is.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec
from vime.words import plural

# bytes per parameter of a checkpoint: Megatron's dist checkpoint holds the bf16 weights (2),
# the distributed optimizer's fp32 main weights (4) and Adam's two fp32 moments (4 + 4)
# (runtime/backends/megatron_train.py, save); the torch backend's model_optim.pt its fp32
# weights and AdamW's two moments (4 + 4 + 4: 12.2 measured on specs/tiny_cpu.toml, where
# the container's overhead shows)
CHECKPOINT_BYTES_PER_PARAM = {"megatron": 14, "torch": 12}
# an HF folder's model.safetensors: Megatron's gathered bf16 weights, the torch backend's fp32
HF_BYTES_PER_PARAM = {"megatron": 2, "torch": 4}


def size(nbytes: float) -> str:
    """Bytes in decimal units, three significant digits: 1.53 MB, 427 GB, 64.1 TB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


@dataclass(frozen=True)
class DiskForecast:
    """What a run's checkpoints take on disk at most."""

    checkpoint_bytes: int  # one checkpoint
    checkpoints_at_once: int  # on disk at once: keep_last, and the one written beside them
    hf_bytes: int  # one HF folder (0: none written)
    hf_at_once: int
    folder: str  # the checkpoint folder (HF folders in its hf/)

    @property
    def needed_bytes(self) -> int:
        return (self.checkpoint_bytes * self.checkpoints_at_once
                + self.hf_bytes * self.hf_at_once)


def _saves(every: int, rollouts: int) -> int:
    """Saves of a run that saves every `every` rollouts and after the last."""
    return rollouts // every + (1 if rollouts % every else 0)


def _at_once(saves: int, keep_last: int) -> int:
    """Folders on disk at once: all with keep_last 0; else keep_last, plus the one written
    before the oldest is removed (runtime/rl/checkpoint.py, commit then keep_last)."""
    if keep_last < 1 or saves <= keep_last:
        return saves
    return keep_last + 1


def forecast(spec: Spec) -> DiskForecast | None:
    """The checkpoints' disk, or None without an architecture or a checkpoint folder."""
    if spec.arch is None or spec.run_folders is None:
        return None
    params, backend = spec.arch.params_total, spec.train.backend
    ckpt = spec.checkpoint
    rollouts = spec.rollout.num_rollout
    hf_every = ckpt.save_hf_interval
    return DiskForecast(
        checkpoint_bytes=params * CHECKPOINT_BYTES_PER_PARAM.get(backend, 14),
        checkpoints_at_once=_at_once(_saves(ckpt.save_interval, rollouts), ckpt.keep_last),
        hf_bytes=params * HF_BYTES_PER_PARAM.get(backend, 2) if hf_every else 0,
        hf_at_once=_at_once(_saves(hf_every, rollouts), ckpt.keep_last) if hf_every else 0,
        folder=spec.run_folders.checkpoints)


def plan_lines(spec: Spec) -> list[str]:
    """`vime plan`'s lines for the checkpoints' disk."""
    disk = forecast(spec)
    if disk is None:
        return []
    keep = spec.checkpoint.keep_last
    kept = f"keep_last {keep}" if keep else "all kept"
    line = (f"  checkpoints: {size(disk.checkpoint_bytes)} each, "
            f"{disk.checkpoints_at_once} on disk at most ({kept})")
    if disk.hf_bytes:
        line += f", {plural(disk.hf_at_once, 'HF folder')} of {size(disk.hf_bytes)}"
    return [line + f": {size(disk.needed_bytes)}"]


def free_bytes(folder: str) -> tuple[str, int] | None:
    """(nearest existing parent of folder, its file system's free bytes), or None when that
    is unknowable here: no parent can be read, or only the root exists (/shared/runs on a
    machine without /shared: the nodes mount a file system that this one does not)."""
    path = Path(folder)
    for candidate in (path, *path.parents):
        try:
            if candidate.is_dir():
                if candidate == Path(candidate.anchor) and path != candidate \
                        and path.parent != candidate:
                    return None
                return str(candidate), shutil.disk_usage(candidate).free
        except OSError:
            return None
    return None


@rule("V738", "checkpoint-disk-space", severity="warning", enforced_by="vime")
def checkpoint_disk_space(spec: Spec):
    """The run's checkpoints need more disk than the checkpoint folder's file system has free.

    A checkpoint holds the actor's weights and optimizer state: about 14 bytes per parameter
    with the Megatron backend (bf16 weights, fp32 main weights, Adam's two moments), 12 with
    the torch backend; an HF folder (checkpoint.save_hf_interval) 2 or 4. With
    checkpoint.keep_last = K the folder holds K checkpoints and the one being written (the
    oldest is removed after the new one is complete); with 0 it holds every one. The runtime
    checks the free space before each save against the previous save's size
    (runtime/rl/checkpoint.py: "not enough free space for the next checkpoint") and stops
    the run there, after the rollouts that preceded it. `vime plan` compares the forecast
    with the free space of the folder's nearest existing parent where vime runs (not when
    only the root exists: the nodes' file system is not mounted here): a warning, since the
    job's nodes may see another file system at that path, and other files may fill or free
    it meanwhile.
    Fix: set checkpoint.keep_last (2 keeps a fallback), save less often
    (checkpoint.save_interval), or point model.save at a larger file system."""
    disk = forecast(spec)
    if disk is None or not disk.needed_bytes:
        return
    found = free_bytes(disk.folder)
    if found is None:
        return
    parent, free = found
    if free >= disk.needed_bytes:
        return
    keep = spec.checkpoint.keep_last
    fits = max(1, free // max(disk.checkpoint_bytes, 1) - 1)
    advice = (f"keep_last = {fits}" if fits >= 1 and (keep == 0 or fits < keep)
              else "model.save on a larger file system")
    key = "model.save" if spec.run_folders.checkpoints_key == "model.save" \
        else "checkpoint.keep_last"
    yield Finding(key,
                  f"the checkpoints need up to {size(disk.needed_bytes)} "
                  f"({plural(disk.checkpoints_at_once, 'checkpoint')} of "
                  f"{size(disk.checkpoint_bytes)}"
                  + (f", {plural(disk.hf_at_once, 'HF folder')} of {size(disk.hf_bytes)}"
                     if disk.hf_bytes else "")
                  + f"), but {parent} has {size(free)} free on this machine",
                  help=advice,
                  related=("checkpoint.keep_last", "checkpoint.save_interval",
                           "rollout.num_rollout"))
