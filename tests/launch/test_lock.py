"""One job at a time per experiment (vime/launch/lock.py): a second submit is told who holds
the experiment; a holder that died leaves a lock the next job takes over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from launchkit import ROOT, vime

from vime.launch import lock

HOLDER = """
import sys, time
from pathlib import Path
from vime.launch import lock
lock.acquire(Path(sys.argv[1]), lock.holder_now("local-holder1", "local", __import__("os").getpid()))
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def live_holder(tmp_path):
    """A real process that holds tmp_path/runs/tiny-cpu's lock until it is killed."""
    folder = tmp_path / "runs" / "tiny-cpu"
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE,
                             text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert child.stdout.readline().strip() == "held"
        yield folder, child
    finally:
        child.kill()
        child.wait()


def test_a_second_job_is_told_who_holds_the_experiment_until_the_holder_dies(live_holder):
    folder, child = live_holder
    with pytest.raises(lock.ExperimentLocked) as held:
        lock.acquire(folder, lock.holder_now("local-second", "local", os.getpid()))
    message = str(held.value)
    for part in ("job local-holder1 (local)", f"on {socket.gethostname()}", f"pid {child.pid}",
                 "since ", str(folder / lock.LOCK_FILE), "vime cancel local-holder1"):
        assert part in message, (part, message)
    assert lock.read(folder).job_id == "local-holder1"

    child.send_signal(signal.SIGKILL)  # dies without releasing
    child.wait()
    replaced = lock.acquire(folder, lock.holder_now("local-second", "local", os.getpid()))
    assert replaced is not None and replaced.pid == child.pid
    assert lock.read(folder).job_id == "local-second"
    lock.release(folder, "local-holder1")  # not the holder: nothing happens
    assert lock.read(folder).job_id == "local-second"
    lock.release(folder, "local-second")
    assert lock.read(folder) is None


def test_a_reused_pid_or_another_host_is_judged_right(tmp_path):
    mine = lock.holder_now("local-a", "local", os.getpid())
    assert not lock.is_stale(mine)
    reused = lock.Holder("local-a", "local", mine.host, os.getpid(), mine.pid_start + 1, time.time())
    assert lock.is_stale(reused)  # the pid now belongs to another process
    elsewhere = lock.Holder("local-b", "local", "another-host", 1, 1, time.time())
    assert not lock.is_stale(elsewhere)  # cannot be checked from here: kept


def test_vime_submit_refuses_a_held_experiment_before_starting_anything(live_holder, tmp_path):
    folder, child = live_holder
    done = vime("submit", "--local", str(ROOT / "specs" / "tiny_cpu.toml"), "--set",
                f"experiment.output_dir={json.dumps(str(tmp_path / 'runs'))}", timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is in use by job local-holder1 (local)" in done.stderr
    assert f"pid {child.pid}" in done.stderr
    assert sorted(p.name for p in folder.iterdir()) == [lock.LOCK_FILE]  # no job folder


def test_an_unreadable_lock_is_named_not_blamed_on_the_job_asking(tmp_path):
    folder = tmp_path / "runs" / "tiny-cpu"
    folder.mkdir(parents=True)
    (folder / lock.LOCK_FILE).write_text("")  # a lock written without its content reaching disk
    with pytest.raises(lock.ExperimentLocked) as held:
        lock.acquire(folder, lock.holder_now("local-asking", "local", os.getpid()))
    message = str(held.value)
    assert "local-asking" not in message, message
    assert f"{folder / lock.LOCK_FILE} cannot be read" in message, message


def test_jobs_racing_for_a_stale_lock_leave_exactly_one_holder(tmp_path, monkeypatch):
    # Eight submits at once meet a lock whose holder died; exactly one of them holds the
    # experiment, and every other is told that one's name. Reading a lock is slowed (0-3 ms)
    # so the takers interleave between their reads and their moves, as on a busy NFS server.
    import random
    import threading

    read_path = lock.read_path

    def slow_read(path):
        time.sleep(random.random() * 0.003)
        return read_path(path)

    monkeypatch.setattr(lock, "read_path", slow_read)
    mine = lock.holder_now("local-dead", "local", os.getpid())
    for attempt in range(25):
        folder = tmp_path / f"attempt-{attempt}"
        folder.mkdir()
        dead = lock.Holder("local-dead", "local", mine.host, os.getpid(), mine.pid_start + 1,
                           time.time())
        (folder / lock.LOCK_FILE).write_text(json.dumps(dead.__dict__))
        start, won, told = threading.Barrier(8), [], []

        def submit(job_id, folder=folder, start=start, won=won, told=told):
            start.wait()
            try:
                lock.acquire(folder, lock.holder_now(job_id, "local", os.getpid()))
                won.append(job_id)
            except lock.ExperimentLocked as refused:
                told.append(refused.holder.job_id if refused.holder else None)

        threads = [threading.Thread(target=submit, args=(f"local-{k}",)) for k in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(won) == 1, (attempt, won, told)
        assert lock.read(folder).job_id == won[0]
        assert told == [won[0]] * 7, (attempt, won, told)


def test_a_stale_local_holders_leftover_processes_are_stopped_at_the_takeover(tmp_path):
    # a launcher and its node killed outright leave Ray's processes, in sessions of their own,
    # marked with the dead job's id: the job that takes the lock over stops them
    from types import SimpleNamespace

    from runtime.node.ray_bootstrap import MARKER, temp_dir
    from vime.launch import local, submit

    folder = tmp_path / "runs" / "tiny-cpu"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = lock.Holder("local-deadbeef", "local", socket.gethostname(), dead.pid, 1,
                       time.time(), str(folder))
    folder.mkdir(parents=True)
    (folder / lock.LOCK_FILE).write_text(json.dumps(gone.__dict__))
    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
        env=dict(os.environ, **{MARKER: str(temp_dir("local-deadbeef", 0, 0))}))
    try:
        assert leftover.pid in local.job_processes("local-deadbeef")
        prepared = SimpleNamespace(experiment_dir=folder, plan=SimpleNamespace(
            spec=SimpleNamespace(model=SimpleNamespace(save=None, load=None))))
        submit._acquire(prepared, "local-next", "local", os.getpid())
        assert lock.read(folder).job_id == "local-next"
        assert leftover.wait(timeout=30) == -signal.SIGKILL
    finally:
        leftover.kill()
        leftover.wait()
