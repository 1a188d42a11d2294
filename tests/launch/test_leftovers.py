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
