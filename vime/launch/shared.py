"""Are the paths a job's nodes need on a file system they all mount?

`vime submit` (vime/cli.py, `with_unshared`; not for `--local`) asks this once the spec
compiles, and warns with V701 about a path of a job of several nodes, or the interpreter of
any Slurm job, on a file system local to this machine. What is judged, and why a warning and
not an error: docs/design.md, "Paths the nodes share".
"""

from __future__ import annotations

import os
from pathlib import Path

from vime.check.cluster import NODE_LOCAL_PREFIXES
from vime.diagnostics import Diagnostic, finalize
from vime.launch import paths

# file systems of one machine: memory, a container's layers, a local disk
LOCAL_TYPES = frozenset({"tmpfs", "ramfs", "devtmpfs", "overlay", "aufs", "squashfs", "ext2",
                         "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs", "vfat", "exfat"})


def _unescape(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as \040 \011 \012 \134
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounts(table: str = "/proc/mounts") -> list[tuple[str, str]]:
    """(mount point, file system type) of this machine; empty where there is no such table."""
    try:
        lines = Path(table).read_text().splitlines()
    except OSError:
        return []
    return [(_unescape(parts[1]), parts[2]) for line in lines if len(parts := line.split()) >= 3]


def mount_of(path: str, table: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The mount that holds path (the last one mounted over the longest matching point)."""
    real = os.path.realpath(path)
    best = None
    for point, kind in table:
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, kind)
    return best


def _existing(path: str) -> str | None:
    """The path itself, or the nearest folder above it that exists (where it would be made)."""
    current = Path(path)
    while not current.exists():
        if current.parent == current:
            return None
        current = current.parent
    return str(current)


def _why_local(path: str, table: list[tuple[str, str]], made: bool = False) -> str | None:
    """Why path (made: a folder to be made under it) is on this machine only, or None."""
    for prefix in NODE_LOCAL_PREFIXES:
        if path == prefix or path.startswith(prefix + "/"):
            return f"is under {prefix}, which every machine has its own of"
    found = mount_of(path, table)
    if found and found[1] in LOCAL_TYPES:
        where = f"{found[1]} at {found[0]}, a file system of this machine"
        return f"would be made on {where}" if made else f"is on {where}"
    return None


def unshared(spec, python: str | None, reported: list[Diagnostic],
             table: list[tuple[str, str]] | None = None) -> list[Diagnostic]:
    """V701 warnings for a submitted job's spec (its paths absolute) and interpreter (None: a
    job on a running Ray cluster, whose nodes run their own). The paths are judged for a job
    of several nodes; the interpreter for any Slurm job, which runs on machines Slurm picks."""
    table = mounts() if table is None else table
    found = _unshared_python(spec, python, table)
    nodes = spec.cluster.nodes
    if nodes <= 1:
        return found
    said = {d.key for d in reported if d.code == "V701"}
    model, made = spec.model, spec.experiment.output_dir
    candidates = [("experiment.output_dir", made, _existing(made))]
    candidates += [(f"model.{key}", value, _existing(value)) for key in ("save", "load")
                   if (value := getattr(model, key))]
    candidates += [(key, value, value) for key, value in (
        ("data.prompt_data", spec.data.prompt_data), ("model.hf_checkpoint", model.hf_checkpoint),
        ("model.torch_dist_checkpoint", model.torch_dist_checkpoint))
        if value and os.path.isabs(value) and os.path.exists(value)]
    for key, value, here in candidates:
        why = here and key not in said and _why_local(here, table, made=here != value)
        if why:
            found.append(Diagnostic(
                "warning", "V701", tuple(key.split(".")),
                f"{key} = {value!r} {why}, but the job has {nodes} nodes",
                spec.origin(key).location,
                help="a path on a file system every node mounts (NFS, Lustre, GPFS); if the "
                "nodes mount this folder from this machine, this does not apply"))
    return found


def _unshared_python(spec, python: str | None,
                     table: list[tuple[str, str]]) -> list[Diagnostic]:
    """V701 for the interpreter job.sbatch runs by its absolute path (vime/emit/sbatch.py)
    when it is on a file system of this machine only."""
    why = python and _why_local(os.path.dirname(os.path.abspath(python)), table)
    if not why:
        return []
    nodes = spec.cluster.nodes
    message = (f"the job's Python {python} (job.sbatch runs it on every node) {why}, but the "
               f"job has {nodes} nodes" if nodes > 1 else
               f"the job's Python {python} (job.sbatch runs it on the job's node) {why}, and "
               "Slurm may run the job on another machine, which then finds no Python there")
    return [Diagnostic(
        "warning", "V701", ("cluster", "nodes"), message, spec.origin("cluster.nodes").location,
        help="run vime from a virtual environment on a file system every node mounts (NFS, "
        "Lustre, GPFS), or make the same environment at the same path on every node; no spec "
        "key names another interpreter (job.sbatch runs the one `vime submit` runs in). If "
        "the nodes mount this folder from this machine, or are this machine, this does not "
        "apply")]


def with_unshared(result, source_name: str, python: str | None,
                  strict: bool) -> list[Diagnostic]:
    """The compiler's diagnostics and the warnings above, for `vime submit` to Slurm (python:
    the interpreter job.sbatch runs on every node) or to a running Ray cluster (None)."""
    spec = paths.absolute(result.spec, Path(source_name).resolve().parent, Path.cwd())
    return finalize([*result.diagnostics, *unshared(spec, python, result.diagnostics)], strict)
