"""checkpoint.on_corrupt = "previous": the submit names the checkpoint the job resumes from,
and the corrupt one is kept (moved aside under its own name), never replaced by the next
save of its rollout."""

from __future__ import annotations

from pathlib import Path

from checkpointkit import FakeTrain
from runtimekit import in_process_loop, job_config

from runtime.rl.checkpoint import Checkpoints, verify
from vime.launch.resume import start_point_in


def _flip(path: Path) -> bytes:
    """One byte changed, the size kept: only the checksum tells."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return bytes(data)


def test_the_submit_names_the_checkpoint_the_job_resumes_from(tmp_path):
    folder = tmp_path / "ckpt"
    checkpoints = Checkpoints(folder)
    older = checkpoints.save(9, FakeTrain("older"), {"next_rollout": 10})
    newest = checkpoints.save(19, FakeTrain("newest"), {"next_rollout": 20})
    _flip(newest / "train" / "weights.txt")
    start = start_point_in(folder, "previous")
    assert (start.checkpoint, start.next_rollout) == (older, 10)
    said = start.describe(40)
    assert f"checkpoint {newest} is corrupt" in said and "does not match" in said, said
    assert f"resuming from rollout 10 of 40 (checkpoint {older})" in said, said
    assert f"{folder / 'corrupt-rollout_000019'}" in said, said


def test_the_corrupt_checkpoint_is_kept_and_the_next_save_goes_beside_it(tmp_path):
    folder = tmp_path / "ckpt"
    checkpoints = Checkpoints(folder)
    older = checkpoints.save(9, FakeTrain("older"), {"next_rollout": 10})
    newest = checkpoints.save(19, FakeTrain("newest"), {"next_rollout": 20})
    damaged = _flip(newest / "train" / "weights.txt")
    lines = []
    resumed = Checkpoints(folder, log=lines.append)
    assert resumed.resume_point("previous") == older
    aside = folder / "corrupt-rollout_000019"
    assert (aside / "train" / "weights.txt").read_bytes() == damaged
    assert any(f"moved aside to {aside}" in line for line in lines), lines
    again = resumed.save(19, FakeTrain("again"), {"next_rollout": 20})
    assert verify(again) is None and (again / "train" / "weights.txt").read_text() == "again"
    assert (aside / "train" / "weights.txt").read_bytes() == damaged
    assert resumed.resume_point("previous") == again


def test_a_run_resumed_past_a_corrupt_checkpoint_keeps_it(tmp_path):
    # the real loop and torch backend: two checkpoints, the newest's model file damaged
    _, _, config = job_config(tmp_path, "first", rollout__num_rollout="2",
                              checkpoint__save_interval="1", eval__datasets="[]")
    in_process_loop(config).run()
    newest = config.save_dir / "rollout_000001"
    damaged = _flip(newest / "train" / "model_optim.pt")
    start = start_point_in(config.save_dir, "previous")
    assert start.checkpoint == config.save_dir / "rollout_000000"

    _, _, config = job_config(tmp_path, "second", rollout__num_rollout="2",
                              checkpoint__save_interval="1", eval__datasets="[]",
                              checkpoint__on_corrupt='"previous"')
    lines = []
    loop = in_process_loop(config, log=lines.append)
    assert loop.restore() and loop.next_rollout == 1
    loop.run()
    aside = config.save_dir / "corrupt-rollout_000001"
    assert (aside / "train" / "model_optim.pt").read_bytes() == damaged
    assert verify(config.save_dir / "rollout_000001") is None
