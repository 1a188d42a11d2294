"""job.sbatch: the Slurm batch script `vime submit` submits, byte for byte.

One task per node runs submitit's job runner (`python -m submitit.core._submit`), which loads
the pickled `runtime.job` entry point: task 0 starts the Ray head, the others join it, and
the head runs the runtime driver. submitit brings the USR2 checkpoint-and-requeue handling.

`vime submit` submits it from the experiment folder `<output_dir>/<name>/` with
`sbatch --hold --chdir=<that folder>` and releases it once the job folder `<job id>/` is
complete, so every path in the script is relative and no path from the spec appears in it.
Values from the spec: the schema's patterns bound them, each `#SBATCH` argument that is not
plainly safe is quoted the way sbatch reads directives (double quotes, `\\` and `\"` escaped:
sbatch runs no shell on them), and every shell word is shlex-quoted, so nothing a spec says
is executed.
"""

from __future__ import annotations

import re
import shlex

from vime.plan import Plan

# Where the job writes, relative to the experiment folder (%j: the job id, %t: the task = node).
JOB_FOLDER = "%j"
BATCH_LOG = "%j/logs/batch.log"
NODE_LOG = "%j/logs/node-%t.log"
SUBMITIT_FOLDER = "%j/submitit"
_PLAIN = re.compile(r"[A-Za-z0-9_.,:+=%/@-]*")


def sbatch_word(word: str) -> str:
    """One argument of an #SBATCH line as sbatch parses it (src/sbatch/opt.c: double quotes
    group, backslash escapes inside them, an unquoted # starts a comment)."""
    if _PLAIN.fullmatch(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sbatch_options(plan: Plan) -> dict[str, str | None]:
    spec = plan.spec
    cluster, slurm = spec.cluster, spec.cluster.slurm
    options: dict[str, str | None] = {
        "job-name": f"vime-{spec.experiment.name}",
        "nodes": str(cluster.nodes),
        "ntasks-per-node": "1",
        "gpus-per-node": str(cluster.gpus_per_node),
        "time": slurm.time,
        "output": BATCH_LOG,
        "open-mode": "append",  # a requeued job appends to the same logs
        "requeue": None,
        "signal": "USR2@120",  # submitit checkpoints and requeues 120 s before the limit
    }
    for key in ("partition", "account", "qos", "constraint", "reservation"):
        if getattr(slurm, key):
            options[key] = getattr(slurm, key)
    if slurm.cpus_per_task:
        options["cpus-per-task"] = str(slurm.cpus_per_task)
    if slurm.exclusive:
        options["exclusive"] = None
    return dict(sorted(options.items()))


def render(plan: Plan, build_dir: str = "", python: str = "python3") -> str:
    """The batch script; `python` is the interpreter of the nodes (the submitting one)."""
    spec = plan.spec
    lines = [
        "#!/bin/bash",
        f"# vime job {spec.experiment.name}: submitted from <output_dir>/<name>/ by `vime submit`",
        "# (sbatch --hold --chdir=<that folder>, released once <job id>/ is written).",
    ]
    for key, value in sbatch_options(plan).items():
        lines.append(f"#SBATCH --{key}" if value is None else f"#SBATCH --{key}={sbatch_word(value)}")
    lines += [f"#SBATCH {sbatch_word(arg)}" for arg in spec.cluster.slurm.extra_args]
    lines += ["", "set -eu", "# [cluster.env], exported on every node before Ray starts"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(spec.cluster.env.items())]
    lines += [
        "export SUBMITIT_EXECUTOR=slurm",
        "",
        "# One task per node: task 0 starts the Ray head, the others join it, then the head",
        "# runs the vime runtime driver with the compiled plan (runtime/job.py).",
        "srun --unbuffered --kill-on-bad-exit=1 " + shlex.join([
            f"--output={NODE_LOG}", python, "-u", "-m", "submitit.core._submit",
            SUBMITIT_FOLDER]),
        "",
    ]
    return "\n".join(lines)
