"""job.sbatch: the Slurm batch script of the job, for reading and auditing.

Sorted #SBATCH keys; every value that came from the spec is checked by the schema's
patterns and every shell word is shlex-quoted, so nothing a spec says is executed.
"""

from __future__ import annotations

import shlex

from vime.plan import Plan


def sbatch_options(plan: Plan) -> dict[str, str | None]:
    spec = plan.spec
    cluster, slurm = spec.cluster, spec.cluster.slurm
    job_dir = f"{spec.experiment.output_dir}/{spec.experiment.name}/%j"
    options: dict[str, str | None] = {
        "job-name": f"vime-{spec.experiment.name}",
        "nodes": str(cluster.nodes),
        "ntasks-per-node": "1",
        "gpus-per-node": str(cluster.gpus_per_node),
        "time": slurm.time,
        "output": f"{job_dir}/slurm-%j-%t.out",
        "error": f"{job_dir}/slurm-%j-%t.err",
        "signal": "USR2@120",  # time to checkpoint before the limit
    }
    for key in ("partition", "account", "qos", "constraint", "reservation"):
        if getattr(slurm, key):
            options[key] = getattr(slurm, key)
    if slurm.cpus_per_task:
        options["cpus-per-task"] = str(slurm.cpus_per_task)
    if slurm.exclusive:
        options["exclusive"] = None
    return dict(sorted(options.items()))


def render(plan: Plan, build_dir: str) -> str:
    spec = plan.spec
    lines = ["#!/bin/bash"]
    for key, value in sbatch_options(plan).items():
        lines.append(f"#SBATCH --{key}" if value is None else f"#SBATCH --{key}={value}")
    lines += [f"#SBATCH {arg}" for arg in spec.cluster.slurm.extra_args]
    lines += ["", "set -euo pipefail", "# [cluster.env], exported on every node before Ray starts"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(spec.cluster.env.items())]
    lines += [
        "",
        "# One task per node: task 0 starts the Ray head, the others join it, then the head",
        "# runs the vime runtime driver with the compiled plan.",
        "srun --kill-on-bad-exit=1 python -m runtime.job "
        + " ".join(shlex.quote(a) for a in ("--plan", f"{build_dir}/plan.json",
                                             "--resolved", f"{build_dir}/resolved.toml")),
        "",
    ]
    return "\n".join(lines)
