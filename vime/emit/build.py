"""The build folder of `vime compile`, written atomically: the files go to a temporary
sibling folder that replaces the target only when complete, and a folder vime did not
create is never replaced."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from vime.emit import argfile, plan_json, resolved, sbatch
from vime.emit.megatron import megatron_args
from vime.emit.vllm import vllm_args
from vime.plan import Plan

MARKER = ".vime-build"


class BuildError(Exception):
    pass


def files(plan: Plan, source_name: str, source_text: str, plan_obj: dict,
          build_dir: str, python: str = "python3") -> dict[str, str]:
    """The build folder's files; `python` is the nodes' interpreter in job.sbatch (`vime
    compile` and `vime submit` give their own, so that the two scripts are the same)."""
    digest = hashlib.sha256(source_text.encode()).hexdigest()
    name = plan.spec.experiment.name
    return {
        "resolved.toml": resolved.render(plan.spec, source_name, digest, build_dir),
        "plan.json": plan_json.dumps(plan_obj),
        "megatron.args": argfile.render(megatron_args(plan)),
        "vllm.args": argfile.render(vllm_args(plan)),
        "job.sbatch": sbatch.render(plan, build_dir, python),
        "README.txt": (
            f"vime build of experiment {name!r} from {source_name} (sha256 {digest[:16]}).\n\n"
            "resolved.toml  the spec with every default and derived value\n"
            "plan.json      layout, groups, engines and batch (as `vime plan --json`)\n"
            "megatron.args  the actor's Megatron-LM arguments (shlex.split gives the argv)\n"
            "vllm.args      each rollout engine's vLLM arguments\n"
            "job.sbatch     the Slurm batch script `vime submit` submits\n\n"
            f"Check it again:   vime plan {build_dir}/resolved.toml\n"
            f"Submit it:        vime submit {source_name}   (--dry-run prints the job script)\n"
            f"  or as it is:    sbatch {build_dir}/job.sbatch   (from the folder vime compile ran "
            "in; the job\n"
            "                  writes its job folder itself; its first log is slurm-<job id>.out)\n"
        ),
        MARKER: f"{digest}\n",
    }


def write(target: Path, contents: dict[str, str]) -> None:
    target = target.resolve()
    foreign = target.exists() and not (target / MARKER).is_file()
    if foreign and (not target.is_dir() or any(target.iterdir())):
        raise BuildError(f"{target} exists and was not written by vime compile; "
                         "choose another -o folder or remove it yourself")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name, text in contents.items():
            (staging / name).write_text(text)
        os.chmod(staging, 0o755)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            os.replace(target, old / "build")
            os.replace(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
