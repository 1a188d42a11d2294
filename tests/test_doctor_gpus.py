"""`vime doctor` on the GPUs: it reports torch's CUDA, the driver and the GPUs torch would
use, from a real torch and nvidia-smi (a stand-in script on PATH where a driver is wanted;
the table of the real torch alone, which `vime doctor` prints with the other packages);
and it imports torch once for the packages a training rank imports with it, and pure-Python
packages not at all (stand-in packages that log their imports to a file)."""

from __future__ import annotations

import importlib
import os
import stat
import sys

import pytest

from vime import doctor

SMI = """#!/bin/sh
echo "NVIDIA H100 80GB HBM3, 81559, 570.86.15"
echo "NVIDIA H100 80GB HBM3, 81559, 570.86.15"
"""


@pytest.fixture
def no_gpu(tmp_path, monkeypatch):
    """This machine as one without a GPU or driver: torch sees no device, nvidia-smi is not
    on PATH (the child Python is started by its full path)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    return bin_dir


def rows() -> dict[str, str]:
    """vime doctor's table of torch and the hardware, its lines (spaces collapsed) by their
    second word."""
    lines = doctor.table(doctor.imports([doctor.BY_MODULE["torch"]], timeout_s=120))
    return {line.split()[1]: " ".join(line.split()) for line in lines}


def test_doctor_says_there_is_no_gpu_driver_or_cuda_here(no_gpu):
    import torch

    found = rows()
    cuda = found["cuda"]
    assert cuda.startswith("- cuda not available: ")
    if torch.version.cuda:
        assert (f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no GPU "
                "(CUDA_VISIBLE_DEVICES='')") in cuda
    else:
        assert f"torch {torch.__version__} is a CPU-only build" in cuda
    assert found["driver"] == "- driver no nvidia-smi on PATH: no NVIDIA driver here"
    assert found["gpus"] == "- gpus no GPU"


def test_doctor_names_the_driver_and_the_gpus_nvidia_smi_lists(no_gpu):
    smi = no_gpu / "nvidia-smi"
    smi.write_text(SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    found = rows()
    assert found["driver"] == "ok driver 570.86.15"
    assert found["gpus"] == ("- gpus torch uses none; nvidia-smi lists 2 × NVIDIA H100 80GB "
                             "HBM3 (79.6 GiB)")


def test_gpus_torch_sees_are_counted_by_card():
    cuda = {"torch": "2.9.0+cu128", "cuda": "12.8", "available": True,
            "devices": [["NVIDIA H100 80GB HBM3", 85520809984]] * 8}
    smi = ([("NVIDIA H100 80GB HBM3", 81559, "570.86.15")] * 8, None)
    cuda_row, driver, gpus = doctor.hardware(cuda, None, smi)
    assert cuda_row.usable and cuda_row.version.startswith("12.8 (torch 2.9.0+cu128), 8 device(s)")
    assert driver.version == "570.86.15"
    assert gpus.version == "8 × NVIDIA H100 80GB HBM3 (79.6 GiB)"
    [unknown, *_] = doctor.hardware(None, "ImportError: libcudart.so.12: cannot open", smi)
    assert unknown.problem == "unknown: ImportError: libcudart.so.12: cannot open"


def _package(folder, name: str, body: str) -> None:
    path = folder.joinpath(*name.split("."))
    path.mkdir(parents=True)
    (path / "__init__.py").write_text(body)
    importlib.invalidate_caches()


def test_torch_is_imported_once_and_pure_python_packages_not_at_all(tmp_path, monkeypatch):
    """Stand-ins first on the child Pythons' path: torch; Transformer Engine and
    megatron.core, which import torch; wandb and TensorBoard. Each appends its name to a log
    when imported."""
    log = tmp_path / "imported.log"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("torch", "transformer_engine", "megatron", "wandb", "tensorboard"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    record = f"open({str(log)!r}, 'a').write(__name__ + '\\n')\n"
    _package(tmp_path, "torch", record)
    _package(tmp_path, "transformer_engine", "import torch\n" + record)
    _package(tmp_path, "megatron", "")
    _package(tmp_path, "megatron.core", "import torch\n" + record)
    _package(tmp_path, "wandb", record)
    _package(tmp_path, "tensorboard", record)
    packages = [doctor.BY_MODULE[m] for m in ("torch", "transformer_engine", "megatron.core",
                                              "wandb", "tensorboard")]
    found = {f.package.module: f for f in doctor.imports(packages, timeout_s=120)}
    assert sorted(log.read_text().split()) == ["megatron.core", "torch", "transformer_engine"]
    assert all(found[m].usable for m in ("torch", "transformer_engine", "megatron.core",
                                         "wandb", "tensorboard"))
    # the stand-in torch has no torch.cuda: the cuda row says so, the packages stand
    assert found["cuda"].problem.startswith("unknown: AttributeError")


def test_a_module_that_kills_its_child_is_named_and_the_next_ones_still_imported(
        tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("torch", "transformer_engine", "megatron"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    _package(tmp_path, "torch", "")
    _package(tmp_path, "transformer_engine", "import os\nos.kill(os.getpid(), 9)\n")
    _package(tmp_path, "megatron", "")
    _package(tmp_path, "megatron.core", "import torch\n")
    packages = [doctor.BY_MODULE[m] for m in ("torch", "transformer_engine", "megatron.core")]
    found = {f.package.module: f for f in doctor.imports(packages, timeout_s=120)}
    assert found["torch"].usable and found["megatron.core"].usable
    assert found["transformer_engine"].problem == "`import transformer_engine` killed by SIGKILL"
    assert os.environ["PYTHONPATH"] == str(tmp_path)
