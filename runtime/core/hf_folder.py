"""An HF model folder written from the actor's weights: model.safetensors and config.json, and
the tokenizer files of the checkpoint the run started from.

`write_weights` is the one writer of exported weights: `vime convert --to hf`
(runtime/megatron/convert.py) and the HF checkpoints a run saves every
checkpoint.save_hf_interval rollouts (the backends' `save_hf`) both call it, so the same
tensors give the same bytes. transformers' `from_pretrained` and vLLM read such a folder as a
model (one safetensors file, the "pt" format mark that transformers' loader checks for).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# what AutoTokenizer and vLLM read besides config.json and the weights
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")
# a folder holds a tokenizer when it holds one of these (the others alone load none)
TOKENIZER_DATA = ("tokenizer.json", "tokenizer.model", "vocab.json")


def write_weights(tensors: Mapping, folder: Path, config: Mapping | None) -> None:
    """model.safetensors of tensors (HF names -> tensors, contiguous, on the host), and
    config.json of config when given, into folder (which exists)."""
    from safetensors.torch import save_file

    save_file(dict(tensors), str(Path(folder) / WEIGHTS_FILE), metadata={"format": "pt"})
    as_ordinary(Path(folder) / WEIGHTS_FILE)
    if config is not None:
        (Path(folder) / CONFIG_FILE).write_text(json.dumps(with_architectures(config), indent=1,
                                                           sort_keys=True) + "\n")


def with_architectures(config: Mapping) -> dict:
    """config with "architectures" (the model class vLLM looks up; without one its registry
    says "No model architectures are specified", vllm/model_executor/models/registry.py)
    filled in from model_type when it has none."""
    config = dict(config)
    if not config.get("architectures"):
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        found = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type", ""))
        if found:
            config["architectures"] = [found]
    return config


def umask() -> int:
    """This process's umask, read without changing it where /proc says it (Linux >= 4.7)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_ordinary(path: Path) -> None:
    """path given the mode of a file (0666) or folder (0777) made by open() or mkdir(), less
    the umask: safetensors' save_file writes its file 0600 (safetensors 0.8) and
    tempfile.mkdtemp its folder 0700, which teammates on a shared file system cannot read."""
    os.chmod(path, (0o777 if Path(path).is_dir() else 0o666) & ~umask())


def has_tokenizer(folder: Path) -> bool:
    """Whether an HF folder holds a tokenizer's data (TOKENIZER_DATA), not only its
    generation config or chat template."""
    return any((Path(folder) / name).is_file() for name in TOKENIZER_DATA)


def copy_tokenizer(source: Path, folder: Path) -> list[str]:
    """The tokenizer files of source (an HF checkpoint folder) copied into folder; returns
    their names (none when source is not a folder or holds none)."""
    source = Path(source)
    if not source.is_dir():
        return []
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, Path(folder) / name)
            copied.append(name)
    return copied
