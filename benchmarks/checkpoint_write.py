"""A background checkpoint write against the disk's sequential rate, on one machine.

Builds an actor-like state of --gb gigabytes on --device (bf16 weights, fp32 main weights and
two Adam moments: 2 + 4 + 4 + 4 bytes per parameter, in tensors of --tensor-mb), saves it the
way checkpoint.async_save does (runtime/backends/torch_train.py: offload.HostSnapshot's host
copy, then torch.save and fsync in a thread of its own while the caller goes on), then writes
the same number of bytes as one plain sequential file (os.write of 64 MiB blocks, fsync) into
the same folder:

    .venv/bin/python benchmarks/checkpoint_write.py --gb 2 --dir build/bench-ckpt

Prints one JSON line: the blocking copy's seconds, the background write's seconds and rate,
the sequential write's, and their ratio (background rate / sequential rate). Each is the best
of --runs. The files are removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.backends.offload import HostSnapshot  # noqa: E402
from runtime.backends.torch_train import BackgroundWrite  # noqa: E402

BLOCK = 64 << 20
BYTES_PER_PARAM = {"weight": (torch.bfloat16, 2), "main": (torch.float32, 4),
                   "exp_avg": (torch.float32, 4), "exp_avg_sq": (torch.float32, 4)}


def actor_state(total_bytes: int, tensor_bytes: int, device: torch.device) -> dict:
    """{"model": {name: bf16}, "optimizer": {name: {main, exp_avg, exp_avg_sq}}} of about
    total_bytes, each parameter of tensor_bytes / 2 elements."""
    per_param = sum(size for _, size in BYTES_PER_PARAM.values())
    params = max(1, total_bytes // per_param)
    elements = max(1, tensor_bytes // 2)
    state: dict = {"model": {}, "optimizer": {}}
    index = 0
    while params > 0:
        count = min(elements, params)
        name = f"layers.{index}.weight"
        state["model"][name] = torch.randn(count, device=device).to(torch.bfloat16)
        state["optimizer"][name] = {key: torch.randn(count, device=device).to(dtype)
                                    for key, (dtype, _) in BYTES_PER_PARAM.items()
                                    if key != "weight"}
        params -= count
        index += 1
    return state


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _shards(copy: dict, writers: int) -> list[dict]:
    """The copy's parameters dealt round-robin into `writers` dicts of the same shape."""
    shards = [{"model": {}, "optimizer": {}} for _ in range(writers)]
    for index, name in enumerate(copy["model"]):
        shards[index % writers]["model"][name] = copy["model"][name]
        shards[index % writers]["optimizer"][name] = copy["optimizer"][name]
    return shards


def background_save(state: dict, snapshot: HostSnapshot, folder: Path,
                    crc32: bool = True, writers: int = 1) -> tuple[float, float]:
    """(seconds the caller is held: the host copy; seconds of the background write). crc32
    False: torch's zip writer leaves out its CRC32 of each record (checkpoints carry their
    own sha256 in state.json)."""
    began = time.perf_counter()
    copy = snapshot.copy(state)
    held = time.perf_counter() - began

    def write() -> None:
        from torch.utils.serialization import config

        config.save.compute_crc32 = crc32
        try:
            if writers == 1:
                torch.save(copy, folder / "model_optim.pt")
                _fsync(folder / "model_optim.pt")
                return
            files = [folder / f"model_optim-{i}.pt" for i in range(writers)]
            threads = [threading.Thread(target=torch.save, args=(shard, path))
                       for shard, path in zip(_shards(copy, writers), files, strict=True)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for path in files:
                _fsync(path)
        finally:
            config.save.compute_crc32 = True

    return held, BackgroundWrite(write).wait()


def sequential_write(nbytes: int, path: Path) -> float:
    block = os.urandom(BLOCK)
    began = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, block[:min(left, BLOCK)])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0, help="actor state, GB (1e9 bytes)")
    parser.add_argument("--tensor-mb", type=float, default=256.0)
    parser.add_argument("--dir", type=Path, default=ROOT / "build" / "bench-ckpt")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--writers", type=int, default=1,
                        help="files written by as many threads (1: model_optim.pt alone)")
    parser.add_argument("--crc32", choices=("on", "off"), default="on",
                        help="torch's CRC32 of each zip record (off: not computed)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    state = actor_state(int(args.gb * 1e9), int(args.tensor_mb * 2**20), device)
    snapshot = HostSnapshot()
    args.dir.mkdir(parents=True, exist_ok=True)
    held, written, sequential = [], [], []
    try:
        for run in range(args.runs):
            folder = args.dir / f"save-{run}"
            folder.mkdir(exist_ok=True)
            seconds = background_save(state, snapshot, folder, args.crc32 == "on",
                                      args.writers)
            held.append(seconds[0])
            written.append(seconds[1])
            nbytes = sum(path.stat().st_size for path in folder.iterdir())
            shutil.rmtree(folder)
            sequential.append(sequential_write(nbytes, args.dir / "sequential.bin"))
            (args.dir / "sequential.bin").unlink()
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    result = {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "bytes": nbytes, "runs": args.runs, "crc32": args.crc32, "writers": args.writers,
        "copy_s": round(min(held), 3),
        "background_write_s": round(min(written), 3),
        "background_gb_per_s": round(nbytes / min(written) / 1e9, 3),
        "sequential_write_s": round(min(sequential), 3),
        "sequential_gb_per_s": round(nbytes / min(sequential) / 1e9, 3),
        "ratio": round(min(sequential) / min(written), 3),
        "folder": str(args.dir),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
