"""`vime submit` to Slurm warns (V701) when the interpreter job.sbatch runs on the nodes (the
submitting venv's, by absolute path) is on a file system of this machine only, for a job of
one node as for several: Slurm runs even one node's job on a machine it picks."""

from __future__ import annotations

import sys

import pytest
from launchkit import SMOKE, spec_sets, vime

from vime import pipeline
from vime.check.cluster import NODE_LOCAL_PREFIXES
from vime.launch import shared
from vime.parse import Source


def _one_node_spec(tmp_path):
    sets = spec_sets(tmp_path, nodes=1, gpus_per_node=4)
    result = pipeline.run(Source("spec.toml", SMOKE.read_text()), sets[1::2], SMOKE.parent)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics]
    return result.spec


def test_a_one_node_jobs_python_on_this_machine_only_is_warned_about(tmp_path):
    spec = _one_node_spec(tmp_path)
    table = [("/", "ext4"), ("/shared", "nfs4")]
    [python] = [d for d in shared.unshared(spec, "/opt/venv/bin/python", [], table)
                if "Python" in d.message]
    assert (python.severity, python.code) == ("warning", "V701")
    assert python.message == (
        "the job's Python /opt/venv/bin/python (job.sbatch runs it on the job's node) is on "
        "ext4 at /, a file system of this machine, and Slurm may run the job on another "
        "machine, which then finds no Python there")
    assert "virtual environment on a file system every node mounts" in python.help
    assert "no spec key names another interpreter" in python.help
    assert not [d for d in shared.unshared(spec, "/shared/venv/bin/python", [], table)
                if "Python" in d.message]


def test_submit_to_slurm_of_one_node_names_this_machines_python(tmp_path):
    prefix = next((p for p in NODE_LOCAL_PREFIXES
                   if sys.executable == p or sys.executable.startswith(p + "/")), None)
    local = shared.mount_of(sys.executable, shared.mounts())
    if not prefix and (local is None or local[1] not in shared.LOCAL_TYPES):
        pytest.skip(f"this venv is on {local}, which may be shared")
    done = vime("submit", str(SMOKE), "--dry-run", *spec_sets(tmp_path, nodes=1,
                                                              gpus_per_node=4))
    assert done.returncode == 0, done.stderr
    assert f"warning[V701]: the job's Python {sys.executable} (job.sbatch runs it on the " \
        "job's node)" in done.stderr, done.stderr
    assert "the job's Python" not in vime(
        "submit", str(SMOKE), "--ray-address", "127.0.0.1:9",
        *spec_sets(tmp_path, nodes=1, gpus_per_node=4)).stderr
