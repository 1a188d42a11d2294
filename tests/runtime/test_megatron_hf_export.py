"""The Megatron backend's HF folder (checkpoint.save_hf_interval) is byte for byte what `vime
convert --to hf` makes of the same step's torch_dist checkpoint: one CPU process over gloo
builds the tiny Qwen3-MoE as a GPTModel, writes it as the backend's checkpoint does
(`{"model": ...}` by dist-checkpointing), then exports it with the backend's `save_hf` and
converts the checkpoint with runtime/megatron/convert.py. The backend's init needs a GPU, so
its `save_hf` runs here on a stand-in holding the GPTModel, the architecture and the rank;
the same step on the H200 is not run by this test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("psutil")  # megatron-core's checkpoint writer starts its workers with it

from megatroncpu import free_port  # noqa: E402
from specsupport import ROOT  # noqa: E402

CHILD = """
import contextlib, json, sys
from pathlib import Path
from types import SimpleNamespace

import torch
from megatron.core import dist_checkpointing
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from runtime.backends.megatron_train import MegatronTrainingBackend
from runtime.megatron import convert, shards
from runtime.megatron.mapping import MegatronView
from vime.resolve.model import arch_from_config

tmp, config = Path(sys.argv[1]), json.loads(sys.argv[2])
torch.manual_seed(0)
Qwen3MoeForCausalLM(Qwen3MoeConfig(**config)).to(torch.bfloat16).save_pretrained(tmp / "hf")
arch, layout = arch_from_config(config), {"tp": 1, "pp": 1, "ep": 1, "etp": 1}
convert._init(layout)
model = convert._model(arch, layout)
shards.fill(model, MegatronView(convert.HFCheckpoint(tmp / "hf"), arch))
# the training backend's checkpoint: runtime/backends/megatron_train.py, save
dist = tmp / "rollout_000003" / "train" / "torch_dist"
dist.mkdir(parents=True)
with convert._cpu_checkpointing():
    dist_checkpointing.save({"model": model.sharded_state_dict()}, str(dist))
backend = SimpleNamespace(gpt=model, arch=arch, _weights_readable=contextlib.nullcontext,
                          slice=SimpleNamespace(rank=0, model=SimpleNamespace(arch=config)))
(tmp / "saved_hf").mkdir()
MegatronTrainingBackend.save_hf(backend, tmp / "saved_hf")
convert.torch_dist_to_hf(dist, tmp / "converted_hf", arch, layout, config)
torch.distributed.destroy_process_group()
"""


def test_the_backends_hf_folder_is_the_conversion_of_its_checkpoint(tmp_path):
    config = tomllib.loads((ROOT / "specs" / "tiny_cpu.toml").read_text())["model"]["arch"]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), json.dumps(config)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    saved, converted = tmp_path / "saved_hf", tmp_path / "converted_hf"
    assert sorted(p.name for p in saved.iterdir()) == ["config.json", "model.safetensors"]
    for name in ("model.safetensors", "config.json"):
        assert (saved / name).read_bytes() == (converted / name).read_bytes(), name
    # and it is the model the run started from, tensor for tensor
    import torch
    from safetensors.torch import load_file

    from runtime.megatron.convert import read_hf

    start, written = read_hf(tmp_path / "hf"), load_file(saved / "model.safetensors")
    assert sorted(written) == sorted(start)
    assert [n for n in start if not torch.equal(written[n], start[n])] == []
