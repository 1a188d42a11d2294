"""`vime plan`'s forecast of the checkpoints' disk (vime/check/disk.py): the folders on disk at
once under checkpoint.keep_last, a checkpoint's size against one the torch backend writes, and
V738 only where the free space is knowable."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specsupport import ROOT, codes, run_spec

from vime.check import disk

TINY = ROOT / "specs" / "tiny_cpu.toml"


def test_keep_last_bounds_the_folders_on_disk_at_once_plus_the_one_being_written():
    spec = run_spec(TINY, ["rollout.num_rollout=100", "checkpoint.save_interval=10",
                           "checkpoint.keep_last=3", "checkpoint.save_hf_interval=50"]).spec
    forecast = disk.forecast(spec)
    assert (forecast.checkpoints_at_once, forecast.hf_at_once) == (4, 2)
    assert forecast.needed_bytes == 4 * forecast.checkpoint_bytes + 2 * forecast.hf_bytes
    every = disk.forecast(run_spec(TINY, ["rollout.num_rollout=95",
                                          "checkpoint.save_interval=10"]).spec)
    assert every.checkpoints_at_once == 10  # every one kept: 9 intervals and the last


def test_a_folder_whose_file_system_is_not_mounted_here_is_not_judged():
    huge = ["rollout.num_rollout=10000000", "checkpoint.save_interval=1"]
    assert "V738" in codes(run_spec(TINY, huge))
    elsewhere = huge + [f"model.save={json.dumps('/nonexistent-vime-mount/ckpt')}"]
    assert "V738" not in codes(run_spec(TINY, elsewhere))


def test_the_forecast_size_is_that_of_a_torch_backend_checkpoint(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from runtimekit import in_process_loop, job_config

    _, _, config = job_config(tmp_path, "size", rollout__num_rollout="1",
                              eval__datasets="[]")
    in_process_loop(config).run()
    train = config.save_dir / "rollout_000000" / "train"
    written = sum(p.stat().st_size for p in Path(train).iterdir())
    forecast = disk.forecast(run_spec(TINY, ["rollout.num_rollout=1"]).spec)
    assert abs(written - forecast.checkpoint_bytes) <= 0.05 * written, (written, forecast)
