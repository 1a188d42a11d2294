"""HF folders a run exports (checkpoint.save_hf_interval) are readable by the user's group and
others as any file they write is: files 0666 and folders 0777 less the umask, not the 0600
that safetensors' writer gives its file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from runtime.core import hf_folder
from runtime.rl.checkpoint import Checkpoints


class WritesWeights:
    """The backends' save_hf: hf_folder.write_weights from one rank."""

    def save_hf(self, path: Path) -> None:
        hf_folder.write_weights({"w": torch.ones(4)}, path, {"model_type": "qwen3_moe"})


def _modes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder.parent)): stat.S_IMODE(p.stat().st_mode)
            for p in [folder, *folder.rglob("*")]}


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_an_hf_export_has_the_modes_of_an_ordinary_file(tmp_path, umask):
    source = tmp_path / "hf_checkpoint"
    source.mkdir()
    (source / "tokenizer.json").write_text("{}\n")
    previous = os.umask(umask)
    try:
        folder = Checkpoints(tmp_path / "ckpt").save_hf(0, WritesWeights(), str(source))
    finally:
        os.umask(previous)
    modes = _modes(folder)
    assert set(modes) == {"rollout_000000", "rollout_000000/model.safetensors",
                          "rollout_000000/config.json", "rollout_000000/tokenizer.json"}
    want = {name: (0o777 if name == "rollout_000000" else 0o666) & ~umask for name in modes}
    assert {k: oct(v) for k, v in modes.items()} == {k: oct(v) for k, v in want.items()}
