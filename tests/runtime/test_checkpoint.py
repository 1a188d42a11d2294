"""Checkpoints appear whole or not at all: a process killed in the middle of a save leaves
the previous checkpoint as the latest, and it loads."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from checkpointkit import FakeTrain
from runtimekit import ROOT, job_config

from runtime.backends.torch_train import TorchTrainingBackend
from runtime.rl.checkpoint import CheckpointError, Checkpoints
from vime.launch.local import process_start


def test_latest_is_the_newest_complete_checkpoint(tmp_path):
    checkpoints = Checkpoints(tmp_path / "ckpt")
    assert checkpoints.latest() is None
    checkpoints.save(4, FakeTrain("a"), {"next_rollout": 5})
    newest = checkpoints.save(9, FakeTrain("b"), {"next_rollout": 10})
    assert checkpoints.latest() == newest
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "rollout_000009"
    state = Checkpoints.read_state(newest)
    assert {k: state[k] for k in ("format", "rollout", "next_rollout")} == {
        "format": 1, "rollout": 9, "next_rollout": 10}
    assert list(state["files"]) == ["train/weights.txt"]
    # `latest` naming a folder that is gone: the newest complete one is used
    (tmp_path / "ckpt" / "latest").write_text("rollout_000012\n")
    assert checkpoints.latest() == newest
    # saving the same rollout again (a resumed run) replaces it whole
    again = checkpoints.save(9, FakeTrain("c"), {"next_rollout": 10})
    assert (again / "train" / "weights.txt").read_text() == "c"
    assert [p.name for p in checkpoints.complete()] == ["rollout_000004", "rollout_000009"]


def test_a_failed_save_leaves_nothing_behind(tmp_path):
    checkpoints = Checkpoints(tmp_path / "ckpt")
    first = checkpoints.save(0, FakeTrain("a"), {})

    class Failing:
        def save(self, path):
            path.mkdir(parents=True)
            (path / "half").write_text("x")
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        checkpoints.save(1, Failing(), {})
    assert checkpoints.latest() == first
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["latest", "rollout_000000"]


CHILD = """
import sys, time, torch
sys.path.insert(0, {tests!r})
from pathlib import Path
from runtimekit import job_config
from runtime.backends.torch_train import TorchTrainingBackend
from runtime.rl.checkpoint import CheckpointError, Checkpoints

tmp = Path({tmp!r})
_, _, config = job_config(tmp)
backend = TorchTrainingBackend()
backend.init(config.train_slice(0, "127.0.0.1", 0, 1))
checkpoints = Checkpoints(tmp / "ckpt")
checkpoints.save(0, backend, {{"next_rollout": 1}})
torch.save({{n: p.detach().clone() for n, p in backend.params.items()}}, tmp / "saved.pt")
with torch.no_grad():
    for p in backend.params.values():
        p.add_(1.0)  # what the second checkpoint would hold

class Slow:
    def save(self, path):
        backend.save(path)  # the model is written ...
        (tmp / "mid-save").write_text("now")
        time.sleep(600)  # ... and the process dies before the checkpoint is complete

checkpoints.save(1, Slow(), {{"next_rollout": 2}})
"""


def test_a_crash_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(
        tests=str(ROOT / "tests" / "runtime"), tmp=str(tmp_path))])
    try:
        deadline = time.time() + 120
        while not (tmp_path / "mid-save").exists():
            assert child.poll() is None, "the child died before reaching the save"
            assert time.time() < deadline, "the child never reached the save"
            time.sleep(0.1)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    folder = tmp_path / "ckpt"
    partial = [p.name for p in folder.iterdir() if p.name.startswith(".partial-")]
    assert partial, "the killed save should have left its partial folder"
    assert (folder / partial[0] / "train" / "model_optim.pt").exists()
    checkpoints = Checkpoints(folder)
    latest = checkpoints.latest()
    assert latest.name == "rollout_000000"
    assert json.loads((latest / "state.json").read_text())["next_rollout"] == 1
    _, _, config = job_config(tmp_path)
    backend = TorchTrainingBackend()
    backend.init(config.train_slice(0, "127.0.0.1", 0, 1))
    with torch.no_grad():
        for p in backend.params.values():
            p.zero_()
    backend.load(latest / "train")
    saved = torch.load(tmp_path / "saved.pt")
    for name, param in backend.params.items():
        assert torch.equal(param, saved[name]), name
    # the next save clears the debris
    checkpoints.save(1, FakeTrain("b"), {})
    assert not [p for p in folder.iterdir() if p.name.startswith(".partial-")]


def test_a_save_removes_only_the_partial_folders_whose_writer_is_gone(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    try:
        started = process_start(writer.pid)
        live = folder / f".partial-rollout_000051-abcd1234-{writer.pid}.{started}@{host}"
        unstamped = folder / f".partial-rollout_000053-abcd1234-{writer.pid}@{host}"
        gone = folder / f".partial-rollout_000050-abcd1234-{dead.pid}.1@{host}"
        # the writer's pid, now another process's: the writer is gone
        reused = folder / f".partial-rollout_000048-abcd1234-{writer.pid}.{started + 1}@{host}"
        elsewhere = folder / ".partial-rollout_000049-abcd1234-1.1@another-host"
        for partial in (live, unstamped, gone, reused, elsewhere):
            (partial / "train").mkdir(parents=True)
        Checkpoints(folder).save(52, FakeTrain("a"), {})
        left = sorted(p.name for p in folder.iterdir() if p.name.startswith(".partial-"))
        # another job's save in progress, named with or without its start time
        assert left == sorted([live.name, unstamped.name, elsewhere.name])
        assert (live / "train").is_dir()
    finally:
        writer.kill()
        writer.wait()


def test_a_resume_starts_from_the_checkpoint_latest_names(tmp_path):
    checkpoints = Checkpoints(tmp_path / "ckpt")
    for rollout in (4, 9, 14):
        checkpoints.save(rollout, FakeTrain(str(rollout)), {"next_rollout": rollout + 1})
    assert checkpoints.resume_point().name == "rollout_000014"
    (tmp_path / "ckpt" / "latest").write_text("rollout_000009\n")  # rolled back by hand
    assert checkpoints.resume_point().name == "rollout_000009"
    (tmp_path / "ckpt" / "rollout_000009" / "train" / "weights.txt").write_text("x")
    with pytest.raises(CheckpointError, match="rollout_000009/train/weights.txt has 1 bytes|"
                                              "does not match its recorded sha256"):
        checkpoints.resume_point()
    assert checkpoints.resume_point("previous").name == "rollout_000004"


@pytest.mark.parametrize("files", [[], {"train/weights.txt": 3}, {"train/weights.txt": {}}],
                         ids=["list", "number", "no-size"])
def test_a_state_json_with_a_damaged_file_list_is_named_on_resume(tmp_path, files):
    checkpoints = Checkpoints(tmp_path / "ckpt")
    folder = checkpoints.save(0, FakeTrain("a"), {"next_rollout": 1})
    state = json.loads((folder / "state.json").read_text())
    (folder / "state.json").write_text(json.dumps({**state, "files": files}))
    with pytest.raises(CheckpointError, match=f"{folder / 'state.json'}: its file list"):
        checkpoints.resume_point()
    # the next save's space check measures the files on disk instead
    assert checkpoints.expected_bytes() == sum(p.stat().st_size for p in folder.rglob("*")
                                               if p.is_file())
