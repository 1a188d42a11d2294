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
- the same for each [[eval.datasets]] table's prompt_data and reward, and for
  rollout.dynamic_sampling_filter when dynamic sampling is on.

Another driver (VIME_DRIVER) may read no prompts and no reward: nothing is checked then.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from runtime.core.slices import _path, _spec_dir
from runtime.rl import rewards, sampling


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


def reward_problem(name: str) -> str | None:
    if name in rewards.BUILTIN:
        return None
    try:
        rewards.load(name)
    except ValueError as err:
        return str(err)
    except Exception as err:  # the module's own code failed on import
        return f"rollout.reward = {name!r}: importing it failed: {type(err).__name__}: {err}"
    return None


def eval_and_filter_problem(spec: dict, spec_dir: Path) -> str | None:
    """The first eval dataset whose prompts do not open or whose reward does not import, or
    a dynamic-sampling filter that does not import; None when there is none."""
    for index, dataset in enumerate(spec.get("eval", {}).get("datasets", [])):
        key = f"eval.datasets[{index}]"
        problem = prompt_data_problem(dataset["prompt_data"], spec_dir)
        if problem:
            return problem.replace("data.prompt_data", f"{key}.prompt_data", 1)
        problem = reward_problem(dataset["reward"])
        if problem:
            return f"{key}: {problem}"
    rollout = spec["rollout"]
    name = rollout.get("dynamic_sampling_filter")
    if name and rollout.get("dynamic_sampling"):
        try:
            sampling.load_filter(name)
        except ValueError as err:
            return str(err)
        except Exception as err:  # the module's own code failed on import
            return (f"rollout.dynamic_sampling_filter = {name!r}: importing it failed: "
                    f"{type(err).__name__}: {err}")
    return None


def check_job(job_dir: Path) -> None:
    """Raises PreflightError with the first problem of the job folder's spec."""
    plan = json.loads((job_dir / "plan.json").read_text())
    spec = tomllib.loads((job_dir / "resolved.toml").read_text())
    problem = (prompt_data_problem(spec["data"]["prompt_data"], _spec_dir(plan, job_dir))
               or reward_problem(spec["rollout"]["reward"])
               or eval_and_filter_problem(spec, _spec_dir(plan, job_dir)))
    if problem:
        raise PreflightError(problem)
