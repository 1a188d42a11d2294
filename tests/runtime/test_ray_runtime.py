"""The driver on a real Ray with four logical GPUs: placement from the plan, colocated and
disaggregated layouts, data parallelism over ranks."""

from __future__ import annotations

import json

import pytest
import torch
from runtimekit import job_config, metrics

from runtime.node import driver

# Two data-parallel ranks sum their gradients of a loss already divided by the whole step's
# tokens, so they take the step one rank takes; only the order of float additions differs.
DP_TOLERANCE = 1e-4


def _drive(tmp_path, job, **keys):
    plan, resolved, config = job_config(tmp_path, job, **keys)
    driver.run(plan, resolved, config.job_dir, False)
    return plan, config


def _final_weights(config) -> dict:
    latest = (config.save_dir / "latest").read_text().strip()
    return torch.load(config.save_dir / latest / "train" / "model_optim.pt")["model"]


@pytest.mark.slow
def test_layouts_from_the_plan_and_two_ranks_take_the_step_one_rank_takes(tmp_path, ray_cluster):
    # colocated on one GPU: the rank and the engine share it
    plan, one = _drive(tmp_path / "one", "one", rollout__num_rollout="3")
    where = json.loads((one.job_dir / "placement.json").read_text())
    assert where["colocate"] and where["bundles"] == {"0,0": 0}
    assert where["train"][0]["gpu_ids"] == where["rollout"][0]["gpu_ids"]
    assert where["train"][0]["pid"] != where["rollout"][0]["pid"]  # separate actors
    assert all(r["memory/engine_bytes_while_training"] == 0 for r in metrics(one.job_dir))

    # disaggregated on four: ranks 0 and 1 on GPUs 0 and 1, one engine on each of GPUs 2 and 3
    plan, two = _drive(tmp_path / "two", "two", rollout__num_rollout="3",
                       cluster__gpus_per_node="4", train__colocate="false", train__num_gpus="2")
    assert [(r["rank"], r["gpu"], r["dp"]) for r in plan["train"]["ranks"]] == [(0, 0, 0), (1, 1, 1)]
    assert [e["gpus"] for e in plan["rollout"]["engines"]] == [[{"node": 0, "gpu": 2}],
                                                              [{"node": 0, "gpu": 3}]]
    where = json.loads((two.job_dir / "placement.json").read_text())
    assert not where["colocate"] and where["bundles"] == {"0,0": 0, "0,1": 1, "0,2": 2, "0,3": 3}
    gpus = [tuple(w["gpu_ids"]) for w in where["train"] + where["rollout"]]
    assert len(set(gpus)) == 4 and all(len(g) == 1 for g in gpus)  # one GPU each, all different
    records = metrics(two.job_dir)
    assert all("memory/engine_bytes_while_training" not in r for r in records)

    for a, b in zip(metrics(one.job_dir), records, strict=True):
        for key in ("reward/mean", "response_len/mean", "train/pg_loss", "train/grad_norm"):
            assert b[key] == pytest.approx(a[key], abs=DP_TOLERANCE), (a["rollout"], key)
    first, second = _final_weights(one), _final_weights(two)
    assert max(float((first[n] - second[n]).abs().max()) for n in first) <= DP_TOLERANCE
