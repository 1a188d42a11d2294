"""`vime submit --detach`: the same submit run again by a launcher in a session of its own,
which no hang-up of the terminal reaches; called by vime/cli.py's submit verb."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from vime.launch import submit

DETACHED_START_S = 120  # the detached launcher's compile and job folder, at most


def detach(prepared: submit.Prepared, launcher: str, spec: str, sets: list[str], strict: bool,
           ray_address: str | None) -> tuple[str, Path, int]:
    """Start a launcher that runs `vime submit SPEC --as-job ID` with these --set values (a
    --fresh name among them) and writes the job folder under an id chosen here; it runs the
    job as an attached launcher does (its nodes end with it). Return once the job folder
    exists: (job id, job folder, the launcher's pid).

    Raises:
        submit.SubmitError: the launcher exited, or had not started the job in
            DETACHED_START_S; the message holds the end of its log.
    """
    job_id = submit.new_local_id("local" if launcher == "local" else "ray")
    folder = prepared.experiment_dir / job_id
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "vime", "submit", spec, "--quiet", "--as-job", job_id,
            *(["--local"] if launcher == "local" else ["--ray-address", ray_address]),
            *(["--strict"] if strict else [])]
    for value in sets:
        argv += ["--set", value]
    log = folder / "logs" / "launcher.log"
    with open(log, "ab") as out:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + DETACHED_START_S
    while not (folder / "local.json").exists():
        if child.poll() is not None or time.monotonic() > deadline:
            what = (f"exited with code {child.returncode}" if child.returncode is not None
                    else f"had not started the job after {DETACHED_START_S} s")
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise submit.SubmitError(f"--detach: the job's launcher {what} ({log}):\n"
                                     + "\n".join(tail))
        time.sleep(0.2)
    return job_id, folder, child.pid
