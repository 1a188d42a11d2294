"""`vime submit` warns (V701) when a path the nodes of a multi-node job need is on a file system
of this machine only: the venv's Python, output_dir, checkpoint folders, prompts
(vime/launch/shared.py). A job of one node is warned about its Python only
(tests/launch/test_shared_python.py)."""

from __future__ import annotations

import json
import re
import shutil
import sys
import uuid
from pathlib import Path

import pytest
from launchkit import ROOT, SMOKE, spec_sets, vime

from vime import pipeline
from vime.check.cluster import NODE_LOCAL_PREFIXES
from vime.launch import shared
from vime.parse import Source

SPECS = sorted((ROOT / "specs").glob("*.toml"))


def _node_local_prefix(path: str) -> str | None:
    return next((p for p in NODE_LOCAL_PREFIXES if path == p or path.startswith(p + "/")), None)


@pytest.fixture
def disk():
    """A folder outside /tmp and the other node-local prefixes (node-local by their names
    alone): the checkout's build folder, or the home's cache where the checkout is under /tmp
    (as a CI clone may be)."""
    base = next((b for b in (ROOT / "build", Path.home() / ".cache" / "vime-tests")
                 if _node_local_prefix(str(b)) is None), None)
    if base is None:
        pytest.skip("no folder outside /tmp to write to")
    folder = base / f"shared-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _spec(sets: list[str]):
    result = pipeline.run(Source("spec.toml", SMOKE.read_text()), sets[1::2], SMOKE.parent)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics]
    return result


def test_paths_on_this_machines_file_systems_are_warned_about(disk):
    nfs = disk / "nfs"
    (nfs / "runs").mkdir(parents=True)
    (disk / "prompts.jsonl").write_text('{"prompt": "1+1", "label": "2"}\n')
    table = [("/", "ext4"), (str(nfs), "nfs4")]
    result = _spec(spec_sets(nfs / "runs", **{
        "data.prompt_data": json.dumps(str(disk / "prompts.jsonl")),
        "model.save": json.dumps(str(nfs / "checkpoints")),
        "model.load": json.dumps(str(disk / "new" / "checkpoints"))}))
    found = shared.unshared(result.spec, str(nfs / "venv" / "bin" / "python"), [], table)
    assert [(d.severity, d.code, d.key, d.message) for d in found] == [
        ("warning", "V701", "model.load",
         f"model.load = {str(disk / 'new' / 'checkpoints')!r} would be made on ext4 at /, a file "
         "system of this machine, but the job has 2 nodes"),
        ("warning", "V701", "data.prompt_data",
         f"data.prompt_data = {str(disk / 'prompts.jsonl')!r} is on ext4 at /, a file system of "
         "this machine, but the job has 2 nodes")]
    assert all(d.location is not None and d.help for d in found)
    # the interpreter job.sbatch names; model.hf_checkpoint = "/nonexistent" is not judged
    [python] = shared.unshared(result.spec, "/tmp/venv/bin/python", [],
                               [("/", "nfs4")])
    assert python.key == "cluster.nodes" and python.message == (
        "the job's Python /tmp/venv/bin/python (job.sbatch runs it on every node) is under "
        "/tmp, which every machine has its own of, but the job has 2 nodes")
    assert "virtual environment on a file system every node mounts" in python.help
    one_node = _spec(spec_sets(disk, nodes=1, gpus_per_node=4))
    assert shared.unshared(one_node.spec, None, [], table) == []
    assert [d.key for d in shared.unshared(one_node.spec, "/tmp/venv/bin/python", [],
                                           table)] == ["cluster.nodes"]


def test_a_path_the_compiler_warned_about_is_not_warned_about_twice():
    result = _spec(spec_sets("/tmp/vime-runs"))
    assert "experiment.output_dir" in {d.key for d in result.diagnostics if d.code == "V701"}
    found = shared.unshared(result.spec, "/usr/bin/python3", result.diagnostics, [("/", "nfs")])
    assert found == []


def test_mounts_are_read_with_their_escapes(tmp_path):
    table = tmp_path / "mounts"
    table.write_text("/dev/vda / ext4 rw 0 0\nserver:/home /home nfs4 rw 0 0\n"
                     "tmpfs /mnt/my\\040disk tmpfs rw 0 0\n")
    found = shared.mounts(str(table))
    assert found == [("/", "ext4"), ("/home", "nfs4"), ("/mnt/my disk", "tmpfs")]
    assert shared.mount_of("/home/me/venv", found) == ("/home", "nfs4")
    assert shared.mount_of("/homework", found) == ("/", "ext4")
    assert shared.mount_of("/mnt/my disk/x", found) == ("/mnt/my disk", "tmpfs")


def test_submit_warns_about_this_machines_python_on_two_nodes(disk):
    prefix = _node_local_prefix(sys.executable)
    local = shared.mount_of(sys.executable, shared.mounts())
    if prefix:  # a checkout under /tmp
        why = f"is under {prefix}, which every machine has its own of"
    elif local is None or local[1] not in shared.LOCAL_TYPES:
        pytest.skip(f"this venv is on {local}, which may be shared")
    else:
        why = f"is on {local[1]} at {local[0]}"
    done = vime("submit", str(SMOKE), "--dry-run", *spec_sets(disk))
    assert done.returncode == 0, done.stderr
    assert (f"warning[V701]: the job's Python {sys.executable} (job.sbatch runs it on every "
            f"node) {why}") in done.stderr, done.stderr
    strict = vime("submit", str(SMOKE), "--dry-run", "--strict", *spec_sets(disk))
    assert strict.returncode == 1 and "error[V701]: the job's Python" in strict.stderr


def test_a_job_on_a_running_ray_cluster_is_warned_about_its_paths_not_its_python(disk):
    """--ray-address: the same V701 for the paths; the cluster's nodes run their own Python.
    At an address where nothing listens the submit stops after the diagnostics (exit 2)."""
    local = shared.mount_of(str(disk), shared.mounts())
    if _node_local_prefix(str(disk)) is None and (local is None
                                                  or local[1] not in shared.LOCAL_TYPES):
        pytest.skip(f"{disk} is on {local}, which may be shared")
    prompts = disk / "prompts.jsonl"
    prompts.write_text('{"prompt": "1+1", "label": "2"}\n')
    sets = spec_sets(disk, **{"data.prompt_data": json.dumps(str(prompts))})
    done = vime("submit", str(SMOKE), "--ray-address", "127.0.0.1:9", *sets)
    assert done.returncode == 2 and "no Ray cluster answers at 127.0.0.1:9" in done.stderr
    assert f"warning[V701]: data.prompt_data = {str(prompts)!r}" in done.stderr, done.stderr
    assert "the job's Python" not in done.stderr


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_no_warning_for_the_repositorys_single_node_specs(spec):
    done = vime("submit", str(spec), "--dry-run", cwd=ROOT)
    if not re.search(r"^nodes = 1\b", spec.read_text(), re.M) \
            and "#SBATCH --nodes=1\n" not in done.stdout:
        pytest.skip("a job of several nodes")
    assert done.returncode == 0, done.stderr
    # the interpreter is judged on any Slurm job (tests/launch/test_shared_python.py)
    paths = [line for line in done.stderr.splitlines()
             if "V701" in line and "the job's Python" not in line]
    assert paths == [], done.stderr
