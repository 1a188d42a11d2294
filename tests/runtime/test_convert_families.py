"""`vime convert`'s command (python -m runtime.megatron.convert) on a small random model of the
DeepSeek-V3 and GLM-4.5 families written by transformers' save_pretrained: HF -> torch_dist
under one layout, back to HF under another, each a torchrun of two CPU processes over gloo.
Every tensor comes back bit for bit, the router's fp32 expert bias included, and the folder
written loads in transformers and computes the same logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("psutil")  # megatron-core's checkpoint writer starts its workers with it
transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from moe_families import FAMILIES  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from specsupport import ROOT  # noqa: E402


def _save(name: str, folder) -> None:
    config = FAMILIES[name]
    kind = (transformers.DeepseekV3Config if config["model_type"] == "deepseek_v3"
            else transformers.Glm4MoeConfig)
    hf = kind(initializer_range=0.2,
              **{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf).to(torch.bfloat16)
    for key, buffer in model.named_buffers():
        if key.endswith("e_score_correction_bias"):  # fp32, as the published checkpoints
            buffer.data = torch.randn(buffer.shape) * 0.1
    model.save_pretrained(folder)


def _convert(direction: str, name: str, source, target, **layout) -> None:
    sizes = [f"--{k}={v}" for k, v in layout.items()]
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "runtime.megatron.convert", "--to", direction, *sizes,
         "--arch", json.dumps(FAMILIES[name]), str(source), str(target)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]


def _logits(folder) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        return model(torch.arange(2, 18).reshape(2, 8)).logits


# DeepSeek-V3 in the fast tier, GLM-4.5 in the full one (two torchruns of 40 s on 2 cores):
# MLA, shared experts and the expert bias; GLM-4.5's QKV bias and partial rotary map by the same rules, and its weights
# round-trip bit for bit in tests/oracle/test_megatron_families.py
@pytest.mark.parametrize(("name", "there", "back"), [
    ("deepseek_v3", {"tp": 2}, {"ep": 2}),
    pytest.param("glm4_moe", {"ep": 2}, {"tp": 2}, marks=pytest.mark.slow),
])
def test_round_trip_through_torch_dist_is_bit_exact(tmp_path, name, there, back):
    _save(name, tmp_path / "hf")
    _convert("torch_dist", name, tmp_path / "hf", tmp_path / "dist", **there)
    _convert("hf", name, tmp_path / "dist", tmp_path / "back", **back)
    before = load_file(tmp_path / "hf" / "model.safetensors")
    after = load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(after) == sorted(before)
    assert [k for k in before if before[k].dtype != after[k].dtype
            or not torch.equal(before[k], after[k])] == []
    assert any(k.endswith("e_score_correction_bias") for k in after)
    assert torch.equal(_logits(tmp_path / "back"), _logits(tmp_path / "hf"))
