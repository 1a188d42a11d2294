"""The job's local twins against a real Ray with logical GPUs: `--local` (one process per node
on this machine) and `--ray-address` (a Ray cluster started by hand)."""

from __future__ import annotations

import json
import time

import pytest
from launchkit import DRIVERS, SMOKE, marked_processes, spec_sets, vime

from runtime.node.ray_bootstrap import RayNode, temp_dir
from vime.launch import ports


def _folder_of(done, experiment_dir):
    folders = list(experiment_dir.glob("*-*"))
    assert len(folders) == 1, (done.stdout, done.stderr, folders)
    return folders[0]


@pytest.mark.slow
def test_local_two_nodes_boot_ray_and_run_the_driver(tmp_path):
    done = vime("submit", str(SMOKE), "--local", *spec_sets(tmp_path, **{
        "cluster.env": '{VIME_TEST_ENV = "a;b"}'}), env={"VIME_DRIVER": f"{DRIVERS}:check"})
    folder = _folder_of(done, tmp_path / "qwen3-30b-a3b-smoke")
    assert done.returncode == 0, (folder / "logs" / "node-0.log").read_text()
    seen = json.loads((folder / "driver.json").read_text())
    assert (seen["nodes"], seen["gpus"], seen["bundles_per_node"]) == (2, 8.0, [4, 4])
    assert seen["probe_nodes"] == 2 and seen["env"]["VIME_TEST_ENV"] == "a;b"
    assert seen["env"]["RAY_ADDRESS"] == (folder / "ray_address").read_text().strip()
    for name in ("resolved.toml", "plan.json", "megatron.args", "vllm.args", "job.sbatch",
                 "job.json", "launch.json"):
        assert (folder / name).is_file(), name
    status = vime("status", str(folder))
    assert status.returncode == 0 and "COMPLETED" in status.stdout
    assert "ready      all 8 GPUs" in status.stdout
    logs = vime("logs", str(folder), "--node", "1")
    assert logs.returncode == 0
    assert not marked_processes(f"VIME_RAY_NODE=/tmp/vime-{folder.name}-".encode())


def test_a_failing_driver_fails_the_job_and_says_why(tmp_path):
    done = vime("submit", str(SMOKE), "--local",
                *spec_sets(tmp_path, nodes=1, gpus_per_node=2),
                env={"VIME_DRIVER": f"{DRIVERS}:fail"})
    assert done.returncode == 4, done.stdout + done.stderr
    assert "the test driver fails on purpose" in done.stdout


def test_an_actor_error_reaches_the_terminal_as_one_clean_line(tmp_path):
    # not `RayTaskError(RuntimeError): [36mray::TrainWorker.load()[39m` and 25 lines
    done = vime("submit", str(SMOKE), "--local",
                *spec_sets(tmp_path, nodes=1, gpus_per_node=2),
                env={"VIME_DRIVER": f"{DRIVERS}:actor_fails"})
    assert done.returncode == 4, done.stdout + done.stderr
    assert "\x1b[" not in done.stdout + done.stderr
    [folder] = (tmp_path / "qwen3-30b-a3b-smoke").glob("local-*")
    [failed] = [line for line in done.stdout.splitlines() if " failed" in line]
    assert failed == (f"job {folder.name} failed: TrainWorker.load failed on training rank 0 on "
                      "testhost: ValueError: size mismatch for model.embed: [4, 64] vs [8, 64] "
                      f"(full traceback in {folder / 'logs' / 'node-0.log'})"), done.stdout
    assert "Traceback" in (folder / "logs" / "node-0.log").read_text()


@pytest.mark.parametrize("auth_mode", [None, "token"])
def test_a_ray_auth_token_in_home_does_not_break_local(tmp_path, monkeypatch, auth_mode):
    # Ray 2.60's plain ray.init() leaves ~/.ray/auth_token; `ray start --head` then turned
    # token auth on and the workers and the driver were refused with InvalidAuthToken.
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0123456789abcdef0123456789abcdef")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    env = {"HOME": str(home), "VIME_DRIVER": f"{DRIVERS}:check"}
    if auth_mode:  # the user's own choice stands: token auth across both nodes
        env["RAY_AUTH_MODE"] = auth_mode
    done = vime("submit", str(SMOKE), "--local", *spec_sets(tmp_path / "runs"), env=env)
    folder = _folder_of(done, tmp_path / "runs" / "qwen3-30b-a3b-smoke")
    assert done.returncode == 0, (folder / "logs" / "node-0.log").read_text()
    seen = json.loads((folder / "driver.json").read_text())
    assert seen["probe_nodes"] == 2
    assert seen["env"]["RAY_AUTH_MODE"] == (auth_mode or "disabled")


@pytest.fixture
def ray_cluster_by_hand(tmp_path):
    """A one-node Ray cluster with 8 logical GPUs, as someone would start it by hand."""
    plan = ports.plan("byhand", 0, 0, False)
    node = RayNode(temp_dir("byhand", 0, 0), tmp_path / "ray.log")
    node.start(RayNode.command(head=True, address="", node_ip="127.0.0.1", plan=plan,
                               ports=plan.node(0), node=0, gpus=8, cpus=2, temp=node.temp_dir,
                               dashboard_host="127.0.0.1"))
    yield f"127.0.0.1:{plan.gcs_port}"
    node.stop()


def test_ray_address_runs_the_driver_after_checking_the_gpus(tmp_path, ray_cluster_by_hand):
    time.sleep(1)
    runs = tmp_path / "runs"
    too_big = vime("submit", str(SMOKE), "--ray-address", ray_cluster_by_hand,
                   *spec_sets(runs), env={"VIME_DRIVER": f"{DRIVERS}:check"})
    assert too_big.returncode == 4
    assert "the plan needs 2 node(s) with 4 GPUs each" in too_big.stdout
    fits = vime("submit", str(SMOKE), "--ray-address", ray_cluster_by_hand,
                *spec_sets(runs, nodes=1, gpus_per_node=8),
                env={"VIME_DRIVER": f"{DRIVERS}:check"})
    assert fits.returncode == 0, fits.stdout + fits.stderr
    folder = next(p for p in (runs / "qwen3-30b-a3b-smoke").iterdir()
                  if (p / "driver.json").exists())
    seen = json.loads((folder / "driver.json").read_text())
    assert (seen["nodes"], seen["gpus"], seen["bundles_per_node"]) == (1, 8.0, [8])


def test_ray_address_joins_a_cluster_started_by_hand_with_token_auth(tmp_path, monkeypatch):
    # Ray 2.60: a ~/.ray/auth_token (any plain ray.init() writes one) turns token auth on for a
    # `ray start --head` by hand; the driver vime attached was refused ("InvalidAuthToken",
    # reported as "Failed to connect to Ray cluster") because ray.init(address=...) sends the
    # token only with RAY_AUTH_MODE=token
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0123456789abcdef0123456789abcdef")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    plan = ports.plan("byhand-token", 0, 0, False)
    node = RayNode(temp_dir("byhand-token", 0, 0), tmp_path / "ray.log")
    node.start(RayNode.command(head=True, address="", node_ip="127.0.0.1", plan=plan,
                               ports=plan.node(0), node=0, gpus=8, cpus=2, temp=node.temp_dir,
                               dashboard_host="127.0.0.1"))
    try:
        time.sleep(1)
        runs = tmp_path / "runs"
        done = vime("submit", str(SMOKE), "--ray-address", f"127.0.0.1:{plan.gcs_port}",
                    *spec_sets(runs, nodes=1, gpus_per_node=8),
                    env={"HOME": str(home), "VIME_DRIVER": f"{DRIVERS}:check"})
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        node.stop()
