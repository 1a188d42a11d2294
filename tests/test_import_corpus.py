"""`vime import` on a corpus of real upstream launch scripts (tests/fixtures/scripts/README.md
names each one's repository, path and commit): each imports and plans to the layout written in
tests/fixtures/scripts/expected/<name>.toml, which was read from the script, not from vime;
a script that does not names, in the import report, the one capability vime lacks.

The corpus is imported as a user would: `vime import SCRIPT --env ...` with the variables the
script needs, and the files it sources found in the checkout it sits in."""

from __future__ import annotations

import functools
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from specsupport import ROOT

from vime import pipeline
from vime.cli import main
from vime.emit import plan_json
from vime.importer import ImportResult, import_argv, import_script
from vime.importer.cli import report_text
from vime.importer.toml_out import render
from vime.parse import Source

SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"
CORPUS = SCRIPTS / "corpus"
EXPECTED = {path.stem: path for path in sorted((SCRIPTS / "expected").glob("*.toml"))}

# Kimi-K2's config.json is a DeepseekV3ForCausalLM with model_type kimi_k2: the model args of
# the two are one family, and either model_type is the script's model
SAME_FAMILY = {"kimi_k2": {"kimi_k2", "deepseek_v3"}}

# ---------------------------------------------------------------------------------------------
# SCRIPTS EXPECTED NOT TO PLAN TO THEIR LAYOUT YET, and the capability vime lacks for each.
# name -> (text the import report, or with "plan:" the plan's diagnostics, must contain; why).
# Remove a line when its script plans to its layout (the test says so).
# ---------------------------------------------------------------------------------------------
EXPECTED_GAPS: dict[str, tuple[str, str]] = {
    # the script's own layout does not fit its GPUs: EP 8 × PP 2 (× ETP 1) is 16 ranks on 8
    # (megatron-core's parallel_state: "world_size (8) is not divisible by
    # expert_tensor_model_pipeline_parallel size (16)")
    "slime-glm4.7-30b-a3b": ("plan:V202", "EP 8 × PP 2 on 8 GPUs, refused by megatron-core"),
    # what the script does that vime cannot
    "slime-qwen3-8b-opd": ("--use-opd", "on-policy distillation from a teacher server"),
    # upstream's script drops its flags: no '\\' after --update-weight-buffer-size (line 172)
    "slime-kimi-k2-instruct": ("a '\\' missing", "the train.py command ends on line 172"),
}


@dataclass(frozen=True)
class Outcome:
    name: str
    expected: dict
    imported: ImportResult
    report: str  # the import report, as `vime import` prints it
    result: pipeline.Result
    plan: dict | None  # `vime plan --json`'s object; None when nothing was planned
    got: dict  # the expected file's fields as vime planned them
    mismatches: tuple[str, ...]

    @property
    def plans_to_layout(self) -> bool:
        return self.plan is not None and not self.mismatches

    @property
    def plan_errors(self) -> list[str]:
        return [f"{d.code} {d.message}" for d in self.result.diagnostics
                if d.severity == "error"]


def _layout(result: pipeline.Result, plan: dict) -> dict:
    spec = result.spec
    train, rollout, engine = plan["train"], plan["rollout"], plan["rollout"]["engines"][0]
    parallel = spec.train.parallel
    actor = {"gpus": train["num_gpus"], "colocate": plan["colocate"], "tp": train["tp"],
             "pp": train["pp"], "cp": train["cp"], "ep": train["ep"], "etp": train["etp"],
             "first_stage_layers": getattr(parallel, "first_stage_layers", None),
             "last_stage_layers": getattr(parallel, "last_stage_layers", None)}
    evaluates = bool(spec.eval.datasets) and (spec.eval.interval is not None or
                                              spec.eval.at_start or spec.eval.at_end)
    return {
        "family": plan["model"]["model_type"],
        "cluster": {"nodes": plan["cluster"]["nodes"],
                    "gpus_per_node": plan["cluster"]["gpus_per_node"]},
        "actor": actor,
        "rollout": {"gpus": rollout["num_gpus"], "gpus_per_engine": rollout["gpus_per_engine"],
                    "engines": rollout["num_engines"], "engine_tp": engine["tp"],
                    "engine_dp": engine["dp"], "engine_ep": engine["ep"]},
        "batch": {"rollout_batch_size": plan["batch"]["rollout_batch_size"],
                  "n_samples_per_prompt": plan["batch"]["n_samples_per_prompt"],
                  "global_batch_size": plan["batch"]["global_batch_size"],
                  "max_response_len": spec.rollout.max_response_len},
        "algorithm": {"advantage_estimator": spec.algorithm.advantage_estimator},
        "eval": {"present": evaluates},
    }


def _mismatches(expected: dict, got: dict) -> tuple[str, ...]:
    found = []
    family = expected["family"]
    if got["family"] not in SAME_FAMILY.get(family, {family}):
        found.append(f"family: the script's {family}, planned {got['family']}")
    for table in ("cluster", "actor", "rollout", "batch", "algorithm", "eval"):
        for key, planned in got[table].items():
            want = expected[table].get(key)
            if planned != want:
                found.append(f"{table}.{key}: the script's {want}, planned {planned}")
    return tuple(found)


@functools.cache
def outcome(name: str) -> Outcome:
    """Import the script of expected/<name>.toml, plan the written spec, compare."""
    with EXPECTED[name].open("rb") as handle:
        expected = tomllib.load(handle)
    path = SCRIPTS / expected["script"]
    imported = import_script(path, path.read_text(), dict(expected["env"]))
    text = render(imported, str(SCRIPTS))
    result = pipeline.run(Source(f"{name}.toml", text), [], SCRIPTS)
    planned = result.plan or result.sketch
    plan = None
    got: dict = {}
    mismatches: tuple[str, ...] = ("nothing planned",)
    if planned is not None and result.spec is not None:
        plan = plan_json.plan_object(f"{name}.toml", result.diagnostics, result.spec, planned)
        got = _layout(result, plan)
        mismatches = _mismatches(expected, got)
    return Outcome(name, expected, imported, report_text(imported), result, plan, got,
                   mismatches)


def _shown(found: Outcome) -> str:
    errors = [line for line in found.report.splitlines() if "error[" in line]
    return "\n".join(["layout:", *found.mismatches, "import errors:", *errors,
                      "plan errors:", *found.plan_errors])


def test_the_corpus_has_twenty_real_scripts_and_an_expectation_for_each():
    assert len(EXPECTED) >= 20
    assert set(EXPECTED_GAPS) <= set(EXPECTED)
    readme = (SCRIPTS / "README.md").read_text()
    for name, path in EXPECTED.items():
        script = tomllib.loads(path.read_text())["script"]
        assert (SCRIPTS / script).is_file(), name
        assert script.removeprefix("corpus/") in readme or script in readme, \
            f"{script}: the README names no repository, path and commit for it"


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - set(EXPECTED_GAPS)))
def test_the_script_plans_to_the_layout_it_asks_for(name):
    found = outcome(name)
    assert found.plans_to_layout, _shown(found)


@pytest.mark.parametrize("name", sorted(EXPECTED_GAPS))
def test_a_script_that_does_not_plan_names_the_capability_vime_lacks(name):
    found = outcome(name)
    named, why = EXPECTED_GAPS[name]
    assert not found.plans_to_layout, f"{name} plans to its layout now: remove it from " \
        "EXPECTED_GAPS"
    in_plan = named.startswith("plan:")
    said = "\n".join(found.plan_errors) if in_plan else found.report
    text = named.removeprefix("plan:")
    assert text in said, f"{name} ({why}): {text!r} is not said\n{_shown(found)}"
    # never a silent wrong plan: a script that planned, to another layout, has an error said
    assert found.plan is None or not found.imported.complete, _shown(found)


def test_the_share_of_the_corpus_that_plans_to_its_layout(record_property, capsys):
    planned = [name for name in EXPECTED if outcome(name).plans_to_layout]
    share = len(planned) / len(EXPECTED)
    record_property("corpus_plans_to_layout", f"{len(planned)}/{len(EXPECTED)}")
    with capsys.disabled():
        print(f"\nvime import corpus: {len(planned)} of {len(EXPECTED)} scripts plan to their "
              f"layout ({share:.0%}); the issue's bar is 90%")
    assert len(planned) == len(EXPECTED) - len(EXPECTED_GAPS)


# -- what the corpus taught the reader, each on the real script's lines

def _values(result: ImportResult, flag: str) -> list:
    return [f for f in result.findings if f.message.startswith(flag)]


def test_an_absolute_source_into_the_users_checkout_is_read_from_repo_root(tmp_path, capsys):
    """`source "/root/slime/scripts/models/qwen3-4B.sh"` (slime's examples/retool): the same
    path's tail under --repo-root, said as a note; without it, and with no checkout above the
    script, V974."""
    script = tmp_path / "retool_qwen3_4b_rl.sh"
    shutil.copy(CORPUS / "slime" / "examples" / "retool" / "retool_qwen3_4b_rl.sh", script)
    alone = import_script(script, script.read_text(), {})
    [missing] = [f for f in alone.findings if f.code == "V974"]
    assert missing.severity == "error" and "--repo-root" in missing.help
    assert "model.preset" not in alone.values
    checkout = CORPUS / "slime"
    found = import_script(script, script.read_text(), {}, checkout)
    assert found.values["model.preset"] == "qwen3-4b"
    assert found.sourced == [str(checkout / "scripts" / "models" / "qwen3-4B.sh")]
    [note] = [f for f in found.findings if f.code == "V974"]
    assert note.severity == "note" and str(checkout) in note.message
    # the verb: --repo-root DIR, and a folder that is not there is a usage error
    out = tmp_path / "spec.toml"
    assert main(["import", str(script), "--repo-root", str(checkout), "-o", str(out)]) == 1
    assert 'preset = "qwen3-4b"' in out.read_text()
    assert main(["import", str(script), "--repo-root", str(tmp_path / "none")]) == 2
    assert "--repo-root" in capsys.readouterr().err


def test_without_repo_root_the_checkout_is_the_folders_above_the_script():
    """slime's scripts/low_precision/run-qwen3-4b-fp8.sh sources
    `${SCRIPT_DIR}/../scripts/models/qwen3-4B.sh`, which is not there: the checkout's
    scripts/models/qwen3-4B.sh is; examples/multi_agent's `/root/slime/...` likewise."""
    for script in ("scripts/low_precision/run-qwen3-4b-fp8.sh",
                   "examples/multi_agent/run-qwen3-30B-A3B-multi-agent.sh"):
        path = CORPUS / "slime" / script
        result = import_script(path, path.read_text(), {})
        assert [Path(s).relative_to(CORPUS / "slime").parts[:2] for s in result.sourced] == \
            [("scripts", "models")], script
        assert not [f for f in result.findings if f.code == "V974" and f.severity == "error"]


def test_a_family_vime_does_not_build_is_named_from_its_models_file(tmp_path):
    """The MODEL_ARGS of upstream's models files (the README names them), sourced by a script
    as upstream's run scripts do: V975 names the family, and no Qwen3 is written for it."""
    result = _import_models_file("vime/scripts/models/llama3.1-8B-Instruct.sh", tmp_path)
    [family] = [f for f in result.findings if f.code == "V975" and f.severity == "error"]
    assert family.message.startswith("the model args show a Llama"), family.message
    # the flags that show the family are said once, by V975: each is a note pointing at it
    shows = family.message.split(": ", 1)[1].split("; vime builds")[0].split(", ")
    for text in shows:
        flag = text.split()[0]
        assert not [f for f in result.findings if f.severity == "error" and f.code != "V975"
                    and f.message.startswith(flag + ":")], flag
    assert not [key for key in result.values if key.startswith("model.arch")
                or key == "model.preset"]


def _import_models_file(models: str, tmp_path: Path) -> ImportResult:
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(CORPUS / models, folder / Path(models).name)
    script = tmp_path / "run.sh"
    script.write_text(f'SCRIPT_DIR="$(cd -- "$(dirname -- "${{BASH_SOURCE[0]}}")" && pwd)"\n'
                      f'source "${{SCRIPT_DIR}}/models/{Path(models).name}"\n'
                      'python3 train.py --actor-num-nodes 1 ${MODEL_ARGS[@]}\n')
    return import_script(script, script.read_text(), {})


@pytest.mark.parametrize("models, preset, model_type, shows", [
    ("vime/scripts/models/gpt-oss-20B.sh", "gpt-oss-20b", "gpt_oss", "--softmax-type"),
    ("slime/scripts/models/qwen3-next-80B-A3B.sh", "qwen3-next-80b-a3b", "qwen3_next",
     "--use-gated-attention"),
    ("slime/scripts/models/glm4-9B.sh", "glm-4-9b-0414", "glm4", "--post-mlp-layernorm"),
    ("slime/scripts/models/qwen2.5-3B.sh", "qwen2.5-3b", "qwen2", "--add-qkv-bias"),
    ("slime/scripts/models/qwen2.5-0.5B.sh", "qwen2.5-0.5b", "qwen2", "--add-qkv-bias"),
    ("slime/scripts/models/glm4.7-30B-A3B.sh", "glm-4.7-flash", "glm4_moe_lite",
     "--add-qkv-bias"),
])
def test_a_family_the_planner_reads_is_written_as_its_preset(models, preset, model_type, shows,
                                                            tmp_path):
    """A models file of a family vime plans but does not run (vime/support.py's PLANNED_ONLY)
    is written as the preset its shape matches and the family's model_type, not refused
    (V975); the flags that show the family (sinks, windows, YaRN, gated attention, QKV bias)
    are notes that the preset holds them, and `vime plan` says V102."""
    result = _import_models_file(models, tmp_path)
    assert not [f for f in result.findings if f.code == "V975"]
    assert result.values["model.preset"] == preset
    from vime.resolve.model import PRESETS

    assert PRESETS[preset]["model_type"] == model_type
    assert result.values.get("model.arch.model_type", model_type) == model_type
    [note] = [f for f in result.findings if f.message.startswith(shows)]
    assert note.severity == "note" and ("held by the preset" in note.message or
                                        "its runtime does not run (V102)" in note.message)


def test_qwen3_models_files_stay_qwen3():
    for models in ("qwen3-4B.sh", "qwen3-8B.sh", "qwen3-32B.sh", "qwen3-235B-A22B.sh"):
        words = shlex_words(CORPUS / "slime" / "scripts" / "models" / models)
        assert not [f for f in import_argv(words).findings if f.code == "V975"], models


def shlex_words(models: Path) -> list[str]:
    """MODEL_ARGS of a models file as train.py receives them."""
    from vime.importer.shell import read_script

    reading = read_script(models, models.read_text() + '\npython3 train.py "${MODEL_ARGS[@]}"\n',
                          {})
    return [w.value for w in reading.argv]


def test_a_run_on_one_node_that_does_not_colocate_stays_on_the_ray_head():
    """slime's run-glm4-9B.sh: `ray start --head --num-gpus 8`, an actor of 4 GPUs and 4
    rollout GPUs: one node of 8, not two of 4."""
    path = CORPUS / "slime" / "scripts" / "run-glm4-9B.sh"
    result = import_script(path, path.read_text(), {})
    assert (result.values["cluster.nodes"], result.values["cluster.gpus_per_node"],
            result.values["train.num_gpus"], result.values["inference.num_gpus"]) == (1, 8, 4, 4)
    assert result.origins["cluster.gpus_per_node"].line == 124
    # a head too small for both, or several actor nodes: nodes of --actor-num-gpus-per-node
    text = path.read_text().replace("--num-gpus 8", "--num-gpus 6")
    smaller = import_script(path, text, {})
    assert (smaller.values["cluster.nodes"], smaller.values["cluster.gpus_per_node"]) == (2, 4)


def test_an_array_on_the_line_after_the_command_ended_gets_the_missing_backslash_hint():
    """slime's run-kimi-k2-Instruct.sh ends its train.py line 172 without '\\': the next line,
    `${MODEL_ARGS[@]} \\`, runs as a command of its own (its first word a flag)."""
    path = CORPUS / "slime" / "scripts" / "run-kimi-k2-Instruct.sh"
    result = import_script(path, path.read_text(), {"BASE_DIR": "/data"})
    [hint] = [f for f in result.findings if "a '\\' missing" in f.message]
    assert (hint.line, hint.code) == (173, "V960")
    assert "${MODEL_ARGS[@]} (--disable-bias-linear ...)" in hint.message
    assert "ends on line 172" in hint.message


def test_the_loop_that_builds_moe_layer_freq_in_a_models_file_is_followed():
    """slime's scripts/models/deepseek-v3.sh (and the Qwen3-MoE, Kimi-K2 and Moonlight files):
    `for ((i=0; i<NLAYERS; i++)); do if (( i < FIRST_K_DENSE_REPLACE )); then arr+=(0) ...`
    then `printf -v MOE_LAYER_FREQ "[%s]" "$(IFS=', '; echo "${arr[*]}")"`: the three dense
    layers of DeepSeek-V3 reach [model.arch], where they were unknown."""
    words = shlex_words(CORPUS / "slime" / "scripts" / "models" / "deepseek-v3.sh")
    assert words[words.index("--moe-layer-freq") + 1] == "[" + ",".join(["0"] * 3 + ["1"] * 58) \
        + "]"
    path = CORPUS / "slime" / "scripts" / "run-deepseek-r1.sh"
    result = import_script(path, path.read_text(), {"BASE_DIR": "/data"})
    # the preset deepseek-r1 (first_k_dense_replace 3) has them: the import says they agree
    assert result.values["model.preset"] == "deepseek-r1"
    assert [f for f in result.findings if f.message.startswith(
        "--moe-layer-freq: mlp_only_layers = [0, 1, 2], as in the preset deepseek-r1")]
    assert not [f for f in result.findings if "MOE_LAYER_FREQ" in f.message or
                "for loop" in f.message]


def test_a_loop_the_reader_cannot_count_leaves_what_it_sets_unknown():
    from vime.importer.shell import Unknown, read_script

    text = ('NLAYERS=$(nproc)\narr=()\nfor ((i=0; i<NLAYERS; i++)); do arr+=(1); done\n'
            'for ((i=0; i<100000; i++)); do B=$i; done\n'
            'for ((i=0; i<3; i+=1)); do if (( i == 1 )); then break; fi; C=$i; done\n'
            'printf -v F "%5s" x\n'
            'python3 train.py --a "${arr[*]}" --b "$B" --c "$C" --f "$F"\n')
    reading = read_script(Path("/nonexistent/run.sh"), text, {})
    values = [w.value for w in reading.argv]
    assert all(isinstance(values[at], Unknown) for at in (1, 3, 5, 7)), values
    said = [n.message for n in reading.notes]
    assert any("cannot count" in m and "NLAYERS" in m for m in said), said
    assert any("more than 4096 passes" in m for m in said)
    assert any("printf -v F" in m for m in said)


def test_the_checkout_above_the_script_is_searched_only_up_to_its_git_folder(tmp_path):
    """Folders above a script in no git checkout are not searched (a models file of the same
    name elsewhere on this machine is not the script's); with .git they are."""
    models = tmp_path / "slime" / "scripts" / "models"
    models.mkdir(parents=True)
    shutil.copy(CORPUS / "slime" / "scripts" / "models" / "qwen3-4B.sh", models)
    script = tmp_path / "slime" / "examples" / "retool" / "retool_qwen3_4b_rl.sh"
    script.parent.mkdir(parents=True)
    shutil.copy(CORPUS / "slime" / "examples" / "retool" / "retool_qwen3_4b_rl.sh", script)
    outside = import_script(script, script.read_text(), {})
    assert [f.severity for f in outside.findings if f.code == "V974"] == ["error"]
    (tmp_path / "slime" / ".git").mkdir()
    inside = import_script(script, script.read_text(), {})
    assert [f.severity for f in inside.findings if f.code == "V974"] == ["note"]
    assert inside.sourced == [str(models / "qwen3-4B.sh")]
