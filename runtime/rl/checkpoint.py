"""Checkpoints: one folder per saved rollout, made visible only once complete.

    <save dir>/rollout_000019/       train/ (what each rank's backend wrote), state.json,
                                     vime_checkpoint.json
    <save dir>/latest                "rollout_000019"

A checkpoint is written into `.partial-rollout_000019-<random>/`, every file flushed to
disk, and then renamed into place (a rename within a folder is atomic on POSIX file
systems, NFS and Lustre included); `latest` is replaced the same way afterwards. A crash at
any moment therefore leaves either the previous checkpoint or the new one, never a half
one: readers ignore `.partial-*` folders, and the next save removes them.

state.json holds what the driver restores: the next rollout index, the weight version, the
prompt sampler's position; the backends' files hold the model, optimizer and RNG states;
vime_checkpoint.json records the architecture, backend and layout that wrote them, which `vime
plan` compares with the spec of the run that would resume (vime/run_checkpoint.py: V708, V709).
The save folder is model.save, else <output_dir>/<experiment.name>/checkpoints (shared by
every job of the experiment); resuming reads model.load, else the save folder.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from runtime.core.slices import JobConfig
from vime import __version__, run_checkpoint
from vime.resolve.model import arch_from_config

STATE = run_checkpoint.STATE_FILE
LATEST = run_checkpoint.LATEST_FILE
FORMAT = 1


def record_of(config: JobConfig) -> dict:
    """The vime_checkpoint.json of this job's checkpoints: its model, backend and layout."""
    return run_checkpoint.record(arch_from_config(dict(config.model.arch)), config.train_backend,
                                 {**config.parallel, "ranks": len(config.ranks)}, __version__)


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            with open(Path(folder) / name, "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(Path(folder))


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on folders; the rename still orders
    finally:
        os.close(fd)


class Checkpoints:
    def __init__(self, save_dir: Path, load_dir: Path | None = None):
        self.save_dir = Path(save_dir)
        self.load_dir = Path(load_dir) if load_dir else self.save_dir

    @staticmethod
    def name(rollout_id: int) -> str:
        return f"rollout_{rollout_id:06d}"

    # ------------------------------------------------------------------------------ read

    def complete(self, folder: Path | None = None) -> list[Path]:
        """Complete checkpoints of a folder, oldest first."""
        return run_checkpoint.complete(Path(folder or self.load_dir))

    def latest(self) -> Path | None:
        """The checkpoint `latest` names, or the newest complete one when `latest` is missing
        or names a folder that is gone (the choice `vime plan` reads too)."""
        return run_checkpoint.latest(self.load_dir)

    @staticmethod
    def read_state(folder: Path) -> dict:
        state = json.loads((folder / STATE).read_text())
        if state.get("format") != FORMAT:
            raise ValueError(f"{folder}: checkpoint format {state.get('format')}, this vime "
                             f"reads {FORMAT}")
        return state

    # ----------------------------------------------------------------------------- write

    def save(self, rollout_id: int, train, state: dict, record: dict | None = None) -> Path:
        """train.save(folder) writes the backends' part (every rank, into the same folder);
        then state.json and the record (record_of), fsync, rename, `latest`."""
        self.save_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.save_dir.glob(".partial-*"):
            shutil.rmtree(stale, ignore_errors=True)
        final = self.save_dir / self.name(rollout_id)
        partial = self.save_dir / f".partial-{final.name}-{uuid.uuid4().hex[:8]}"
        partial.mkdir()
        try:
            train.save(partial / "train")
            (partial / STATE).write_text(json.dumps(
                {"format": FORMAT, "rollout": rollout_id, **state}, indent=1) + "\n")
            if record is not None:
                (partial / run_checkpoint.RECORD_FILE).write_text(
                    json.dumps(record, indent=1) + "\n")
            _fsync_tree(partial)
            if final.exists():  # the same rollout saved again (a resumed run): replace it
                old = self.save_dir / f".partial-old-{final.name}-{uuid.uuid4().hex[:8]}"
                os.rename(final, old)
                os.rename(partial, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(partial, final)
            _fsync_dir(self.save_dir)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        pointer = self.save_dir / f".{LATEST}.{uuid.uuid4().hex[:8]}"
        pointer.write_text(final.name + "\n")
        with open(pointer, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(pointer, self.save_dir / LATEST)
        _fsync_dir(self.save_dir)
        return final
