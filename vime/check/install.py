"""V925: packages a spec's keys turn on that the Python vime runs in lacks.

Looked up with the import system's finders and package metadata (vime/doctor.py), never
imported: `vime plan` imports no wandb."""

from __future__ import annotations

from vime import doctor
from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec

# key -> the module its logger imports (runtime/rl/metrics.py)
_LOGGERS = (("logging.wandb_project", "wandb"), ("logging.tensorboard_dir", "tensorboard"))


@rule("V925", "logger-installed", severity="warning", enforced_by="vime")
def logger_installed(spec: Spec):
    """A logger the spec turns on whose package is not installed where vime runs.

    logging.wandb_project turns Weights & Biases on and logging.tensorboard_dir TensorBoard;
    the runtime imports wandb or tensorboard when the run starts (runtime/rl/metrics.py) and,
    when it cannot, goes on without that logger: a run of hours whose curves never reach
    W&B, said once in the log ("Weights & Biases disabled: ModuleNotFoundError"). vime
    looks for the package in the Python it runs in, which is the one `vime submit` starts on
    every node (job.sbatch runs vime's own interpreter), without importing it. The head
    node says it again at job start, in capitals, with what is installed there.
    A warning: a job on a Ray cluster of its own (--ray-address) runs that cluster's Python.
    Fix: pip install 'vime[wandb]' (or tensorboard) in this environment; `vime doctor SPEC`
    lists what the spec needs and what is installed; or remove the key."""
    for key, module in _LOGGERS:
        value = getattr(spec.logging, key.split(".")[1])
        if not value:
            continue
        [found] = doctor.installed([doctor.BY_MODULE[module]])
        if found.version is None:
            package = doctor.BY_MODULE[module]
            yield Finding(key, f"{key} = {value!r}, but {module} is not installed in this "
                          "Python, which the job runs on every node: the run would go on "
                          f"without {module}",
                          help=f"{package.install}; or remove {key}")
