"""`vime convert --to hf` writes a folder a teammate can read and transformers loads whole: the
folder 0777 and its files 0666 less the umask (not tempfile's 0700), the tokenizer files of the
HF checkpoint the spec names (or the conversion recorded), and a line when there are none; and
a float32 HF folder's trip through torch_dist (bfloat16) is said, both ways.
Each conversion is a real `vime convert` of the tiny spec, one CPU process."""

from __future__ import annotations

import json
import stat
import tomllib

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("psutil")  # megatron-core's checkpoint writer starts its workers with it

import torch  # noqa: E402
from runtimekit import TINY, vime  # noqa: E402

pytestmark = pytest.mark.slow  # three conversions, ~10 s of CPU each


def _tiny_hf(folder) -> int:
    """The tiny spec's model in float32, with the toy's tokenizer; its number of tokens."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from runtime import toy

    arch = tomllib.loads(TINY.read_text())["model"]["arch"]
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(Qwen3MoeConfig(**arch)).to(torch.float32).save_pretrained(folder)
    tokenizer = toy.build_tokenizer(["What is 3 + 4 ?", "7"])
    tokenizer.save_pretrained(folder)
    return len(tokenizer)


def _convert(tmp_path, *extra):
    return vime("convert", str(TINY), *extra,
                "--set", f"model.hf_checkpoint={json.dumps(str(tmp_path / 'hf'))}",
                "--set", f"model.torch_dist_checkpoint={json.dumps(str(tmp_path / 'dist'))}",
                "--set", 'train.backend="megatron"', timeout=600)


def test_convert_to_hf_is_readable_has_the_tokenizer_and_says_the_dtype(tmp_path):
    from transformers import AutoTokenizer

    tokens = _tiny_hf(tmp_path / "hf")
    done = _convert(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "float32" in done.stdout and "bfloat16" in done.stdout, done.stdout

    done = _convert(tmp_path, "--to", "hf")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = tmp_path / "dist_hf"
    umask = 0o022  # the test session's (conftest does not change it)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in out.iterdir()} == {
        p.name: oct(0o666 & ~umask) for p in out.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    assert f"tokenizer files copied from {tmp_path / 'hf'}" in done.stdout, done.stdout
    assert len(AutoTokenizer.from_pretrained(out)) == tokens
    assert "bfloat16" in done.stdout and "float32" in done.stdout, done.stdout

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (tmp_path / "hf" / name).unlink(missing_ok=True)
    done = _convert(tmp_path, "--to", "hf", "-o", str(tmp_path / "bare_hf"))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "no tokenizer files" in done.stdout and str(tmp_path / "hf") in done.stdout, \
        done.stdout
