"""The first step of job.sbatch, on the job's first node before srun: the job folder.

    experiment_dir=$(python -m vime.launch.batch)

prints the experiment folder, where srun then starts the nodes; anything else goes to stderr,
the batch log. Exit 1 with one line when the job cannot be made. What it does after `vime
submit`, for a job.sbatch submitted as it is, and on a requeue:
docs/design.md, "The job folder of a batch script".
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from vime.launch import jobdir, slurm, submit


class BatchError(Exception):
    pass


def _build_folder(job_id: str) -> Path:
    from vime.emit.build import MARKER

    script = slurm.script_path(job_id)
    if script is None:
        raise BatchError(f"Slurm does not say which script job {job_id} was submitted from")
    build = Path(script).parent
    if not (build / MARKER).is_file() or not (build / "resolved.toml").is_file():
        raise BatchError(f"{script} is not in a build folder of `vime compile` (no {MARKER} "
                         "and resolved.toml beside it); submit the spec with `vime submit`")
    return build


def write_job_folder(build: Path, job_id: str) -> Path:
    """The job folder of job_id from a build folder, as `vime submit` writes it; returns the
    experiment folder."""
    from runtime.node.job import SlurmEntry
    from vime import pipeline
    from vime.emit import plan_json
    from vime.parse import Source
    from vime.render import concise

    compiled_from = json.loads((build / "plan.json").read_text()).get("spec") or ""
    # the spec's relative paths, from where `vime compile` read them (relative to the folder it
    # ran in, which is where sbatch runs), else from here (vime/launch/paths.py)
    spec_dir = (Path.cwd() / compiled_from).parent if compiled_from else Path.cwd()
    name = str(build / "resolved.toml")
    text = (build / "resolved.toml").read_text()
    result = pipeline.run(Source(name, text), [], spec_dir)
    for diag in result.diagnostics:
        sys.stderr.write(concise(diag))
    if not result.ok:
        raise BatchError(f"{name} does not compile; run `vime compile` again")
    obj = plan_json.plan_object(name, result.diagnostics, result.spec, result.plan)
    prepared = submit.prepare(result, name, text, obj, "slurm", spec_dir=spec_dir)
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    if restarts and jobdir.is_job_folder(prepared.experiment_dir / job_id):
        return prepared.experiment_dir  # a requeued attempt: its folder, as the first wrote it
    prepared.files["job.sbatch"] = (build / "job.sbatch").read_text()  # what was submitted
    folder = submit.write_folder(prepared, job_id)
    slurm.write_entry(prepared.experiment_dir, job_id, SlurmEntry(str(prepared.experiment_dir)),
                      slurm.time_minutes(result.spec.cluster.slurm.time))
    jobdir.remember(job_id, folder.path)
    print(f"vime: job {job_id}: job folder {folder.path}, written from the build folder {build}",
          file=sys.stderr, flush=True)
    return prepared.experiment_dir


def experiment_folder(job_id: str) -> Path:
    here = Path.cwd()
    if jobdir.is_job_folder(here / job_id):  # `vime submit`: --chdir=<experiment folder>
        return here
    return write_job_folder(_build_folder(job_id), job_id)


def main() -> int:
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        print("vime: python -m vime.launch.batch runs inside a Slurm job (job.sbatch)",
              file=sys.stderr)
        return 2
    try:
        print(experiment_folder(job_id))
    except (BatchError, OSError, slurm.SlurmError, submit.SubmitError) as err:
        print(f"vime: job {job_id} cannot start: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
