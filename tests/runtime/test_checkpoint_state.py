"""state.json (the loop's state: next rollout, weight version, the sampler's position) is
under the checkpoint's checksums like its other files: a changed digit is a corrupt
checkpoint, handled by checkpoint.on_corrupt; one written without its checksum still loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpointkit import FakeTrain

from runtime.rl.checkpoint import STATE, CheckpointError, Checkpoints, verify
from vime.launch.resume import start_point_in


def _two_saves(folder: Path) -> tuple[Checkpoints, Path, Path]:
    checkpoints = Checkpoints(folder)
    older = checkpoints.save(9, FakeTrain(), {"next_rollout": 10, "data": {"offset": 80}})
    newest = checkpoints.save(19, FakeTrain(), {"next_rollout": 20, "data": {"offset": 160}})
    return checkpoints, older, newest


def _edit_state(folder: Path, old: str, new: str) -> None:
    text = (folder / STATE).read_text()
    assert text.count(old) == 1, text
    (folder / STATE).write_text(text.replace(old, new))


def test_one_changed_digit_of_the_data_offset_is_a_corrupt_checkpoint(tmp_path):
    checkpoints, older, newest = _two_saves(tmp_path / "ckpt")
    _edit_state(newest, '"offset": 160', '"offset": 161')
    problem = verify(newest)
    assert problem is not None and str(newest / STATE) in problem, problem
    assert verify(newest, checksums=False) == problem  # the submit's size-only check too
    start = start_point_in(tmp_path / "ckpt")  # `vime submit` says it before anything starts
    assert start.checkpoint == newest and str(newest / STATE) in start.problem
    with pytest.raises(CheckpointError, match="rollout_000019 is corrupt"):
        checkpoints.resume_point("stop")
    logged = []
    assert Checkpoints(tmp_path / "ckpt", log=logged.append).resume_point("previous") == older
    assert any(str(newest / STATE) in line for line in logged), logged


def test_a_state_json_without_its_checksum_loads_with_a_note(tmp_path):
    checkpoints, _older, newest = _two_saves(tmp_path / "ckpt")
    state = json.loads((newest / STATE).read_text())
    state.pop("state_sha256")  # as a vime before the checksum wrote it
    (newest / STATE).write_text(json.dumps(state, indent=1) + "\n")
    logged = []
    found = Checkpoints(tmp_path / "ckpt", log=logged.append).resume_point("stop")
    assert found == newest
    assert any("state.json has no checksum" in line for line in logged), logged
    assert Checkpoints.read_state(found)["data"] == {"offset": 160}
