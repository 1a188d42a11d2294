"""job.sbatch: the Slurm batch script `vime submit` submits, byte for byte, and the build
folder's job.sbatch: the same text (`vime compile` renders it with the same interpreter;
vime/emit/build.py writes it, vime/launch/slurm.py submits it). How it runs, how it is
submitted and how the spec's values are quoted: docs/design.md, "The batch script".
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
        "open-mode": "append",  # a requeued job appends to the same logs
        "requeue": None,
        "signal": "USR2@120",  # submitit checkpoints and requeues 120 s before the limit
    }
    for key in ("partition", "account", "qos", "constraint", "reservation"):
        if getattr(slurm, key):
            options[key] = getattr(slurm, key)
    if slurm.cpus_per_task:
        options["cpus-per-task"] = str(slurm.cpus_per_task)
    # every byte of the node: the plan's host estimate (memory_comment) leaves out Ray's
    # object store, the page cache and the OS, and a cgroup limit below what the job touches
    # gets it killed; a node without memory configured has RealMemory=1 MB, which --mem=<n>G
    # would exceed (slurm.conf's RealMemory default). cluster.slurm.extra_args = ["--mem=..."] comes later and wins.
    options["mem"] = "0"
    if slurm.exclusive:
        options["exclusive"] = None
    return dict(sorted(options.items()))


def render(plan: Plan, build_dir: str = "", python: str = "python3") -> str:
    """The batch script; `python` is the interpreter of the nodes (the submitting one)."""
    spec = plan.spec
    lines = [
        "#!/bin/bash",
        f"# vime job {spec.experiment.name}. `vime submit` submits this script from <output_dir>/<name>/",
        "# (sbatch --hold --chdir=<that folder> --output=%j/logs/batch.log, released once <job id>/",
        "# is written); `sbatch job.sbatch` from the folder `vime compile` ran in runs the same job.",
    ]
    for key, value in sbatch_options(plan).items():
        lines.append(f"#SBATCH --{key}" if value is None else f"#SBATCH --{key}={sbatch_word(value)}")
    lines += [f"#SBATCH {sbatch_word(arg)}" for arg in spec.cluster.slurm.extra_args]
    lines += ["", memory_comment(plan), cpus_comment(plan), ""]
    lines += ["set -eu", "# [cluster.env], exported on every node before Ray starts"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(spec.cluster.env.items())]
    lines += [
        "export SUBMITIT_EXECUTOR=slurm",
        "",
        "# The job folder <job id>/: written by `vime submit`, or now from this script's build",
        "# folder (vime/launch/batch.py); the nodes start in its experiment folder.",
        f"experiment_dir=$({shlex.quote(python)} -m vime.launch.batch)",
        'cd "$experiment_dir"',
        "",
        "# One task per node: task 0 starts the Ray head, the others join it, then the head",
        "# runs the vime runtime driver with the compiled plan (runtime/node/job.py).",
        "srun --unbuffered --kill-on-bad-exit=1 " + _srun_cpus(plan) + shlex.join([
            f"--output={NODE_LOG}", python, "-u", "-m", "submitit.core._submit",
            SUBMITIT_FOLDER]),
        "",
    ]
    return "\n".join(lines)


def memory_comment(plan: Plan) -> str:
    memory = plan.memory
    if memory is None or not memory.host_terms:
        return "# --mem=0: all of each node's memory (no host memory plan for this spec)"
    return (f"# --mem=0: all of each node's memory; the plan needs {memory.host_per_node / 2**30:.1f}"
            " GiB of host memory per node (vime plan: memory per node)")


def cpus_comment(plan: Plan) -> str:
    slurm = plan.spec.cluster.slurm
    if slurm.cpus_per_task:
        return f"# each node's task gets cluster.slurm.cpus_per_task = {slurm.cpus_per_task} CPUs"
    return ("# each node's task gets every CPU Slurm gave the node (srun --cpus-per-task="
            "$SLURM_CPUS_ON_NODE; all of them with --exclusive)")


def _srun_cpus(plan: Plan) -> str:
    """srun does not take --cpus-per-task from the batch script's #SBATCH lines (Slurm 22.05+
    passes it only through SRUN_CPUS_PER_TASK), and without it a step's task is bound to
    one CPU: Ray would start with --num-cpus 1 (runtime/node/job.py reads
    SLURM_CPUS_PER_TASK)."""
    cpus = plan.spec.cluster.slurm.cpus_per_task
    return f"--cpus-per-task={cpus} " if cpus else '--cpus-per-task="$SLURM_CPUS_ON_NODE" '
