"""Which of the packages the runtime imports are installed here, with versions, and which a
spec needs; and the CUDA, driver and GPUs torch would use: `vime doctor [SPEC]` on a login
or compute node, and one line in the head node's log at job start (runtime/node/job.py).

Two depths of looking. `installed()` reads package metadata and the import system's finders
and runs no package's code: fast enough for every job start and for `vime plan`, which
imports no torch, ray, vllm or megatron. `imports()` imports the packages with compiled
parts in child Pythons grouped as the job's processes import them (IMPORT_GROUPS: torch
once per group), asks the first group's torch for CUDA and its devices, and nvidia-smi for
the driver: a wheel built for another CUDA or torch (Transformer Engine's usual failure) is
found only that way, and a crash or a hang stays in the child.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

INSTALL_DOC = "docs/install.md"


@dataclass(frozen=True)
class Package:
    module: str  # what the runtime imports; for a HARDWARE row, what it reports
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
    # DeepEP, the flex MoE dispatcher's kernels (train.moe_token_dispatcher = "flex"): no
    # wheel on PyPI, built from github.com/deepseek-ai/DeepEP against torch, CUDA and NVSHMEM
    Package("deep_ep", ("deep_ep", "deep-ep"),
            f"build DeepEP from github.com/deepseek-ai/DeepEP against this torch and CUDA "
            f"(see {INSTALL_DOC})"),
    Package("wandb", ("wandb",), "pip install 'vime[wandb]'"),
    Package("tensorboard", ("tensorboard",), "pip install tensorboard"),
)
BY_MODULE = {p.module: p for p in PACKAGES}
# the children imports() starts, each importing its modules in order in one Python, as the
# job's processes do: a Megatron training rank (torch, Transformer Engine, megatron.core), a
# vLLM engine, the Ray driver. wandb and TensorBoard are pure Python: their metadata and
# finders (installed()) say what an import would. deep_ep loads its CUDA extension (and
# NVSHMEM) on import, as megatron-core's flex dispatcher does in a training rank.
IMPORT_GROUPS = (("torch", "transformer_engine", "megatron.core", "deep_ep"), ("vllm",),
                 ("ray",))
# rows imports() adds after the packages: what torch and nvidia-smi report
HARDWARE = (
    Package("cuda", (), f"a CUDA build of torch and an NVIDIA driver; see {INSTALL_DOC}"),
    Package("driver", (), "the NVIDIA driver (nvidia-smi)"),
    Package("gpus", (), "the GPUs torch uses (CUDA_VISIBLE_DEVICES)"),
)


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


# each child's lines to the parent start with this (an import may print lines of its own)
MARK = "@@vime-doctor@@ "
_IMPORT = f"""import importlib, json, sys, traceback
def say(*words):
    print({MARK!r} + json.dumps(words), flush=True)
for module in sys.argv[1:]:
    say("begin", module)
    try:
        importlib.import_module(module)
    except BaseException as err:
        say("failed", module, traceback.format_exception_only(err)[-1].strip())
        continue
    say("ok", module)
    if module == "torch":
        try:
            import torch
            cuda = {{"torch": torch.__version__, "cuda": torch.version.cuda,
                    "available": torch.cuda.is_available(), "devices": []}}
            for index in range(torch.cuda.device_count() if cuda["available"] else 0):
                props = torch.cuda.get_device_properties(index)
                cuda["devices"].append([props.name, props.total_memory])
        except BaseException as err:
            cuda = {{"problem": traceback.format_exception_only(err)[-1].strip()}}
        say("cuda", cuda)
"""


@dataclass(frozen=True)
class Imported:
    """What one child Python said: a problem per module it tried (None: imported), and what
    torch reported about CUDA (None: torch was not among its modules, or did not import)."""

    problems: dict[str, str | None]
    cuda: dict | None


def _ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited {returncode}"


def _import_group(modules: list[str], python: str, timeout_s: float) -> Imported:
    """Import `modules` in order in one child Python; a module the child crashed or hung on
    gets that as its problem, and the ones after it are imported in a fresh child."""
    problems: dict[str, str | None] = {}
    cuda = None
    left = list(modules)
    while left:
        try:
            done = subprocess.run([python, "-c", _IMPORT, *left], capture_output=True,
                                  text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
            stdout, ended = done.stdout, _ended(done.returncode)
        except subprocess.TimeoutExpired as err:
            out = err.stdout or b""
            stdout = out.decode(errors="replace") if isinstance(out, bytes) else out
            ended = f"did not finish in {timeout_s:.0f} s"
        begun = None
        for line in stdout.splitlines():
            if not line.startswith(MARK):
                continue
            word, *rest = json.loads(line[len(MARK):])
            if word == "begin":
                begun = rest[0]
            elif word in ("ok", "failed"):
                problems[rest[0]] = rest[1] if word == "failed" else None
                begun = None
            elif word == "cuda":
                cuda = rest[0]
        if begun is None:  # every module answered, or the child died between two
            left = [m for m in left if m not in problems]
            if left:  # died before its first module: nothing more to learn here
                problems.update({m: f"the child Python {ended}" for m in left})
            break
        problems[begun] = f"`import {begun}` {ended}"
        left = left[left.index(begun) + 1:]
    return Imported(problems, cuda)


def _nvidia_smi(timeout_s: float) -> tuple[list[tuple[str, int, str]] | None, str | None]:
    """nvidia-smi's GPUs as (name, MiB, driver version), or None and why there are none."""
    command = shutil.which("nvidia-smi")
    if command is None:
        return None, "no nvidia-smi on PATH: no NVIDIA driver here"
    try:
        done = subprocess.run([command, "--query-gpu=name,memory.total,driver_version",
                               "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"nvidia-smi did not answer in {timeout_s:.0f} s"
    except OSError as err:
        return None, f"nvidia-smi: {err}"
    if done.returncode != 0:
        said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        return None, f"nvidia-smi {_ended(done.returncode)}: " + (said[-1].strip() if said
                                                                  else "no output")
    gpus = []
    for line in done.stdout.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) == 3:
            name, mib, driver = fields
            gpus.append((name, int(mib) if mib.isdigit() else 0, driver))
    return gpus, None


def _counted(names_and_mib: list[tuple[str, float]]) -> str:
    """`2 × NVIDIA H100 80GB HBM3 (79.6 GiB)`, one part per distinct card."""
    return ", ".join(f"{count} × {name} ({gib:.1f} GiB)"
                     for (name, gib), count in Counter(names_and_mib).items())


def hardware(cuda: dict | None, torch_problem: str | None,
             smi: tuple[list[tuple[str, int, str]] | None, str | None]) -> list[Found]:
    """The cuda, driver and gpus rows: what torch (cuda, from the import child) and
    nvidia-smi (smi) report. A row is usable when there is a GPU behind it."""
    cuda_row, driver_row, gpus_row = HARDWARE
    gpus, no_smi = smi
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    masked = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    rows = []
    if cuda is None or "problem" in cuda:
        why = (torch_problem or "torch is not installed") if cuda is None else cuda["problem"]
        rows.append(Found(cuda_row, None, f"unknown: {why}"))
        devices = []
    else:
        devices = cuda["devices"]
        built = f"torch {cuda['torch']}"
        if cuda["cuda"] is None:
            rows.append(Found(cuda_row, None, f"not available: {built} is a CPU-only build"))
        elif not cuda["available"]:
            rows.append(Found(cuda_row, None, f"not available: {built} (CUDA {cuda['cuda']}) "
                              f"finds no GPU{masked}"))
        else:
            rows.append(Found(cuda_row, f"{cuda['cuda']} ({built}), "
                              f"{len(devices)} device(s){masked}"))
    if gpus:
        drivers = sorted({driver for _, _, driver in gpus})
        rows.append(Found(driver_row, ", ".join(drivers)))
    else:
        rows.append(Found(driver_row, None, no_smi or "nvidia-smi lists no GPU"))
    if devices:
        rows.append(Found(gpus_row, _counted([(name, total / 2**30)
                                              for name, total in devices])))
    elif gpus:
        rows.append(Found(gpus_row, None, "torch uses none; nvidia-smi lists "
                          + _counted([(name, mib / 1024) for name, mib, _ in gpus])))
    else:
        rows.append(Found(gpus_row, None, "no GPU"))
    return rows


def imports(packages=PACKAGES, python: str = sys.executable,
            timeout_s: float = 300) -> list[Found]:
    """installed(), and for each installed package with compiled parts whether `import` of it
    succeeds in a child Python (python), the IMPORT_GROUPS at once; then the HARDWARE rows:
    CUDA and the devices as the first group's torch sees them, the driver and GPUs as
    nvidia-smi lists them."""
    found = installed(packages)
    present = {f.package.module for f in found if f.version is not None}
    groups = [[m for m in group if m in present] for group in IMPORT_GROUPS]
    groups = [group for group in groups if group]
    with ThreadPoolExecutor(max_workers=len(groups) + 1) as pool:
        smi = pool.submit(_nvidia_smi, min(timeout_s, 30.0))
        children = list(pool.map(lambda group: _import_group(group, python, timeout_s),
                                 groups))
    problems = {m: p for child in children for m, p in child.problems.items()}
    cuda = next((child.cuda for child in children if child.cuda is not None), None)
    rows = [Found(f.package, f.version, problems.get(f.package.module)) for f in found]
    return rows + hardware(cuda, problems.get("torch"), smi.result())


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
        if spec.train.moe_token_dispatcher == "flex":
            wanted["deep_ep"] = 'train.moe_token_dispatcher = "flex"'
    if spec.logging.wandb_project:
        wanted["wandb"] = f"logging.wandb_project = {spec.logging.wandb_project!r}"
    if spec.logging.tensorboard_dir:
        wanted["tensorboard"] = f"logging.tensorboard_dir = {spec.logging.tensorboard_dir!r}"
    return wanted


def _state(found: Found) -> str:
    if found.package in HARDWARE:
        return found.version or found.problem or "-"
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
