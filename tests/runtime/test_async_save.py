"""checkpoint.async_save: the ranks copy their state and write it in the background while the
next rollout generates; the next save waits for the write; a kill during a write leaves the
previous checkpoint `latest`, and the resume from it equals an uninterrupted run from it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import zipfile
from collections import defaultdict
from pathlib import Path

import torch
from runtimekit import ROOT, in_process_loop, job_config, metrics

from runtime.backends.torch_train import TorchTrainingBackend
from runtime.rl.checkpoint import verify

ASYNC = {"rollout__num_rollout": "4", "checkpoint__save_interval": "1",
         "eval__datasets": "[]"}
# a deadlock breaker for the synchronous path, not a timing bound
BLOCKED_S = 20


def _held_writes(monkeypatch, released: dict[int, threading.Event], events: list):
    """torch.save of rollout k's train/ files waits for released[k + 1], then is recorded."""
    save = torch.save

    def held(content, path, *args, **kwargs):
        if "train" in Path(str(path)).parts[-2:-1]:
            checkpoint = Path(str(path)).parent.parent.name.split("-")[1]
            released[int(checkpoint[-6:]) + 1].wait(BLOCKED_S)
            save(content, path, *args, **kwargs)
            events.append(("written", checkpoint))
            return None
        return save(content, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", held)


def test_the_next_rollout_generates_while_the_save_is_written(tmp_path, monkeypatch):
    _, _, config = job_config(tmp_path, "overlap", checkpoint__async_save="true", **ASYNC)
    loop = in_process_loop(config)
    events: list = []
    released = defaultdict(threading.Event)
    _held_writes(monkeypatch, released, events)
    sample = loop.sample_groups

    def generate_then_release(rollout_id, timer):
        events.append(("generate", rollout_id))
        released[rollout_id].set()  # the save of rollout_id - 1 may be written now
        return sample(rollout_id, timer)

    loop.sample_groups = generate_then_release
    loop.run()
    # rollout 0's save is written only once rollout 1 generates, so the loop went on before
    assert events.index(("generate", 1)) < events.index(("written", "rollout_000000"))
    assert events.index(("generate", 2)) < events.index(("written", "rollout_000001"))
    lines = metrics(config.job_dir)
    assert "time/save_background" not in lines[0]
    assert all(line["time/save_background"] > 0 and "time/save_wait" in line
               for line in lines[1:])
    assert (config.save_dir / "latest").read_text().strip() == "rollout_000003"
    for rollout in range(4):
        assert verify(config.save_dir / f"rollout_{rollout:06d}") is None


def test_a_second_save_waits_for_the_first_write(tmp_path, monkeypatch):
    _, _, config = job_config(tmp_path, "twice", **ASYNC)
    backend = in_process_loop(config).train.workers[0].backend
    assert isinstance(backend, TorchTrainingBackend)
    events: list = []
    released = defaultdict(threading.Event)
    _held_writes(monkeypatch, released, events)
    copy = backend._checkpoint_files

    def recorded_copy():
        events.append(("copied", len(events)))
        return copy()

    monkeypatch.setattr(backend, "_checkpoint_files", recorded_copy)
    threading.Timer(0.5, lambda: [released[k].set() for k in (1, 2)]).start()
    backend.begin_save(tmp_path / ".partial-rollout_000000-a" / "train")
    backend.begin_save(tmp_path / ".partial-rollout_000001-b" / "train")
    assert backend.finish_save() > 0
    kinds = [kind for kind, _ in events]
    assert kinds == ["copied", "written", "written", "copied", "written", "written"], events


KILLED_WRITING = """
import os, signal, sys, threading
sys.path.insert(0, {tests!r})
from pathlib import Path
import torch
from runtimekit import in_process_loop, job_config
from runtime.rl.loop import GRPOLoop

_, _, config = job_config(Path({tmp!r}), "killed", checkpoint__async_save="true",
                          rollout__num_rollout="4", checkpoint__save_interval="1",
                          eval__datasets="[]")
loop = in_process_loop(config)
save, sample = torch.save, GRPOLoop.sample_groups

def slow_second_write(content, path, *args, **kwargs):
    if ".partial-rollout_000001" in str(path):
        threading.Event().wait()  # rollout 1's checkpoint is being written when the kill comes
    return save(content, path, *args, **kwargs)

def killed_at_rollout_2(self, rollout_id, timer):
    if rollout_id == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return sample(self, rollout_id, timer)

torch.save, GRPOLoop.sample_groups = slow_second_write, killed_at_rollout_2
loop.run()
"""


def _untimed(line: dict) -> dict:
    """A metrics line without its clock readings (seconds and rates)."""
    return {k: v for k, v in line.items()
            if not k.startswith(("time/", "throughput/")) and not k.endswith("_s")}


def _weights(loop) -> dict[str, torch.Tensor]:
    backend = loop.train.workers[0].backend
    backend.onload()
    return {n: p.detach().clone() for n, p in backend.params.items()}


def test_a_kill_during_a_background_write_resumes_exactly_from_the_previous_checkpoint(
        tmp_path):
    child = subprocess.run([sys.executable, "-c", KILLED_WRITING.format(
        tests=str(ROOT / "tests" / "runtime"), tmp=str(tmp_path / "a"))], timeout=300,
        capture_output=True, text=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    save_dir = tmp_path / "a" / "runs" / "tiny-cpu" / "checkpoints"
    assert (save_dir / "latest").read_text().strip() == "rollout_000000"
    assert [p.name for p in save_dir.glob(".partial-rollout_000001-*")]  # killed mid-write
    assert not (save_dir / "rollout_000001").exists()
    # the uninterrupted run from the same checkpoint, saving synchronously
    _, _, straight_config = job_config(tmp_path / "b", "straight", **ASYNC)
    straight_config.save_dir.mkdir(parents=True)
    shutil.copytree(save_dir / "rollout_000000", straight_config.save_dir / "rollout_000000")
    shutil.copy(save_dir / "latest", straight_config.save_dir / "latest")
    straight = in_process_loop(straight_config)
    assert straight.restore()
    straight.run()

    _, _, config = job_config(tmp_path / "a", "resumed", checkpoint__async_save="true", **ASYNC)
    resumed = in_process_loop(config)
    assert resumed.restore() and resumed.next_rollout == 1
    resumed.run()
    a, b = _weights(straight), _weights(resumed)
    assert all(torch.equal(a[name], b[name]) for name in a)
    same = [_untimed(line) for line in metrics(config.job_dir)]
    assert same == [_untimed(line) for line in metrics(straight_config.job_dir)]
    assert [line["rollout"] for line in same] == [1, 2, 3]
    assert not list(save_dir.glob(".partial-*"))  # the killed write's folder is cleaned up
    assert (save_dir / "latest").read_text().strip() == "rollout_000003"


def test_a_loop_without_the_sync_point_finishes_each_save_before_the_next(tmp_path):
    # rollout.async = "one_step" (runtime/rl/asynchrony.py) trains and saves on a timeline
    # of its own; every background save is still finished and committed
    _, _, config = job_config(
        tmp_path, "one-step", checkpoint__async_save="true", rollout__async='"one_step"',
        cluster__gpus_per_node="2", train__colocate="false", train__num_gpus="1", **ASYNC)
    loop = in_process_loop(config)
    loop.run()
    assert (config.save_dir / "latest").read_text().strip() == "rollout_000003"
    assert sorted(p.name for p in config.save_dir.iterdir()) == [
        "latest", *(f"rollout_{rollout:06d}" for rollout in range(4))]
    for rollout in range(4):
        assert verify(config.save_dir / f"rollout_{rollout:06d}") is None


def test_a_one_step_loop_commits_a_background_save_at_the_next_generation_end(tmp_path):
    # the write of rollout 1's save runs beside rollout 2's training and rollout 3's
    # generation; rollout 2 commits it once that generation ends, not at the next save
    _, _, config = job_config(
        tmp_path, "one-step-commit", checkpoint__async_save="true",
        rollout__async='"one_step"', cluster__gpus_per_node="2", train__colocate="false",
        train__num_gpus="1", **{**ASYNC, "rollout__num_rollout": "5",
                                "checkpoint__save_interval": "2"})
    loop = in_process_loop(config)
    loop.run()
    lines = {line["rollout"]: line for line in metrics(config.job_dir)}
    assert "time/save_background" in lines[2], sorted(lines[2])
    assert (config.save_dir / "latest").read_text().strip() == "rollout_000004"


def test_the_backends_files_leave_out_the_zip_crc32_and_load(tmp_path):
    # every file's sha256 is in state.json; torch's CRC32 of each record costs CPU the write
    from torch.utils.serialization import config as serialization

    _, _, config = job_config(tmp_path, "crc", **ASYNC)
    backend = in_process_loop(config).train.workers[0].backend
    backend.save(tmp_path / "sync")
    backend.begin_save(tmp_path / "background")
    backend.finish_save()
    for folder in ("sync", "background"):
        with zipfile.ZipFile(tmp_path / folder / "model_optim.pt") as archive:
            assert {info.CRC for info in archive.infolist()
                    if info.filename.split("/")[-2] == "data"} == {0}
        backend.load(tmp_path / folder)
    assert serialization.save.compute_crc32  # as it was, for other writers
