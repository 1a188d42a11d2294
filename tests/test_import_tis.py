"""slime's TIS flags in `vime import`: --use-tis is slime's vanilla token-level truncation, as
vime's algorithm.tis; the levels and modes of slime's MIS example (--tis-level, --tis-mode,
examples/train_infer_mismatch_helper) are named, and a level vime lacks is a warning that says
the spec trains with token-level weights."""

from __future__ import annotations

from vime.importer import import_argv

BASE = ["--use-tis", "--tis-clip", "2.0", "--tis-clip-low", "0"]


def _findings(*flags: str):
    result = import_argv([*BASE, *flags])
    return result, [f for f in result.findings if f.code in ("V963", "V965", "V966")]


def test_use_tis_is_token_level_truncation_with_slimes_bounds():
    result, findings = _findings()
    assert result.values["algorithm.tis"] is True
    assert (result.values["algorithm.tis_clip"], result.values["algorithm.tis_clip_low"]) == \
        (2.0, 0.0)
    assert findings == []


def test_tis_level_token_is_what_vime_does():
    _, [finding] = _findings("--tis-level", "token")
    assert finding.code == "V965" and finding.severity == "note"
    assert "token level" in finding.message


def test_a_level_vime_lacks_is_a_warning_naming_the_level_it_trains_with():
    for level in ("sequence", "geometric"):
        result, [finding] = _findings("--tis-level", level)
        assert finding.code == "V963" and finding.severity == "warning", finding
        assert finding.message.startswith(f"--tis-level {level}: vime uses --tis-level token")
        assert "token level" in finding.help or "token level" in finding.message
        assert result.values["algorithm.tis"] is True
        # a warning: no error but the keys an argv this short leaves out (V972)
        assert [f.code for f in result.findings if f.severity == "error"] == ["V972"] * 6


def test_tis_mode_and_the_mis_examples_bounds_are_named():
    _, [finding] = _findings("--tis-mode", "truncate")
    assert finding.code == "V965"
    _, [finding] = _findings("--tis-mode", "mask")
    assert finding.code == "V963" and finding.severity == "warning"
    _, [finding] = _findings("--tis-upper-bound", "2.0")
    assert finding.code == "V963" and "algorithm.tis_clip" in finding.help
    _, [finding] = _findings("--custom-tis-function-path",
                             "examples.train_infer_mismatch_helper.mis.compute_mis_weights")
    assert finding.code == "V963" and finding.severity == "error"
    assert "token" in finding.help
