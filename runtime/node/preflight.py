"""What the default driver would stop on after Ray's start-up, checked on the head node before
Ray starts: otherwise a missing prompt file is found after the queue wait and Ray's start-up
(tests/launch/test_start.py).

Checked: data.prompt_data (and each [[eval.datasets]] table's) opens, a "module:function"
reward, rollout.function and dynamic-sampling filter import, and the checkpoint folder is
writable with room for a save. Another driver (VIME_DRIVER) gets no checks. Whatever the
driver, the head's log gets one line of the installed packages (vime/doctor.py).
Each check and why it runs here: docs/design.md, "The head node's checks before Ray".
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from runtime.core.slices import _path, _spec_dir
from runtime.rl import custom_rollout, rewards, sampling
from runtime.rl.checkpoint import CheckpointError, Checkpoints
from vime import doctor

# key of [logging] -> the module its logger imports (runtime/rl/metrics.py)
LOGGERS = (("wandb_project", "wandb"), ("tensorboard_dir", "tensorboard"))


class PreflightError(RuntimeError):
    """The job cannot run: the message says which key and why, and is the job's outcome."""


def prompt_data_problem(value: str, spec_dir: Path, input_key: str | None = None,
                        label_key: str | None = None) -> str | None:
    """None when the prompt file opens and every line is a JSON object with the input and
    label keys, else the message: the driver's own (runtime/core/slices.py,
    runtime/rl/data.py), after the key, naming the file and the line."""
    try:
        path = _path(value, spec_dir, must_exist=True)
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    return f"data.prompt_data: {path}:{number}: not JSON: {err}"
                if not isinstance(row, dict):
                    return f"data.prompt_data: {path}:{number}: not a JSON object"
                for key, name in ((input_key, "data.input_key"), (label_key, "data.label_key")):
                    if key is not None and key not in row:
                        return (f"data.prompt_data: {path}:{number}: no key {key!r} ({name}); "
                                f"it has {sorted(row)}")
        return None
    except FileNotFoundError as err:
        return f"data.prompt_data: {err}"
    except UnicodeDecodeError as err:
        return f"data.prompt_data: {value}: not UTF-8 text: {err}"
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


def function_problem(name: str | None, spec_dir: str | None = None) -> str | None:
    """None when rollout.function is unset or imports as an async function."""
    if not name:
        return None
    try:
        custom_rollout.load(name, spec_dir)
    except ValueError as err:
        return str(err)
    except Exception as err:  # the module's own code failed on import
        return f"rollout.function = {name!r}: importing it failed: {type(err).__name__}: {err}"
    return None


def save_dir_problem(save: str | None, spec_dir: Path, experiment_dir: Path,
                     hf: bool = False) -> str | None:
    """None when the checkpoint folder can be written and has room for the next save, and
    (hf: checkpoint.save_hf_interval > 0) its HF folders' folder can be written too."""
    folder = _path(save, spec_dir) if save else Path(experiment_dir) / "checkpoints"
    checkpoints = Checkpoints(folder)
    try:
        checkpoints.check_writable()
        checkpoints.check_space()
    except CheckpointError as err:
        return f"{'model.save' if save else 'experiment.output_dir'}: {err}"
    if hf:
        try:
            checkpoints.check_hf_writable()
        except CheckpointError as err:
            return f"checkpoint.save_hf_interval: {err}"
    return None


def eval_and_filter_problem(spec: dict, spec_dir: Path, reward_dir: str | None = None) -> str | None:
    """The first eval dataset whose prompts do not open or whose reward does not import, or
    a dynamic-sampling filter that does not import; None when there is none."""
    for index, dataset in enumerate(spec.get("eval", {}).get("datasets", [])):
        key = f"eval.datasets[{index}]"
        problem = prompt_data_problem(dataset["prompt_data"], spec_dir)
        if problem:
            return problem.replace("data.prompt_data", f"{key}.prompt_data", 1)
        problem = reward_problem(dataset["reward"], reward_dir)
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
    spec_dir = _spec_dir(plan, job_dir)
    data = spec["data"]
    problem = (prompt_data_problem(data["prompt_data"], spec_dir, data["input_key"],
                                   data["label_key"])
               or reward_problem(spec["rollout"]["reward"], spec_dir_of(job_dir))
               or function_problem(spec["rollout"].get("function"), spec_dir_of(job_dir))
               or save_dir_problem(spec["model"].get("save"), spec_dir, job_dir.parent,
                                   hf=spec["checkpoint"].get("save_hf_interval", 0) > 0)
               or eval_and_filter_problem(spec, spec_dir, spec_dir_of(job_dir)))
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
