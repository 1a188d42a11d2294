"""A job of the torch pair run on this machine (`--local`, or `--ray-address` of a Ray cluster
here) where the NVIDIA driver shows no GPU (/proc/driver/nvidia/gpus/ missing or empty) is
said to have logical GPUs, torch computing on the CPU: in `vime submit`'s first line, in
`vime logs -f`'s and in `vime status`."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from launchkit import DRIVERS, ROOT, vime

from vime.launch import follow
from vime.launch.jobdir import JobFolder
from vime.launch.local import NVIDIA_GPUS, layout_words, on_this_machine

TINY = ROOT / "specs" / "tiny_cpu.toml"
LOGICAL = "1 node × 1 logical GPU (none here: torch runs on the CPU)"


def test_no_nvidia_gpu_folder_means_logical_gpus(tmp_path):
    missing, empty, one = tmp_path / "missing", tmp_path / "empty", tmp_path / "one"
    empty.mkdir()
    (one / "0000:17:00.0").mkdir(parents=True)
    assert layout_words(1, 1, torch_pair=True, here=True, nvidia_gpus=missing) == LOGICAL
    assert layout_words(1, 1, torch_pair=True, here=True, nvidia_gpus=empty) == LOGICAL
    assert layout_words(2, 4, torch_pair=True, here=True, nvidia_gpus=empty) == \
        "2 nodes × 4 logical GPUs (none here: torch runs on the CPU)"
    assert layout_words(1, 1, torch_pair=True, here=True, nvidia_gpus=one) == "1 node × 1 GPU"
    # Megatron and vLLM need real GPUs; a Slurm job's are on its nodes
    assert layout_words(1, 1, torch_pair=False, here=True, nvidia_gpus=missing) == \
        "1 node × 1 GPU"
    assert layout_words(2, 8, torch_pair=True, here=False, nvidia_gpus=missing) == \
        "2 nodes × 8 GPUs"


def test_a_ray_cluster_here_is_one_at_an_address_of_this_machine():
    assert on_this_machine("127.0.0.1:6379") and on_this_machine("localhost:6379")
    assert on_this_machine("auto")
    assert not on_this_machine("203.0.113.7:6379")  # TEST-NET-3, no machine's own address


def _finished_local_job(tmp_path: Path, backend: str) -> Path:
    folder = tmp_path / "tiny" / "local-0"
    (folder / "logs").mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({
        "job_id": "local-0", "launcher": "local", "experiment": "tiny", "nodes": 1,
        "gpus_per_node": 1, "spec": str(TINY), "spec_sha256": "0" * 64}) + "\n")
    (folder / "resolved.toml").write_text(
        f'[rollout]\nnum_rollout = 2\n\n[train]\nbackend = "{backend}"\n\n'
        f'[inference]\nbackend = "{backend}"\n')
    (folder / "outcome.json").write_text('{"state": "succeeded", "attempt": 0}\n')
    return folder


def _no_gpu_here() -> bool:
    return not NVIDIA_GPUS.is_dir() or not any(NVIDIA_GPUS.iterdir())


def test_logs_f_and_status_of_a_torch_job_say_logical_gpus(tmp_path):
    folder, out = JobFolder(_finished_local_job(tmp_path, "torch")), io.StringIO()
    assert follow.watch(folder, out=out) == 0
    header = out.getvalue().splitlines()[0]
    words = layout_words(1, 1, torch_pair=True, here=True)
    assert header.startswith(f"vime: job local-0: tiny, {words}, here"), header
    assert f"experiment tiny: {words}, spec" in follow.status_text(folder)
    if _no_gpu_here():
        assert words == LOGICAL


def test_logs_f_of_a_megatron_job_says_gpus(tmp_path):
    out = io.StringIO()
    assert follow.watch(JobFolder(_finished_local_job(tmp_path, "megatron")), out=out) == 0
    assert out.getvalue().startswith("vime: job local-0: tiny, 1 node × 1 GPU, here")


@pytest.mark.slow
def test_submit_local_of_the_tiny_spec_says_logical_gpus(tmp_path):
    shutil.copytree(TINY.parent / "data", tmp_path / "data")
    spec = Path(shutil.copy(TINY, tmp_path / "tiny_cpu.toml"))
    done = vime("submit", str(spec), "--local", "--set",
                f'experiment.output_dir="{tmp_path / "runs"}"',
                env={"VIME_DRIVER": f"{DRIVERS}:fail", "VIME_STATE_DIR": str(tmp_path / "state")},
                cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    words = layout_words(1, 1, torch_pair=True, here=True)
    assert first.startswith("vime: job local-") and f": tiny-cpu, {words}, here" in first, first
    if _no_gpu_here():
        assert words == LOGICAL
