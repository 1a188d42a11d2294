"""Where a submitted run starts, said before anything starts: the checkpoint the
job will resume from, or a fresh start, or a run that is already finished.

The runtime resumes from the newest complete checkpoint of its load folder
(runtime/rl/checkpoint.py: model.load, else model.save, else
<output_dir>/<experiment.name>/checkpoints); this reads the same folder the same way, with
the spec's paths already absolute (vime/launch/paths.py).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Passed:
    """A corrupt checkpoint that checkpoint.on_corrupt = "previous" passes over."""

    checkpoint: Path
    problem: str
    aside: Path | None  # where the job moves it (None: another load folder, left there)


@dataclass(frozen=True)
class StartPoint:
    load_dir: Path
    checkpoint: Path | None  # None: a fresh start
    next_rollout: int  # 0 on a fresh start
    problem: str | None = None  # what is wrong with checkpoint, which the job will not load
    passed: tuple[Passed, ...] = ()  # newer corrupt ones, on_corrupt = "previous"

    def describe(self, num_rollout: int) -> str:
        if self.problem:
            return (f"checkpoint {self.checkpoint} is corrupt or incomplete: {self.problem}. "
                    "Move it aside to keep it for inspection, or set checkpoint.on_corrupt = "
                    "\"previous\" to resume from the one before it")
        said = "".join(
            f"checkpoint {p.checkpoint} is corrupt or incomplete ({p.problem}): "
            + (f"the job moves it aside to {p.aside}, kept; " if p.aside
               else "left where it is; ") for p in self.passed)
        if self.checkpoint is None:
            return said + f"starting fresh (no checkpoint in {self.load_dir})"
        return said + (f"resuming from rollout {self.next_rollout} of {num_rollout} "
                       f"(checkpoint {self.checkpoint})")


def load_dir(spec, experiment_dir: Path) -> Path:
    model = spec.model
    return Path(model.load or model.save or experiment_dir / "checkpoints")


def save_dir(spec, experiment_dir: Path) -> Path:
    """The folder the job saves its checkpoints (and HF folders) into."""
    return Path(spec.model.save or experiment_dir / "checkpoints")


def job_load_dir(job_dir: Path) -> Path:
    """load_dir of a written job folder: its resolved.toml has the paths absolute."""
    import tomllib

    model = tomllib.loads((job_dir / "resolved.toml").read_text())["model"]
    return Path(model.get("load") or model.get("save") or job_dir.parent / "checkpoints")


def job_save_dir(job_dir: Path) -> Path:
    """save_dir of a written job folder."""
    import tomllib

    model = tomllib.loads((job_dir / "resolved.toml").read_text())["model"]
    return Path(model.get("save") or job_dir.parent / "checkpoints")


def start_point(spec, experiment_dir: Path) -> StartPoint:
    return start_point_in(load_dir(spec, experiment_dir), spec.checkpoint.on_corrupt,
                          save_dir(spec, experiment_dir))


def job_start_point(job_dir: Path) -> StartPoint:
    """start_point of a written job folder: where the next submit of its spec resumes."""
    import tomllib

    spec = tomllib.loads((job_dir / "resolved.toml").read_text())
    return start_point_in(job_load_dir(job_dir),
                          spec.get("checkpoint", {}).get("on_corrupt", "stop"),
                          job_save_dir(job_dir))


def start_point_in(folder: Path, on_corrupt: str = "stop",
                   save_folder: Path | None = None) -> StartPoint:
    """The checkpoint the job will resume from (runtime/rl/checkpoint.py, resume_point).
    With on_corrupt "stop" it is judged by its files' presence and sizes and state.json's
    checksum (the job checks the other files' sums too), and an incomplete newest one is
    returned with its problem. With "previous" every sum is checked, as the job does, so that
    the one named is the one the job loads; the corrupt ones passed over are listed, with
    where the job moves them (save_folder: the job's save folder, default `folder`)."""
    from runtime.rl.checkpoint import Checkpoints, aside_name, verify

    checkpoints = Checkpoints(folder)
    passed: list[Passed] = []
    moves_aside = os.path.abspath(save_folder or folder) == os.path.abspath(folder)
    for found in checkpoints.candidates():
        problem = verify(found, checksums=on_corrupt == "previous")
        if problem is None:
            state = checkpoints.read_state(found)
            return StartPoint(folder, found, int(state.get("next_rollout", 0)),
                              passed=tuple(passed))
        if on_corrupt != "previous":
            return StartPoint(folder, found, 0, problem)
        passed.append(Passed(found, problem, aside_name(found) if moves_aside else None))
    return StartPoint(folder, None, 0, passed=tuple(passed))


def fresh_name(output_dir: str, name: str) -> str:
    """The experiment name of `--fresh`: name-2, name-3, ... the first whose folder does not
    exist, so the old run and its checkpoints stay where they are."""
    root = Path(output_dir)
    number = 2
    while (root / f"{name}-{number}").exists():
        number += 1
    return f"{name}-{number}"


def command(invocation: tuple[str, ...], launcher: str, ray_address: str | None,
            cwd: Path) -> str:
    """The submit that resumes this run, as it can be pasted: this submit's spec and --set
    arguments (a --fresh run's experiment.name among them, rollout.num_rollout too) and
    launcher, run in the folder this one ran in (relative paths are read from there)."""
    where = {"local": ["--local"], "ray-address": ["--ray-address", ray_address or "ADDRESS"]}
    argv = ["vime", "submit", *invocation, *where.get(launcher, [])]
    return f"`{shlex.join(argv)}` in {cwd}"
