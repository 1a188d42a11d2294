"""Which of the packages the runtime imports are installed here, with versions, and which a
spec needs: `vime doctor [SPEC]` on a login or compute node, and one line in the head node's
log at job start (runtime/node/job.py).

Two depths of looking. `installed()` reads package metadata and the import system's finders
and runs no package's code: fast enough for every job start and for `vime plan`, which
imports no torch, ray, vllm or megatron. `imports()` imports each package in a child
Python, as the job will: a wheel built for another CUDA or torch (Transformer Engine's
usual failure) is found only that way, and a crash or a hang stays in the child.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

INSTALL_DOC = "docs/install.md"


@dataclass(frozen=True)
class Package:
    module: str  # what the runtime imports
    distributions: tuple[str, ...]  # pip names that install it, the usual one first
    install: str  # how to get it


PACKAGES = (
    Package("torch", ("torch",), "pip install 'vime[runtime]'"),
    Package("ray", ("ray",), "pip install 'vime[runtime]'"),
    Package("vllm", ("vllm",), "pip install 'vime[vllm]'"),
    Package("megatron.core", ("megatron-core", "megatron_core"),
            "pip install 'vime[runtime]' (Python >= 3.12)"),
    Package("transformer_engine", ("transformer-engine", "transformer_engine",
                                   "transformer-engine-cu12", "transformer_engine_torch"),
            f"see {INSTALL_DOC} (built against this machine's torch and CUDA)"),
    Package("wandb", ("wandb",), "pip install 'vime[wandb]'"),
    Package("tensorboard", ("tensorboard",), "pip install tensorboard"),
)
BY_MODULE = {p.module: p for p in PACKAGES}


@dataclass(frozen=True)
class Found:
    package: Package
    version: str | None  # None: not installed
    problem: str | None = None  # installed, but importing it failed (imports() only)

    @property
    def usable(self) -> bool:
        return self.version is not None and self.problem is None


def _version(package: Package) -> str | None:
    for name in package.distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    top = package.module.split(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    return "(version unknown)" if found else None


def installed(packages=PACKAGES) -> list[Found]:
    """Each package's installed version, None when it is not installed; runs no package code."""
    return [Found(p, _version(p)) for p in packages]


_IMPORT = ("import importlib, sys\n"
           "importlib.import_module(sys.argv[1])\n")


def _import_problem(package: Package, python: str, timeout_s: float) -> str | None:
    try:
        done = subprocess.run([python, "-c", _IMPORT, package.module], capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"`import {package.module}` did not finish in {timeout_s:.0f} s"
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"`import {package.module}` exited {done.returncode}"


def imports(packages=PACKAGES, python: str = sys.executable,
            timeout_s: float = 300) -> list[Found]:
    """installed(), and for each installed package whether `import` of it succeeds in a child
    Python (python), all at once."""
    found = installed(packages)
    present = [f for f in found if f.version is not None]
    with ThreadPoolExecutor(max_workers=max(len(present), 1)) as pool:
        problems = dict(zip([f.package.module for f in present], pool.map(
            lambda f: _import_problem(f.package, python, timeout_s), present), strict=True))
    return [Found(f.package, f.version, problems.get(f.package.module)) for f in found]


def needs(spec) -> dict[str, str]:
    """module -> the spec's key and value that need it; Transformer Engine only when the spec
    asks for it by name (with "auto" the runtime takes it where it imports)."""
    wanted = {"torch": "the runtime", "ray": "the runtime"}
    if spec.inference.backend == "vllm":
        wanted["vllm"] = 'inference.backend = "vllm"'
    if spec.train.backend == "megatron":
        wanted["megatron.core"] = 'train.backend = "megatron"'
        if spec.train.transformer_impl == "transformer_engine":
            wanted["transformer_engine"] = 'train.transformer_impl = "transformer_engine"'
    if spec.logging.wandb_project:
        wanted["wandb"] = f"logging.wandb_project = {spec.logging.wandb_project!r}"
    if spec.logging.tensorboard_dir:
        wanted["tensorboard"] = f"logging.tensorboard_dir = {spec.logging.tensorboard_dir!r}"
    return wanted


def _state(found: Found) -> str:
    if found.version is None:
        return "not installed"
    return f"{found.version}, does not import: {found.problem}" if found.problem else \
        found.version


def table(found: list[Found], wanted: dict[str, str] | None = None) -> list[str]:
    """One line per package: its name, version or why it cannot be used, and what needs it;
    a missing package the spec needs says how to install it."""
    width = max(len(f.package.module) for f in found)
    lines = []
    for item in found:
        why = (wanted or {}).get(item.package.module)
        mark = "ok" if item.usable else ("MISSING" if why else "-")
        line = f"{mark:8} {item.package.module:{width}}  {_state(item)}"
        if why:
            line += f"  (needed: {why})"
            if not item.usable:
                line += f"; {item.package.install}"
        lines.append(line)
    return lines


def one_line(found: list[Found]) -> str:
    """The packages on one line for a job's log: `torch 2.14.1, ray 2.52.0, vllm -, ...`."""
    return ", ".join(f"{f.package.module} {f.version or '-'}" for f in found)


def missing(found: list[Found], wanted: dict[str, str]) -> list[Found]:
    """The packages the spec needs that are not usable here."""
    return [f for f in found if f.package.module in wanted and not f.usable]
