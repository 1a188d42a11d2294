"""V705 / V706: the torch_dist checkpoint's vime_layout.json against the run's layout."""

from __future__ import annotations

import json
import shlex

import pytest
from specsupport import ROOT, run_spec

from vime.resolve import LAYOUT_FILE

SPEC = ROOT / "specs" / "qwen3_30b.toml"  # megatron, tp 4, pp 1, ep 8, etp 1


def _diagnostics(folder, *sets):
    result = run_spec(SPEC, [f"model.torch_dist_checkpoint={json.dumps(str(folder))}", *sets])
    return [d for d in result.diagnostics if d.code in ("V705", "V706")]


def test_the_layout_file_is_the_one_vime_convert_writes():
    convert = pytest.importorskip("runtime.megatron.convert")
    assert convert.LAYOUT_FILE == LAYOUT_FILE


def test_a_mismatch_names_both_layouts_points_at_the_keys_and_gives_the_command(tmp_path):
    (tmp_path / LAYOUT_FILE).write_text(json.dumps(
        {"tp": 1, "pp": 1, "ep": 1, "etp": 1, "format": "torch_dist"}))
    (diag,) = _diagnostics(tmp_path, "rollout.num_rollout=2")
    assert (diag.code, diag.severity) == ("V705", "warning")
    assert diag.message.startswith("the checkpoint was saved with tp=1 ep=1; this run uses "
                                   "tp=4 ep=8: megatron-core reshards on load")
    assert [(".".join(path), loc.line) for path, loc in diag.related] == [
        ("train.parallel.tp", 53), ("train.parallel.ep", 57)]
    command, _, then = diag.help.partition(", then ")
    target = f"{tmp_path}_tp4_pp1_ep8_etp1"
    assert shlex.split(command) == [
        "vime", "convert", f"specs/{SPEC.name}",
        "--set", f"model.torch_dist_checkpoint={json.dumps(str(tmp_path))}",
        "--set", "rollout.num_rollout=2", "--to", "torch_dist", "-o", target]
    assert then == f"model.torch_dist_checkpoint = {json.dumps(target)}"


def test_a_relative_checkpoint_is_read_from_the_spec_folder(tmp_path):
    spec_dir = tmp_path / "specs"
    (spec_dir / "ckpt").mkdir(parents=True)
    (spec_dir / "ckpt" / LAYOUT_FILE).write_text('{"tp": 4, "pp": 1, "ep": 4, "etp": 1}')
    spec = spec_dir / "run.toml"
    spec.write_text(SPEC.read_text().replace('"/root/Qwen3-30B-A3B_torch_dist"', '"ckpt"'))
    result = run_spec(spec)
    (diag,) = [d for d in result.diagnostics if d.code == "V705"]
    assert "saved with ep=4; this run uses ep=8" in diag.message
    assert f"-o {spec_dir / 'ckpt'}_tp4_pp1_ep8_etp1," in diag.help


@pytest.mark.parametrize("text, problem", [
    ("{not json", "cannot be read"),
    ('{"tp": 4, "pp": 1, "ep": 8}', "does not give the positive integers tp, pp, ep, etp"),
    ('{"tp": true, "pp": 1, "ep": 8, "etp": 1}', "does not give"),
    ('[4, 1, 8, 1]', "does not give"),
])
def test_an_unusable_layout_file_is_an_unknown_layout(tmp_path, text, problem):
    (tmp_path / LAYOUT_FILE).write_text(text)
    (diag,) = _diagnostics(tmp_path)
    assert (diag.code, diag.severity) == ("V706", "warning")
    assert problem in diag.message
    assert f"into {tmp_path}/{LAYOUT_FILE}" in diag.help


def test_a_layout_file_that_is_a_folder_is_an_unknown_layout(tmp_path):
    (tmp_path / LAYOUT_FILE).mkdir()
    (diag,) = _diagnostics(tmp_path)
    assert diag.code == "V706" and "cannot be read" in diag.message


def test_only_the_megatron_backend_loads_the_torch_dist_checkpoint(tmp_path):
    (tmp_path / LAYOUT_FILE).write_text('{"tp": 1, "pp": 1, "ep": 1, "etp": 1}')
    tiny = ROOT / "specs" / "tiny_cpu.toml"
    result = run_spec(tiny, [f"model.torch_dist_checkpoint={json.dumps(str(tmp_path))}"])
    assert not {"V705", "V706"} & {d.code for d in result.diagnostics}


def test_a_matching_layout_and_a_checkpoint_elsewhere_say_nothing(tmp_path):
    (tmp_path / LAYOUT_FILE).write_text('{"tp": 4, "pp": 1, "ep": 8, "etp": 1}')
    assert _diagnostics(tmp_path) == []
    assert _diagnostics(tmp_path / "absent") == []
