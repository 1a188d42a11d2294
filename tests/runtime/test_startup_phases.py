"""The driver's start-up phase by phase (runtime/core/startup.py), on a real Ray with logical
GPUs: one log line per phase, and the phases in the first metrics record adding up to
startup/total_s."""

from __future__ import annotations

import re

import pytest
from runtimekit import job_config, metrics

from runtime.node import driver

ONE_ROLLOUT = {"rollout__num_rollout": "1", "eval__datasets": "[]"}
APART = {"cluster__gpus_per_node": "2", "train__colocate": "false", "train__num_gpus": "1"}
LINE = re.compile(r"^vime: start-up: (\w+) [0-9.]+ s$", re.M)


@pytest.mark.slow
@pytest.mark.parametrize("keys, built", [
    ({}, ["actor_build", "engine_start"]),
    (APART, ["actor_build_and_engine_start"])], ids=["colocated", "disaggregated"])
def test_start_up_phases_are_logged_and_add_up_to_the_total(tmp_path, ray_cluster, capsys,
                                                             keys, built):
    plan, resolved, config = job_config(tmp_path, "startup", **ONE_ROLLOUT, **keys)
    driver.run(plan, resolved, config.job_dir, False)
    logged = LINE.findall(capsys.readouterr().out)
    assert logged == ["prepare", "ray", "actors", *built, "loop_and_restore", "first_push"]
    first = metrics(config.job_dir)[0]
    phases = [first[f"startup/{phase}_s"] for phase in logged]
    assert all(seconds >= 0 for seconds in phases)
    assert sum(phases) == pytest.approx(first["startup/total_s"], rel=1e-9)
    assert first["startup/slowest_rank_init_s"] > 0
    assert first["startup/slowest_engine_start_s"] > 0
