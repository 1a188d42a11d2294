"""The job folder, `<experiment.output_dir>/<experiment.name>/<job id>/`:

    job.json        who, what, when: job id, launcher, spec and its sha256, vime version
    launch.json     what the nodes read (runtime/node/job.py): nodes, GPUs, Ray settings,
                    [cluster.env], the port-plan inputs and the driver
    resolved.toml plan.json megatron.args vllm.args job.sbatch   the compiled artifacts
    submitit/       submitit's pickles (Slurm jobs)
    logs/           batch.log (a job.sbatch sbatch'ed as it is writes slurm-<job id>.out where
                    sbatch ran instead), node-<i>.log (one per node; node 0 runs the driver),
                    ray-node-<i>.log (`ray start`), ray/node-<i>/ (Ray's own logs)
    ray_address     `<ip>:<port>` of the job's Ray head, once it is up
    ray/            head.json, per-node state, ready-<attempt>.json (timings), done markers
    outcome.json    succeeded / failed (with the error) / requeued / terminated
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# launch.json's "driver" where VIME_DRIVER is unset: the `module:function` node 0 runs
DEFAULT_DRIVER = "runtime.node.driver:run"


@dataclass(frozen=True)
class JobFolder:
    path: Path

    @property
    def info(self) -> dict:
        return json.loads((self.path / "job.json").read_text())

    def read_json(self, name: str):
        try:
            return json.loads((self.path / name).read_text())
        except (OSError, ValueError):
            return None

    def log(self, node: int) -> Path:
        return self.path / "logs" / f"node-{node}.log"

    def write(self, files: dict[str, str]) -> None:
        (self.path / "logs").mkdir(parents=True, exist_ok=True)
        (self.path / "ray").mkdir(exist_ok=True)
        for name, text in files.items():
            tmp = self.path / f".{name}.tmp"
            tmp.write_text(text)
            os.replace(tmp, self.path / name)


def registry() -> Path:
    """Where `vime submit` remembers job id -> job folder: Slurm ids whose folder Slurm
    itself cannot say (sacct mangles quotes in WorkDir), and the ids of local and
    --ray-address runs, so that `vime status/logs/cancel <id>` work from any folder (the
    folder keeps its first name, slurm-jobs, so links written before stay found)."""
    state = os.environ.get("VIME_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "vime")
    return Path(state) / "slurm-jobs"


def remember(job_id: str, folder: Path) -> None:
    link = registry() / job_id
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f".{job_id}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(folder)
        os.replace(tmp, link)
    except OSError:
        pass  # a convenience: `vime status <folder>` always works


def remembered(job_id: str) -> Path | None:
    link = registry() / job_id
    return link.resolve() if link.is_symlink() else None


def is_job_folder(path: Path) -> bool:
    try:
        return (path / "job.json").is_file()
    except OSError:  # a folder that may not be read: /proc/<pid>/fd/<n>, found from /
        return False


def dumps(obj: dict) -> str:
    return json.dumps(obj, indent=1, sort_keys=True) + "\n"
