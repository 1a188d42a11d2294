"""HF safetensors <-> Megatron torch_dist, with the mapping of runtime/megatron/mapping.py.

    python -m runtime.megatron.convert --to torch_dist --arch ARCH.json SRC DST
    python -m runtime.megatron.convert --to hf --arch ARCH.json SRC DST

`vime convert SPEC` runs this with the spec's architecture and checkpoint paths. It runs as
one process on one GPU (megatron-core's dist-checkpoint writer synchronises CUDA): the model
is built at tensor/expert parallel size 1 and the checkpoint's layout is recorded in
`vime_layout.json` beside it; megatron-core reshards weights when the training job loads it
under its own tp/pp/ep (shared/reference/megatron.md §6). The folder appears only when
complete (written to a temporary sibling, then renamed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from runtime.megatron.mapping import hf_to_megatron, megatron_to_hf, unfuse_experts
from runtime.megatron.model import build_gpt, transformer_config
from vime.resolve.model import Arch, arch_from_config

LAYOUT_FILE = "vime_layout.json"


def _init_single_process() -> None:
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        torch.distributed.init_process_group("nccl", world_size=1, rank=0)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(0)  # weights are overwritten; the RNG only must exist


def read_hf(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(path))
    if not tensors:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    return unfuse_experts(tensors)


def _model(arch: Arch):
    config = transformer_config(arch)
    return build_gpt(arch, config, arch.max_position_embeddings).to(torch.bfloat16).cuda()


def _publish(staging: Path, target: Path) -> None:
    if target.exists():
        raise FileExistsError(f"{target} exists; vime convert never overwrites a checkpoint")
    os.replace(staging, target)


def hf_to_torch_dist(hf_dir: Path, out: Path, arch: Arch) -> None:
    from megatron.core import dist_checkpointing

    _init_single_process()
    model = _model(arch)
    model.load_state_dict({k: v.cuda() for k, v in hf_to_megatron(read_hf(hf_dir), arch).items()},
                          strict=False)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        dist_checkpointing.save(model.sharded_state_dict(), str(staging))
        (staging / LAYOUT_FILE).write_text(json.dumps(
            {"tp": 1, "pp": 1, "ep": 1, "etp": 1, "source": str(hf_dir), "format": "torch_dist",
             "spec": "megatron-core GPTModel, local layer spec"}, indent=1) + "\n")
        _publish(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def torch_dist_to_hf(dist_dir: Path, out: Path, arch: Arch, config_json: dict | None = None) -> None:
    from megatron.core import dist_checkpointing
    from safetensors.torch import save_file

    _init_single_process()
    model = _model(arch)
    model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), str(dist_dir)),
                          strict=False)
    weights = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    hf = {k: v.contiguous().cpu() for k, v in megatron_to_hf(weights, arch).items()}
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file(hf, str(staging / "model.safetensors"), metadata={"format": "pt"})
        if config_json is not None:
            (staging / "config.json").write_text(json.dumps(config_json, indent=1) + "\n")
        _publish(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.megatron.convert")
    parser.add_argument("--to", choices=("torch_dist", "hf"), required=True)
    parser.add_argument("--arch", required=True, help="a JSON file of HF config.json keys")
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    config = json.loads(Path(args.arch).read_text())
    arch = arch_from_config(config)
    args.target.parent.mkdir(parents=True, exist_ok=True)
    if args.to == "torch_dist":
        hf_to_torch_dist(args.source, args.target, arch)
    else:
        torch_dist_to_hf(args.source, args.target, arch, config)
    print(f"wrote {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
