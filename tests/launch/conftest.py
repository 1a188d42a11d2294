"""Fixtures for the launcher's tests: a real Slurm started and stopped by this session
(.ci/slurm/up.sh / down.sh), and a check that no Ray process of any job outlives the session.

The Slurm tests skip, saying why, where Slurm cannot run (not root, packages missing: run
`bash .ci/slurm/install.sh`); with VIME_REQUIRE_SLURM=1 (.ci/run sets it) they fail instead.
Sessions that share a machine take turns through a lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from launchkit import SLURM_CI, marked_processes

LOCK = Path("/tmp/vime-slurm-tests.lock")
LOCK_WAIT_S = 1200
DAEMONS = ("slurmctld", "slurmd", "slurm-client:sbatch", "munge:munged", "slurmdbd",
           "mariadb-server:mysqld_safe")


@pytest.fixture(scope="session", autouse=True)
def no_ray_left_behind():
    yield
    deadline = time.time() + 20
    while (left := marked_processes()) and time.time() < deadline:
        time.sleep(0.5)
    for pid in left:  # do not leave them to the next session, then fail
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
    assert not left, f"Ray processes of vime jobs outlived the tests: pids {left}"


def _why_no_slurm() -> str | None:
    if os.geteuid() != 0:
        return "the Slurm tests start slurmctld/slurmd/munged/MariaDB and need root"
    missing = []
    for item in DAEMONS:
        package, _, command = item.rpartition(":")
        if not (shutil.which(command) or Path(f"/usr/sbin/{command}").exists()):
            missing.append(package or command)
    if missing:
        return (f"Slurm is not installed here ({', '.join(missing)} missing); "
                "`bash .ci/slurm/install.sh` installs it (.ci/run does)")
    conf = Path("/etc/slurm/slurm.conf")
    if conf.exists() and "written by vime" not in conf.read_text():
        return "/etc/slurm/slurm.conf belongs to a real Slurm here; the tests will not replace it"
    return None


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real 2-node Slurm (n1, n2; 4 fake GPUs and 4 CPUs each) with accounting."""
    reason = _why_no_slurm()
    if reason:
        if os.environ.get("VIME_REQUIRE_SLURM") == "1":
            pytest.fail(f"VIME_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    lock = open(LOCK, "w")  # noqa: SIM115 (held for the whole session)
    deadline = time.time() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.time() > deadline:
                pytest.skip(f"another test session held {LOCK} for {LOCK_WAIT_S} s")
            time.sleep(2)
    env = dict(os.environ, NODES="2", GPUS_PER_NODE="4", CPUS_PER_NODE="4")
    up = subprocess.run(["bash", str(SLURM_CI / "up.sh")], env=env, capture_output=True,
                        text=True, timeout=300)
    try:
        if up.returncode:
            pytest.fail(f".ci/slurm/up.sh failed:\n{up.stdout}\n{up.stderr}")
        yield {"nodes": ["n1", "n2"], "gpus_per_node": 4}
    finally:
        subprocess.run(["bash", str(SLURM_CI / "down.sh")], capture_output=True, timeout=120)
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


