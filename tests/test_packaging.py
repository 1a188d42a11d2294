"""`pip install 'vime[runtime]' vllm` resolves, and vLLM's pin decides torch.

pip resolves against PyPI with --dry-run, so nothing is installed. The index here serves no
PEP 658 metadata files, so a plain dry run downloads every wheel it considers (2.5 GB for
vLLM 0.33 and its CUDA libraries, measured 2026-12-01); fast-deps reads each wheel's METADATA
through HTTP range requests instead (87 MiB). Each resolution takes 20-26 s. Where PyPI cannot
be reached the tests skip, and fail under CI=true."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.network

ROOT = Path(__file__).resolve().parents[1]
INDEX = "https://pypi.org/simple/"


def _require_pypi() -> None:
    try:
        context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
        urllib.request.urlopen(INDEX + "vllm/", timeout=15, context=context).close()
    except OSError as err:
        reason = f"PyPI cannot be reached ({INDEX}vllm/: {err})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {reason}; the packaging test needs it")
        pytest.skip(reason)


def _resolve(requirements: list[str], report: Path) -> dict[str, dict]:
    """pip's resolution of these requirements, as if into an empty environment: name ->
    the metadata pip recorded."""
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--quiet", "--no-input", "--use-feature=fast-deps", "--report", str(report),
               *requirements]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (f"pip cannot resolve {requirements}:\n"
                                  + "\n".join(done.stderr.splitlines()[-15:]))
    return {item["metadata"]["name"].lower(): item["metadata"]
            for item in json.loads(report.read_text())["install"]}


def _pinned_torch(vllm_metadata: dict) -> str:
    for line in vllm_metadata.get("requires_dist", []):
        requirement = Requirement(line)
        if requirement.name == "torch" and requirement.marker is None:
            [pin] = requirement.specifier
            assert pin.operator == "==", f"vLLM asks for {requirement}, not one torch"
            return pin.version
    raise AssertionError("vLLM's metadata names no torch")


@pytest.mark.parametrize(("requirements", "vllm_series"), [
    pytest.param([".[vllm]"], "0.33.", id="vllm-extra"),  # the newest in the extra's range
    pytest.param([".[runtime]", "vllm==0.33.*"], "0.33.", id="users-0.33"),
    pytest.param([".[runtime]", "vllm==0.26.0"], "0.26.0", id="gpu-machine-0.26"),
])
def test_the_runtime_installs_with_vllm_and_takes_its_torch(requirements, vllm_series,
                                                            tmp_path):
    _require_pypi()
    resolved = _resolve(requirements, tmp_path / "report.json")
    assert resolved["vime"]["version"] and resolved["vllm"]["version"].startswith(vllm_series)
    assert resolved["torch"]["version"] == _pinned_torch(resolved["vllm"])
    # the default training backend comes with the runtime, on the torch vLLM pins
    assert resolved["megatron-core"]["version"].startswith("0.19.")


def test_the_wandb_extra_installs_wandb(tmp_path):
    _require_pypi()
    resolved = _resolve([".[wandb]"], tmp_path / "report.json")
    assert resolved["wandb"]["version"] and "torch" not in resolved


def test_the_wheel_holds_every_package_and_runs_outside_the_checkout(tmp_path):
    # A user's `pip install vime` gets the wheel, not the checkout: every package of vime/
    # and runtime/ is in it, and plan, compile and import work from it where no schema/ or
    # checkout is near (the schema and the flag catalogs come from vime/data/).
    _require_pypi()
    # from a copy of the sources: setuptools builds a checkout in its build/, and what an
    # earlier build left in build/lib would be packed again
    source = tmp_path / "source"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for folder in ("vime", "runtime", "schema"):
        shutil.copytree(ROOT / folder, source / folder, ignore=skip)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                            "--no-input", "-w", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("vime-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    packages = sorted(str(init.parent.relative_to(ROOT)) for folder in ("vime", "runtime")
                      for init in (ROOT / folder).rglob("__init__.py"))
    assert [p for p in packages if f"{p}/__init__.py" not in names] == []
    data = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "vime" / "data").glob("*.json"))
    assert data and [p for p in data if p not in names] == []

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-input",
                                str(wheel)], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def vime(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / "vime"), *args], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=120)

    where = subprocess.run([str(python), "-c", "import vime; print(vime.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
    assert str(venv) in where.stdout, where.stdout + where.stderr  # not the checkout's
    spec = ROOT / "specs" / "qwen3_30b.toml"
    planned = vime("plan", str(spec))
    assert planned.returncode == 0 and "memory" in planned.stdout.lower(), planned.stderr
    compiled = vime("compile", str(spec), "-o", str(elsewhere / "build"))
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    assert (elsewhere / "build" / "megatron.args").is_file()
    script = ROOT / "tests" / "fixtures" / "scripts" / "seed" / "run-qwen3-30B-A3B.sh"
    imported = vime("import", str(script), "-o", str(elsewhere / "imported.toml"))
    assert imported.returncode in (0, 1), imported.stdout + imported.stderr
    assert (elsewhere / "imported.toml").is_file(), imported.stdout + imported.stderr
