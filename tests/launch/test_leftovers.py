"""What a job leaves behind when it is killed outright: Ray's agents run without the job's
VIME_RAY_NODE marker, so they are found by the files they hold open in the job's temp folder;
temp folders no process refers to are removed by the next local launch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

from runtime.node.ray_bootstrap import MARKER, abandoned_temp_dirs, marked, temp_dir
from vime.launch import local

AGENT = """
import sys, time
log = open(sys.argv[1], "a")  # as Ray's dashboard agent holds its log
print("open", flush=True)
time.sleep(600)
"""


def test_an_unmarked_agent_is_found_by_its_open_log_and_stopped_with_the_job():
    job_id = f"local-{uuid.uuid4().hex[:8]}"
    folder = temp_dir(job_id, 0, 0)
    logs = folder / "session_latest" / "logs"
    logs.mkdir(parents=True)
    abandoned = temp_dir(f"local-{uuid.uuid4().hex[:8]}", 0, 0)
    abandoned.mkdir()
    env = {k: v for k, v in os.environ.items() if k != MARKER}
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(logs / "dashboard_agent.log")],
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert agent.stdout.readline().strip() == "open"
        assert agent.pid in marked(str(folder))
        assert agent.pid in local.job_processes(job_id)
        left = abandoned_temp_dirs(min_age_s=0)
        assert abandoned in left and folder not in left  # a live process still uses it
        local.stop_job(job_id, [], grace_s=0)
        assert agent.wait(timeout=30) is not None
        assert not folder.exists()
        assert folder not in abandoned_temp_dirs(min_age_s=0)
    finally:
        agent.kill()
        agent.wait()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(abandoned, ignore_errors=True)


NODE_KILLED = """
import os, signal, subprocess, sys
# Ray's processes run in sessions of their own, out of the node's process group
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                 env=dict(os.environ, {marker}={folder!r}), start_new_session=True)
os.kill(os.getpid(), signal.SIGKILL)  # the node, killed outright: it stops nothing of its Ray
"""


def test_a_node_killed_outright_leaves_no_ray_process_behind_its_launcher(tmp_path):
    job_id = f"local-{uuid.uuid4().hex[:8]}"
    folder = temp_dir(job_id, 0, 0)
    folder.mkdir()
    job_dir = tmp_path / job_id
    job_dir.mkdir()
    node = subprocess.Popen([sys.executable, "-c",
                             NODE_KILLED.format(marker=MARKER, folder=str(folder))])
    try:
        codes, stopped_by = local._wait(job_dir, [node], lambda: None)
        assert codes == [-9] and stopped_by is None
        assert not local.job_processes(job_id)  # the launcher stopped what the node left
        assert not folder.exists()
    finally:
        for pid in local.job_processes(job_id):
            os.kill(pid, 9)
        shutil.rmtree(folder, ignore_errors=True)
