"""slime's TIS flags in `vime import`: --use-tis is slime's vanilla token-level truncation, as
vime's algorithm.tis; the levels, modes and bounds of slime's MIS example (--tis-level,
--tis-mode, --tis-lower-bound, --tis-upper-bound, examples/train_infer_mismatch_helper) become
algorithm.tis_level, tis_mode, tis_clip_low and tis_clip; its rejection sampling and batch
normalisation are warnings, and a custom TIS function other than the MIS example's is an
error."""

from __future__ import annotations

import pytest

from vime.importer import import_argv

BASE = ["--use-tis", "--tis-clip", "2.0", "--tis-clip-low", "0"]
MIS = "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"


def _findings(*flags: str, base=BASE):
    result = import_argv([*base, *flags])
    return result, [f for f in result.findings if f.code in ("V963", "V964", "V965", "V966")]


def test_use_tis_is_token_level_truncation_with_slimes_bounds():
    result, findings = _findings()
    assert result.values["algorithm.tis"] is True
    assert (result.values["algorithm.tis_clip"], result.values["algorithm.tis_clip_low"]) == \
        (2.0, 0.0)
    assert "algorithm.tis_level" not in result.values  # vime's default, the token level
    assert findings == []


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_each_tis_level_is_vimes_key(level):
    result, findings = _findings("--tis-level", level)
    assert result.values["algorithm.tis_level"] == level
    assert findings == []


@pytest.mark.parametrize("mode, expected", [("truncate", "truncate"), ("clip", "truncate"),
                                            ("mask", "mask")])
def test_tis_modes_map_to_truncate_or_mask(mode, expected):
    result, findings = _findings("--tis-mode", mode)
    assert result.values["algorithm.tis_mode"] == expected
    assert findings == []


def test_a_mode_slime_lacks_is_refused_with_the_ones_it_has():
    _, [finding] = _findings("--tis-mode", "clamp")
    assert finding.code == "V963" and finding.severity == "error"
    assert "mask" in finding.message and "truncate" in finding.message


def test_the_mis_examples_bounds_are_vimes_clip_keys():
    result, findings = _findings("--tis-lower-bound", "0.5", "--tis-upper-bound", "1.5",
                                 base=["--use-tis"])
    assert (result.values["algorithm.tis_clip_low"], result.values["algorithm.tis_clip"]) == \
        (0.5, 1.5)
    assert findings == []


def test_the_mis_example_as_a_script_writes_it_imports_without_an_error():
    result, findings = _findings(
        "--custom-tis-function-path", MIS, "--tis-level", "geometric", "--tis-mode", "mask",
        "--tis-lower-bound", "0.999", "--tis-upper-bound", "1.001", base=["--use-tis"])
    values = result.values
    assert (values["algorithm.tis_level"], values["algorithm.tis_mode"]) == ("geometric", "mask")
    assert (values["algorithm.tis_clip_low"], values["algorithm.tis_clip"]) == (0.999, 1.001)
    [note] = findings
    assert note.code == "V965" and note.severity == "note"
    assert "algorithm.tis_level" in note.message


def test_rejection_sampling_is_a_warning_and_another_tis_function_an_error():
    _, [finding] = _findings("--use-rs")
    assert finding.code == "V963" and finding.severity == "warning"
    _, [finding] = _findings("--custom-tis-function-path", "my_project.weights.compute")
    assert finding.code == "V963" and finding.severity == "error"
    assert "tis_mode" in finding.help
