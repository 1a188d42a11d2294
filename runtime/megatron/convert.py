"""HF safetensors <-> Megatron torch_dist, with the mapping of runtime/megatron/mapping.py.

    python -m runtime.megatron.convert --to torch_dist --arch ARCH.json SRC DST
    torchrun --nproc-per-node N -m runtime.megatron.convert --to torch_dist \
        --tp T --pp P --ep E --etp X --arch ARCH.json SRC DST
    python -m runtime.megatron.convert --to hf --arch ARCH.json SRC DST

`vime convert SPEC` (vime/convert.py) runs this with the spec's layout. The ranks, the layout
a checkpoint is saved with and its record: docs/design.md, "Converting checkpoints".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

from runtime.core import hf_folder
from runtime.megatron import shards, torch_dist
from runtime.megatron.mapping import HF_LAYER, MegatronView, tensor_to_hf
from runtime.megatron.model import build_gpt, transformer_config
from vime.resolve.model import Arch, arch_from_config

LAYOUT_FILE = "vime_layout.json"


def _init(layout: dict[str, int]) -> None:
    """One rank of the conversion: torchrun's environment, or a single process."""
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun's ranks
            torch.distributed.init_process_group(backend)
        else:
            # one process alone: an in-memory store, no port (a MASTER_PORT inherited from
            # the caller's environment may be a port some other process listens on)
            torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(),
                                                 rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=layout["tp"],
            pipeline_model_parallel_size=layout["pp"], expert_model_parallel_size=layout["ep"],
            expert_tensor_parallel_size=layout["etp"])
        if torch.cuda.is_available():
            from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(0)  # weights are overwritten; the RNG only must exist


@contextlib.contextmanager
def _cpu_checkpointing():
    """dist-checkpointing assumes a GPU in two calls: its writer copies every tensor to the
    host with non_blocking=True and then calls torch.cuda.synchronize(), and it broadcasts its
    failure flag in a tensor on torch.cuda.current_device(). On a machine without a GPU (gloo,
    every tensor already on the host) there is nothing to wait for and the flag belongs on the
    CPU: for the save and the load, and only where CUDA is unavailable, the two calls say so."""
    if torch.cuda.is_available():
        yield
        return
    saved = torch.cuda.synchronize, torch.cuda.current_device
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = saved


def _rank() -> int:
    return torch.distributed.get_rank()


def _staging(out: Path) -> Path:
    """One temporary sibling of out, named by rank 0 for every rank."""
    name = [_mkdtemp(out) if _rank() == 0 else None]
    torch.distributed.broadcast_object_list(name, src=0)
    return Path(name[0])


def _mkdtemp(out: Path) -> Path:
    """A temporary sibling of out, with the mode of a folder mkdir makes (mkdtemp's is 0700:
    the folder is renamed into place and must be readable as any other)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    hf_folder.as_ordinary(staging)
    return staging


# safetensors' dtype names, in torch's words
DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}
# the dtype of the GPTModel a conversion builds (_model), and so of the torch_dist checkpoint
CHECKPOINT_DTYPE = "bfloat16"


def hf_dtypes(folder: Path) -> list[str]:
    """The dtypes of an HF folder's floating-point tensors, in torch's words, from the
    safetensors headers (no tensor is read)."""
    from safetensors import safe_open

    found = set()
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(path, "pt") as file:
            for key in file.keys():  # noqa: SIM118  (safe_open is not a mapping)
                dtype = file.get_slice(key).get_dtype()
                if dtype in DTYPE_NAMES:
                    found.add(DTYPE_NAMES[dtype])
    return sorted(found)


def _dtype_note(source_dtypes: list[str], direction: str) -> str | None:
    """The line that says a conversion changes the tensors' dtype (None when it does not)."""
    other = [d for d in source_dtypes if d != CHECKPOINT_DTYPE]
    if not other:
        return None
    held = " and ".join(other)
    if direction == "torch_dist":
        return (f"vime convert: the HF folder's tensors are {held}; the torch_dist checkpoint "
                f"holds them in {CHECKPOINT_DTYPE} (the training dtype), so converting it back "
                f"gives {CHECKPOINT_DTYPE} tensors, not these (a round trip is bit-identical "
                f"for a {CHECKPOINT_DTYPE} HF folder only)")
    return (f"vime convert: model.safetensors holds {CHECKPOINT_DTYPE} tensors (the torch_dist "
            f"checkpoint's dtype); the HF folder it was converted from held {held}, rounded "
            f"to {CHECKPOINT_DTYPE} on the way")


def read_hf(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF folder, under the hub's per-expert names (whole in memory)."""
    checkpoint = HFCheckpoint(folder)
    return {name: checkpoint[name] for name in checkpoint}


class HFCheckpoint(Mapping):
    """The tensors of an HF safetensors folder under the hub's per-expert names, each read
    from its file when asked for (safetensors maps the files; nothing is loaded up front).
    Experts that transformers 5 saved fused (`mlp.experts.gate_up_proj` [E, 2F, H],
    `mlp.experts.down_proj` [E, H, F]) are read one expert at a time, so that a rank of a
    conversion or of the Megatron backend reads the dense weights and its own experts only."""

    def __init__(self, folder: Path):
        from safetensors import safe_open

        self.folder = Path(folder)
        # hub name -> (file, key in the file, expert index or None, half of gate|up or None)
        self.where: dict[str, tuple[Path, str, int | None, int | None]] = {}
        for path in sorted(self.folder.glob("*.safetensors")):
            with safe_open(path, "pt") as file:
                for key in file.keys():  # noqa: SIM118  (safe_open is not a mapping)
                    self._index(path, key, file)
        if not self.where:
            raise FileNotFoundError(f"no *.safetensors in {folder}")

    def _index(self, path: Path, key: str, file) -> None:
        found = HF_LAYER.match(key)
        if found and found[2] in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
            prefix = f"model.layers.{found[1]}.mlp.experts."
            for expert in range(file.get_slice(key).get_shape()[0]):
                if found[2] == "mlp.experts.down_proj":
                    self.where[f"{prefix}{expert}.down_proj.weight"] = (path, key, expert, None)
                else:
                    self.where[f"{prefix}{expert}.gate_proj.weight"] = (path, key, expert, 0)
                    self.where[f"{prefix}{expert}.up_proj.weight"] = (path, key, expert, 1)
        else:
            self.where[key] = (path, key, None, None)

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        path, key, expert, half = self.where[name]
        with safe_open(path, "pt") as file:
            if expert is None:
                return file.get_tensor(key)
            tensor = file.get_slice(key)[expert]
        if half is not None:
            tensor = torch.chunk(tensor, 2, dim=0)[half]
        return tensor.contiguous()

    def __iter__(self):
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)


def _model(arch: Arch, layout: dict[str, int]):
    """The layout's GPTModel, on this rank's GPU, or on the CPU where there is none (the
    weights are the same; the CPU build needs the allgather dispatcher, which makes no CUDA
    streams, and no forward ever runs here)."""
    cpu = {} if torch.cuda.is_available() else dict(
        use_cpu_initialization=True, moe_token_dispatcher_type="allgather",
        variable_seq_lengths=False)
    from megatron.core import parallel_state

    config = transformer_config(arch, tensor_model_parallel_size=layout["tp"],
                                pipeline_model_parallel_size=layout["pp"],
                                expert_model_parallel_size=layout["ep"],
                                expert_tensor_parallel_size=layout["etp"], **cpu)
    with _rotary_on_the_cpu(not torch.cuda.is_available()):
        model = build_gpt(arch, config, arch.max_position_embeddings,
                          pre_process=parallel_state.is_pipeline_first_stage(),
                          post_process=parallel_state.is_pipeline_last_stage()).to(torch.bfloat16)
    return model.cuda() if torch.cuda.is_available() else model


@contextlib.contextmanager
def _rotary_on_the_cpu(cpu: bool):
    """megatron-core's MLA builds its RotaryEmbedding without use_cpu_initialization, which
    then asks torch.cuda.current_device() (megatron/core/transformer/multi_latent_attention.py):
    on a machine without a GPU that device is the CPU, while the model is built."""
    if not cpu:
        yield
        return
    asked = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        torch.cuda.current_device = asked


def _publish(staging: Path, target: Path) -> None:
    if target.exists():
        raise FileExistsError(f"{target} exists; vime convert never overwrites a checkpoint")
    os.replace(staging, target)


def hf_to_torch_dist(hf_dir: Path, out: Path, arch: Arch, layout: dict[str, int]) -> None:
    from megatron.core import dist_checkpointing

    _init(layout)
    model = _model(arch, layout)
    # each rank reads the tensors of its own pieces only (the dense ones and its experts)
    shards.fill(model, MegatronView(HFCheckpoint(hf_dir), arch))
    staging = _staging(out)
    try:
        with _cpu_checkpointing():
            dist_checkpointing.save(model.sharded_state_dict(), str(staging))
        torch.distributed.barrier()
        if _rank() == 0:
            dtypes = hf_dtypes(hf_dir)
            (staging / LAYOUT_FILE).write_text(json.dumps(
                {**layout, "source": str(hf_dir), "source_dtypes": dtypes,
                 "format": "torch_dist", "spec": "megatron-core GPTModel, local layer spec"},
                indent=1) + "\n")
            _publish(staging, out)
            note = _dtype_note(dtypes, "torch_dist")
            if note:
                print(note, flush=True)
    finally:
        torch.distributed.barrier()
        if _rank() == 0:
            shutil.rmtree(staging, ignore_errors=True)


def gather_hf(model, arch: Arch, keep: bool) -> dict[str, torch.Tensor]:
    """Every full tensor of a GPTModel under HF names, on the host: a collective (every rank
    of the model calls it); only ranks with keep hold the result (the others get {} and keep
    no host copy of the model)."""
    hf: dict[str, torch.Tensor] = {}
    for bucket in shards.gather(model, 1 << 30):
        if not keep:
            continue
        for name, tensor in bucket.items():
            hf.update({k: v.contiguous().cpu() for k, v in tensor_to_hf(name, tensor, arch).items()})
    return hf


def torch_dist_to_hf(dist_dir: Path, out: Path, arch: Arch, layout: dict[str, int],
                     config_json: dict | None = None, tokenizer_from: Path | None = None) -> None:
    """The torch_dist checkpoint as an HF folder at out: model.safetensors, config.json of
    config_json, and the tokenizer files of tokenizer_from, else of the HF folder the
    checkpoint was converted from (its vime_layout.json's "source"); said when there are
    none, and when the tensors' dtype differs from that folder's."""
    from megatron.core import dist_checkpointing

    _init(layout)
    model = _model(arch, layout)
    state = model.sharded_state_dict()
    torch_dist.align(state, dist_dir)  # saved by either layer spec
    with _cpu_checkpointing():
        loaded = dist_checkpointing.load(state, str(dist_dir))
    model.load_state_dict(loaded, strict=False)
    hf = gather_hf(model, arch, _rank() == 0)
    if _rank() != 0:
        return
    record = _layout_record(dist_dir)
    sources = [Path(p) for p in (tokenizer_from, record.get("source")) if p]
    staging = _mkdtemp(out)
    try:
        hf_folder.write_weights(hf, staging, config_json)
        said = _copy_tokenizer(sources, staging)
        _publish(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(said, flush=True)
    note = _dtype_note(record.get("source_dtypes") or [], "hf")
    if note:
        print(note, flush=True)


def _layout_record(dist_dir: Path) -> dict:
    try:
        record = json.loads((Path(dist_dir) / LAYOUT_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _copy_tokenizer(sources: list[Path], folder: Path) -> str:
    """The tokenizer files of the first of sources that holds a tokenizer, copied into folder;
    the line that says what was copied, or that none was found (the generation config and
    chat template of the first source are copied then)."""
    for source in sources:
        if hf_folder.has_tokenizer(source):
            copied = hf_folder.copy_tokenizer(source, folder)
            return f"vime convert: tokenizer files copied from {source}: {', '.join(copied)}"
    copied = hf_folder.copy_tokenizer(sources[0], folder) if sources else []
    looked = ", ".join(str(s) for s in sources) or "no HF folder known"
    return (f"vime convert: no tokenizer files found (looked in {looked}): the folder has no "
            "tokenizer, and transformers' AutoTokenizer cannot load one from it; copy "
            "tokenizer.json, tokenizer_config.json and special_tokens_map.json (or vocab.json "
            "and merges.txt) from the model's HF checkpoint into it"
            + (f" (copied: {', '.join(copied)})" if copied else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.megatron.convert")
    parser.add_argument("--to", choices=("torch_dist", "hf"), required=True)
    parser.add_argument("--arch", required=True,
                        help="HF config.json keys: a JSON object, or a file holding one")
    for size in ("tp", "pp", "ep", "etp"):
        parser.add_argument(f"--{size}", type=int, default=1,
                            help=f"the layout's {size} (the world must hold it)")
    parser.add_argument("--tokenizer-from", type=Path, default=None,
                        help="--to hf: the HF folder whose tokenizer files are copied (default: "
                        "the one the torch_dist checkpoint was converted from)")
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    # `vime convert` passes the object inline, so that the command its --dry-run prints works
    # as it stands (a temporary file is gone by the time a user runs it)
    config = json.loads(args.arch if args.arch.lstrip().startswith("{")
                        else Path(args.arch).read_text())
    arch = arch_from_config(config)
    layout = {"tp": args.tp, "pp": args.pp, "ep": args.ep, "etp": args.etp}
    args.target.parent.mkdir(parents=True, exist_ok=True)
    if args.to == "torch_dist":
        hf_to_torch_dist(args.source, args.target, arch, layout)
    else:
        torch_dist_to_hf(args.source, args.target, arch, layout, config, args.tokenizer_from)
    if _rank() == 0:
        print(f"wrote {args.target} (tp={args.tp} pp={args.pp} ep={args.ep} etp={args.etp}, "
              f"{torch.distributed.get_world_size()} ranks)")
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
