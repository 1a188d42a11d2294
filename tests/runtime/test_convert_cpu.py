"""`vime convert` run for real on this machine (no GPU): the tiny spec's Qwen3-MoE, made by
transformers, goes HF -> torch_dist under tp 2 and back to HF under ep 2, each a torchrun of
two CPU processes over gloo, with megatron-core's own dist-checkpointing writing and
resharding the checkpoint. Every tensor must come back bit for bit, and the folder written
must load in transformers and compute the same logits. The GPU side of the same commands is
in docs/gpu-runs.md.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tomllib

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("psutil")  # megatron-core's checkpoint writer starts its workers with it

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from specsupport import ROOT  # noqa: E402

from runtime.megatron.convert import LAYOUT_FILE, read_hf  # noqa: E402
from vime.cli import main  # noqa: E402

SPEC = ROOT / "specs" / "tiny_cpu.toml"


def _tiny_hf(folder) -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    arch = tomllib.loads(SPEC.read_text())["model"]["arch"]
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(Qwen3MoeConfig(**arch)).to(torch.bfloat16).save_pretrained(folder)


def _logits(folder) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        return model(torch.arange(2, 18).reshape(2, 8)).logits


def _convert(tmp_path, *extra, tp=1, ep=1, pp=1):
    return main(["convert", str(SPEC), *extra,
                 "--set", f'model.hf_checkpoint="{tmp_path / "hf"}"',
                 "--set", f'model.torch_dist_checkpoint="{tmp_path / "dist"}"',
                 "--set", 'train.backend="megatron"', "--set", "cluster.gpus_per_node=2",
                 "--set", f"train.parallel.tp={tp}", "--set", f"train.parallel.ep={ep}",
                 "--set", f"train.parallel.pp={pp}"])


def test_hf_to_torch_dist_and_back_under_another_layout_is_bit_exact(tmp_path, capsys):
    _tiny_hf(tmp_path / "hf")
    assert _convert(tmp_path, tp=2) == 0, capsys.readouterr().err[-3000:]
    layout = json.loads((tmp_path / "dist" / LAYOUT_FILE).read_text())
    assert (layout["tp"], layout["ep"], layout["format"]) == (2, 1, "torch_dist")
    assert sorted(p.name for p in (tmp_path / "dist").glob("*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]  # one file per rank: both ranks wrote their pieces

    # back under expert parallelism: megatron-core reshards the tp-2 checkpoint on load
    assert _convert(tmp_path, "--to", "hf", ep=2) == 0, capsys.readouterr().err[-3000:]
    assert "warning[V705]" in capsys.readouterr().err  # the saved layout differs: said so
    before = read_hf(tmp_path / "hf")
    after = load_file(tmp_path / "dist_hf" / "model.safetensors")
    assert sorted(after) == sorted(before)
    assert [name for name in before if not torch.equal(before[name], after[name])] == []

    # the folder written is a model transformers loads, with vime's config.json
    assert torch.equal(_logits(tmp_path / "dist_hf"), _logits(tmp_path / "hf"))


@pytest.mark.slow
def test_pipeline_stages_save_their_own_layers(tmp_path, capsys):
    """pp 2: each stage builds and writes its own layer (the embedding on the first, the head
    on the last), under the full model's layer numbers; read back under ep 2."""
    _tiny_hf(tmp_path / "hf")
    assert _convert(tmp_path, pp=2) == 0, capsys.readouterr().err[-3000:]
    assert json.loads((tmp_path / "dist" / LAYOUT_FILE).read_text())["pp"] == 2
    # both stages wrote a share of the weights (a replicated rank would write nothing)
    sizes = [(tmp_path / "dist" / f"__{rank}_0.distcp").stat().st_size for rank in (0, 1)]
    assert min(sizes) > 0.25 * sum(sizes), sizes
    assert _convert(tmp_path, "--to", "hf", ep=2) == 0, capsys.readouterr().err[-3000:]
    before = read_hf(tmp_path / "hf")
    after = load_file(tmp_path / "dist_hf" / "model.safetensors")
    assert sorted(after) == sorted(before)
    assert [name for name in before if not torch.equal(before[name], after[name])] == []


def test_one_process_takes_no_port_and_ignores_an_inherited_master_port():
    # `vime convert` with a layout of one rank runs in one process: a MASTER_PORT in the
    # caller's environment (a Slurm job's, a test process's own gloo store) names a port that
    # something else may listen on, and the conversion must not try to take it
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(busy.getsockname()[1]))
        done = subprocess.run(
            [sys.executable, "-c", "import torch; from runtime.megatron.convert import _init; "
             "_init(dict(tp=1, pp=1, ep=1, etp=1)); print(torch.distributed.get_world_size())"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "1"
