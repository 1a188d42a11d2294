"""The training ranks as one torchrun world without Ray (runtime/node/torchrun.py,
runtime/core/spmd.py): two CPU processes over gloo, the torch backends, the tiny spec on two
(logical) GPUs, so dp = 2.

Rank 0 runs the loop and the engine; each call reaches both ranks with their share. The
actor's log-probs, reassembled from the two replicas, must equal the engine's to rounding:
a share sent to the wrong rank or results put back out of order would show here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from specsupport import ROOT


def test_two_ranks_train_from_rank_zero(tmp_path):
    job = tmp_path / "job"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "runtime.node.torchrun", str(ROOT / "specs" / "tiny_cpu.toml"),
         "--set", "cluster.gpus_per_node=2", "--set", "rollout.num_rollout=2",
         "--job-dir", str(job), "--cpu-threads", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout"] for r in rows] == [0, 1]
    for row in rows:
        assert row["samples"] == 64
        assert row["train/rollout_logprob_abs_diff"] < 1e-4
        assert row["train/grad_norm"] > 0
    assert "rollout     1 | reward" in completed.stdout


def test_a_world_that_is_not_the_plan_is_refused(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
         "-m", "runtime.node.torchrun", str(ROOT / "specs" / "tiny_cpu.toml"),
         "--set", "cluster.gpus_per_node=2", "--job-dir", str(tmp_path / "job")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=300, check=False)
    assert completed.returncode != 0
    assert "the plan has 2 training ranks on 1 nodes; this world is 1 processes" in \
        completed.stderr + completed.stdout
