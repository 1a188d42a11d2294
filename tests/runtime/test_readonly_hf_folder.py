"""A read-only HF export folder (<model.save>/hf, checkpoint.save_hf_interval > 0) is said
before the job starts, as a read-only model.save is, not at the first export: by `vime submit
--local` before anything starts, and by the head node's checks before Ray (a real read-only
tmpfs mounted there)."""

from __future__ import annotations

import json

from runtimekit import TINY, vime
from test_disk_faults import MiB, tmpfs

from runtime.node.preflight import save_dir_problem


def test_a_read_only_hf_folder_is_caught_before_the_job_starts(tmp_path):
    save = tmp_path / "ckpt"
    with tmpfs(save / "hf", MiB, read_only=True) as hf:
        done = vime("submit", "--local", str(TINY),
                    "--set", f"experiment.output_dir={json.dumps(str(tmp_path / 'runs'))}",
                    "--set", f"model.save={json.dumps(str(save))}",
                    "--set", "checkpoint.save_hf_interval=1", "--set", "rollout.num_rollout=1",
                    "--set", "eval.datasets=[]", timeout=300)
        head = save_dir_problem(str(save), tmp_path, tmp_path / "runs" / "tiny-cpu", hf=True)
        without_exports = save_dir_problem(str(save), tmp_path, tmp_path / "runs" / "tiny-cpu")
    assert done.returncode == 2, done.stdout + done.stderr
    assert (f"vime: error: checkpoint.save_hf_interval: cannot write HF folders in {hf}: "
            "Read-only file system") in done.stderr, done.stderr
    assert not list((tmp_path / "runs" / "tiny-cpu").glob("local-*"))  # no job started
    assert head and f"cannot write HF folders in {hf}" in head
    assert without_exports is None  # no HF folder is written: hf/ is not the run's
