"""rollout.reward at compile time (V906, V907) and the one list of built-in names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from specsupport import ROOT, run_spec

from runtime.rl import rewards as runtime_rewards
from vime.rewards import BUILTIN_REWARDS

SPEC = ROOT / "specs" / "qwen3_30b.toml"


def test_the_compilers_builtin_names_are_the_runtimes():
    assert sorted(BUILTIN_REWARDS) == sorted(runtime_rewards.BUILTIN)


def _reward(value: str, *sets: str):
    result = run_spec(SPEC, [f"rollout.reward={value!r}".replace("'", '"'), *sets])
    return [d for d in result.diagnostics if d.code in ("V906", "V907")]


@pytest.mark.parametrize("name", sorted(BUILTIN_REWARDS))
def test_builtin_names_are_clean(name):
    assert _reward(name) == []


def test_a_misspelt_builtin_gets_the_closest_name():
    (diag,) = _reward("deepscalr")
    assert diag.code == "V906" and diag.severity == "error"
    assert 'rollout.reward = "deepscaler"' in diag.help and diag.location.line >= 1


def test_a_dotted_path_without_colon_is_told_the_colon_form():
    (diag,) = _reward("my_rewards.score")
    assert diag.code == "V906" and '"my_rewards:score"' in diag.help


def test_a_module_not_found_here_is_a_warning_and_the_plan_is_made():
    result = run_spec(SPEC, ['rollout.reward="no_such_vime_pkg.sub:score"'])
    (diag,) = [d for d in result.diagnostics if d.code == "V907"]
    assert diag.severity == "warning" and "no_such_vime_pkg" in diag.message
    assert result.ok and result.plan is not None


def test_the_module_is_found_without_running_it(tmp_path, monkeypatch):
    package = tmp_path / "myrewards"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported at plan time')\n")
    (package / "scores.py").write_text(
        "import torch\ntry:\n    def exact(**kw):\n        return 1.0\nexcept Exception:\n"
        "    pass\nfuzzy = exact\n")
    (package / "star.py").write_text("from elsewhere import *\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _reward("myrewards.scores:exact") == []
    assert _reward("myrewards.scores:fuzzy") == []
    assert _reward("myrewards.star:anything") == []  # `import *`: cannot tell, no warning
    (diag,) = _reward("myrewards.scores:exactt")
    assert diag.code == "V907" and "defines no 'exactt'" in diag.message
    (diag,) = _reward("myrewards.nothere:exact")
    assert "no module 'myrewards.nothere'" in diag.message
    assert "myrewards" not in sys.modules


def test_pythonpath_of_cluster_env_is_searched(tmp_path):
    (tmp_path / "cluster_only.py").write_text("def score(**kw):\n    return 0.0\n")
    assert _reward("cluster_only:score", f'cluster.env.PYTHONPATH="{tmp_path}"') == []
    assert [d.code for d in _reward("cluster_only:score")] == ["V907"]


def test_the_repositorys_own_reward_module_is_found_by_the_installed_vime(tmp_path):
    # `vime` as installed (editable here, as `make` installs it) from another folder: its
    # packages come through the editable finder, not a path entry; the toy specs' reward
    # (runtime.toy:reward) drew a false V907 from every demo spec before
    import subprocess

    vime = Path(sys.executable).with_name("vime")
    for name in ("tiny_cpu.toml", "tiny_h200.toml"):
        done = subprocess.run([str(vime), "plan", str(ROOT / "specs" / name)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert "V907" not in done.stdout + done.stderr, done.stdout[-2000:]


def _spec_beside(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "spec.toml"
    spec.write_text(SPEC.read_text())
    return spec


def _v907(spec: Path, reward: str, *sets: str):
    result = run_spec(spec, [f'rollout.reward="{reward}"', *sets])
    return [d for d in result.diagnostics if d.code == "V907"]


def test_a_module_beside_the_spec_is_found_from_any_folder_as_the_driver_finds_it(
        tmp_path, monkeypatch):
    spec = _spec_beside(tmp_path / "exp")
    (tmp_path / "exp" / "beside_spec_reward.py").write_text("def score(**kw):\n    return 1.0\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert _v907(spec, "beside_spec_reward:score") == []
    # and the driver imports it from there, whatever folder the job runs in
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "beside_spec_reward", raising=False)
    loaded = runtime_rewards.load("beside_spec_reward:score", str(tmp_path / "exp"))
    assert loaded(prompt="", response="", label="") == 1.0


def test_a_module_only_in_the_folder_vime_runs_in_is_warned_about(tmp_path, monkeypatch):
    # a job on Slurm runs in its experiment folder: the folder of `vime submit` is not searched
    spec = _spec_beside(tmp_path / "exp")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "cwd_only_reward.py").write_text("def score(**kw):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.syspath_prepend("")  # `python -m vime` puts the working folder first
    [diag] = _v907(spec, "cwd_only_reward:score")
    assert diag.message == ("rollout.reward = 'cwd_only_reward:score': no module "
                            "'cwd_only_reward' in the Python path, looked for as the driver "
                            "will: in the spec's folder, the job's PYTHONPATH and the installed "
                            "packages")
    assert diag.help.startswith(
        f"put cwd_only_reward beside the spec ({tmp_path / 'exp' / 'cwd_only_reward.py'})")


def test_the_jobs_pythonpath_is_cluster_envs_over_the_shells(monkeypatch):
    from vime.check.rewards import job_pythonpath

    shell = {"PYTHONPATH": "/site/a:relative/b"}
    assert job_pythonpath({}, shell) == ["/site/a"]
    assert job_pythonpath({"PYTHONPATH": "/opt/r"}, shell) == ["/opt/r"]
    assert job_pythonpath({"PYTHONPATH": "/opt/r:$PYTHONPATH"}, shell) == ["/opt/r", "/site/a"]
    assert job_pythonpath({"PYTHONPATH": "${PYTHONPATH}:/opt/r"}, {}) == ["/opt/r"]
