"""Disks that fill up or refuse writes, on real small tmpfs mounts (this test mounts them: it
needs root and mount(8), and skips saying so otherwise): the user is told "No space left on
device" or which path cannot be written, with the key to change; no half checkpoint and no
half job folder are left; checkpoint.keep_last bounds what stays."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from runtimekit import TINY, job_config, vime

from runtime.backends.torch_train import TorchTrainingBackend
from runtime.node.preflight import save_dir_problem
from runtime.rl.checkpoint import CheckpointError, Checkpoints

MiB = 1 << 20


@contextlib.contextmanager
def tmpfs(folder: Path, size_bytes: int, read_only: bool = False):
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size_bytes}" + (",ro" if read_only else "")
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _backend(tmp_path):
    _, _, config = job_config(tmp_path)
    backend = TorchTrainingBackend()
    backend.init(config.train_slice(0, "127.0.0.1", 0, 1))
    return backend


def _save_bytes(tmp_path, backend) -> int:
    probe = Checkpoints(tmp_path / "probe").save(0, backend, {})
    return sum(p.stat().st_size for p in probe.rglob("*") if p.is_file())


def test_a_full_disk_is_said_plainly_and_leaves_no_half_checkpoint(tmp_path):
    backend = _backend(tmp_path)
    size = _save_bytes(tmp_path, backend)
    with tmpfs(tmp_path / "small", size // 2) as disk:
        checkpoints = Checkpoints(disk / "ckpt")
        with pytest.raises(CheckpointError) as failure:
            checkpoints.save(0, backend, {})
        assert "No space left on device" in str(failure.value)
        assert str(disk / "ckpt") in str(failure.value)
        assert list((disk / "ckpt").iterdir()) == []  # the half save is gone


def test_the_next_save_is_refused_before_writing_when_it_cannot_fit(tmp_path):
    backend = _backend(tmp_path)
    size = _save_bytes(tmp_path, backend)
    with tmpfs(tmp_path / "small", int(size * 1.6)) as disk:
        checkpoints = Checkpoints(disk / "ckpt")
        first = checkpoints.save(0, backend, {})
        with pytest.raises(CheckpointError, match="not enough free space for the next "
                                                  "checkpoint"):
            checkpoints.save(1, backend, {})
        assert checkpoints.latest() == first
        assert sorted(p.name for p in (disk / "ckpt").iterdir()) == ["latest", first.name]
        # the start of a run on that disk says it too (runtime/node/preflight.py)
        problem = save_dir_problem(str(disk / "ckpt"), tmp_path, tmp_path)
        assert problem.startswith("model.save: not enough free space")


def test_keep_last_keeps_the_newest_checkpoints(tmp_path):
    checkpoints = Checkpoints(tmp_path / "ckpt", keep_last=2)
    backend = _backend(tmp_path)
    for rollout in range(4):
        checkpoints.save(rollout, backend, {"next_rollout": rollout + 1})
    assert [p.name for p in checkpoints.complete()] == ["rollout_000002", "rollout_000003"]
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".")]


def _submit(tmp_path, *sets):
    return vime("submit", "--local", str(TINY), "--set",
                f"experiment.output_dir={json.dumps(str(tmp_path / 'runs'))}",
                *[arg for value in sets for arg in ("--set", value)], timeout=120)


def test_a_read_only_model_save_is_caught_before_the_job_starts(tmp_path):
    with tmpfs(tmp_path / "ro", MiB, read_only=True) as disk:
        done = _submit(tmp_path, f"model.save={json.dumps(str(disk / 'ckpt'))}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert (f"vime: error: model.save: cannot write checkpoints in {disk / 'ckpt'}: "
            "Read-only file system") in done.stderr
    assert "internal error" not in done.stderr
    assert not list((tmp_path / "runs" / "tiny-cpu").glob("local-*"))  # no job started


def test_an_output_dir_that_is_a_file_or_full_is_the_users_environment(tmp_path):
    (tmp_path / "runs").write_text("not a folder")
    done = _submit(tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "internal error" not in done.stderr and "bug in vime" not in done.stderr
    assert str(tmp_path / "runs") in done.stderr and "experiment.output_dir" in done.stderr
    (tmp_path / "runs").unlink()

    with tmpfs(tmp_path / "runs", 256 << 10) as disk:
        (disk / "tiny-cpu").mkdir()
        # the disk full to the last block
        with open(disk / "filler", "wb", buffering=0) as filler, contextlib.suppress(OSError):
            while True:
                filler.write(b"\0" * 4096)
        done = _submit(tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "No space left on device" in done.stderr, done.stderr
        assert "bug in vime" not in done.stderr
        assert not list((disk / "tiny-cpu").glob("local-*"))  # no half-written job folder


def test_keep_last_counts_the_runs_own_checkpoints_and_leaves_later_ones(tmp_path):
    # a run resumed at rollout 1 into a folder that holds rollouts 5 and 6 of the run it
    # replaces: its own two newest stay, and 5 and 6 are neither counted nor removed
    backend = _backend(tmp_path)
    earlier = Checkpoints(tmp_path / "ckpt", keep_last=2)
    for rollout in (5, 6):
        earlier.save(rollout, backend, {"next_rollout": rollout + 1})
    checkpoints = Checkpoints(tmp_path / "ckpt", keep_last=2)
    for rollout in range(1, 4):
        checkpoints.save(rollout, backend, {"next_rollout": rollout + 1})
    assert [p.name for p in checkpoints.complete()] == [
        "rollout_000002", "rollout_000003", "rollout_000005", "rollout_000006"]
    assert checkpoints.latest().name == "rollout_000003"
    assert checkpoints.resume_point().name == "rollout_000003"
