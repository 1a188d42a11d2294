"""What the default driver would stop on after Ray's start-up, checked on the head node before
Ray starts (issue 15: a missing prompt file was found after the queue wait and 40 s of Ray).

- data.prompt_data must be a file the head can open: on Slurm the path may exist only on the
  cluster, so `vime submit` cannot check it, and `--local` checks it before the job with the
  same message (vime/cli.py calls prompt_data_problem).
- a "module:function" rollout.reward must import: compile only looks for it without running
  code (V907, a warning: the module may be installed on the cluster only). Imported here, in
  the head's own process, where the driver imports it anyway (runtime/rl/rewards.py): the
  same module a little earlier, with the driver's own message. A misspelt built-in name is
  V906 at compile time and never reaches a job.

Another driver (VIME_DRIVER) may read no prompts and no reward: nothing is checked then.

Whatever the driver, the head's log gets one line of the packages installed on it with their
versions (vime/doctor.py, read from package metadata, nothing imported), and a line in
capitals for a logger the spec turns on whose package is missing there: the metrics logger
goes on without it (runtime/rl/metrics.py).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from runtime.core.slices import _path, _spec_dir
from runtime.rl import rewards
from vime import doctor

# key of [logging] -> the module its logger imports (runtime/rl/metrics.py)
LOGGERS = (("wandb_project", "wandb"), ("tensorboard_dir", "tensorboard"))


class PreflightError(RuntimeError):
    """The job cannot run: the message says which key and why, and is the job's outcome."""


def prompt_data_problem(value: str, spec_dir: Path) -> str | None:
    """None when the prompt file opens, else the message: the one the driver would give
    (runtime/core/slices.py), after the key."""
    try:
        with open(_path(value, spec_dir, must_exist=True), "rb"):
            return None
    except FileNotFoundError as err:
        return f"data.prompt_data: {err}"
    except OSError as err:
        return f"data.prompt_data: {err.filename}: {err.strerror}"


def spec_dir_of(job_dir: Path) -> str | None:
    """The spec's folder as `vime submit` recorded it (job.json), where rollout.reward's
    module is looked for first; None for a job folder without it."""
    try:
        return json.loads((job_dir / "job.json").read_text()).get("spec_dir")
    except (OSError, ValueError):
        return None


def reward_problem(name: str, spec_dir: str | None = None) -> str | None:
    if name in rewards.BUILTIN:
        return None
    try:
        rewards.load(name, spec_dir)
    except ValueError as err:
        return str(err)
    except Exception as err:  # the module's own code failed on import
        return f"rollout.reward = {name!r}: importing it failed: {type(err).__name__}: {err}"
    return None


def check_job(job_dir: Path) -> None:
    """Raises PreflightError with the first problem of the job folder's spec."""
    plan = json.loads((job_dir / "plan.json").read_text())
    spec = tomllib.loads((job_dir / "resolved.toml").read_text())
    problem = (prompt_data_problem(spec["data"]["prompt_data"], _spec_dir(plan, job_dir))
               or reward_problem(spec["rollout"]["reward"], spec_dir_of(job_dir)))
    if problem:
        raise PreflightError(problem)


def installed_lines(spec: dict) -> list[str]:
    """The packages installed here, and a loud line per logger the spec (resolved.toml's
    tables) turns on whose package is not installed."""
    found = {f.package.module: f for f in doctor.installed()}
    lines = [f"vime: installed here: {doctor.one_line(list(found.values()))}"]
    logging = spec.get("logging", {})
    for key, module in LOGGERS:
        if logging.get(key) and found[module].version is None:
            lines.append(f"vime: WARNING: logging.{key} = {logging[key]!r} but {module} is NOT "
                         f"INSTALLED on this node: this run logs no {module} (metrics.jsonl "
                         f"only); {doctor.BY_MODULE[module].install}")
    return lines
