"""HF model folders written during training (checkpoint.save_hf_interval): a real tiny run on
the torch backends writes them on schedule, transformers loads them and computes the actor's
log-probs; a save that fails leaves nothing behind; keep_last bounds them. The Megatron
backend's folder is checked against `vime convert --to hf` in test_megatron_hf_export.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from runtimekit import in_process_loop, job_config
from safetensors.torch import load_file, save_file

from runtime.core.interfaces import TrainBatch
from runtime.rl.checkpoint import CheckpointError, Checkpoints, hf_due

# fp32 on both sides; the actor's chunked loss head sums in another order than a full
# log_softmax does
LOGPROB_TOLERANCE = 1e-5


def test_hf_folders_come_every_interval_and_after_the_last_rollout():
    config = SimpleNamespace(save_hf_interval=2, num_rollout=5)
    assert [r for r in range(5) if hf_due(config, r)] == [1, 3, 4]
    assert not any(hf_due(SimpleNamespace(save_hf_interval=0, num_rollout=5), r)
                   for r in range(5))


def _response_log_probs(model, tokens: list[int], prompt_len: int) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    log_probs = torch.log_softmax(logits, dim=-1)
    return [float(log_probs[p - 1, tokens[p]]) for p in range(prompt_len, len(tokens))]


def test_a_run_writes_hf_folders_that_transformers_loads_with_the_actors_log_probs(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, _, config = job_config(tmp_path, rollout__num_rollout="3",
                              checkpoint__save_interval="3", checkpoint__save_hf_interval="2")
    loop = in_process_loop(config)
    loop.run()
    hf_dir = config.save_dir / "hf"
    assert sorted(p.name for p in hf_dir.iterdir()) == ["rollout_000001", "rollout_000002"]
    last = hf_dir / "rollout_000002"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {
        p.name for p in last.iterdir()}

    backend = loop.train.workers[0].backend
    backend.onload()  # a colocated run ends with the actor offloaded
    saved = load_file(last / "model.safetensors")
    actor = dict(backend._hf_weights())
    assert sorted(saved) == sorted(actor)
    assert [n for n in actor if not torch.equal(saved[n], actor[n])] == []

    model = AutoModelForCausalLM.from_pretrained(last, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(last)
    prompt = tokenizer("What is 3 + 4 ?")["input_ids"]
    response = tokenizer("7")["input_ids"] + [tokenizer.eos_token_id]
    batch = TrainBatch(tokens=[prompt + response], prompt_lens=[len(prompt)])
    [want] = backend.log_probs(batch, "actor")
    got = _response_log_probs(model, prompt + response, len(prompt))
    assert got == pytest.approx(want, abs=LOGPROB_TOLERANCE)
    # the folder of rollout 1 holds other weights (two optimizer steps before)
    earlier = load_file(hf_dir / "rollout_000001" / "model.safetensors")
    assert any(not torch.equal(earlier[n], saved[n]) for n in saved)


class FakeTrain:
    def __init__(self, payload: float, fail: bool = False, floats: int = 4):
        self.payload, self.fail, self.floats = payload, fail, floats

    def save_hf(self, path: Path) -> None:
        save_file({"w": torch.full((self.floats,), self.payload)},
                  str(path / "model.safetensors"))
        if self.fail:
            raise OSError(5, "Input/output error", str(path / "config.json"))


def _tokenizer_folder(tmp_path) -> Path:
    source = tmp_path / "hf_checkpoint"
    source.mkdir()
    (source / "config.json").write_text('{"model_type": "qwen3_moe"}\n')
    (source / "tokenizer.json").write_text("{}\n")
    return source


def test_a_failed_hf_save_leaves_the_previous_folder_and_no_partial(tmp_path):
    checkpoints = Checkpoints(tmp_path / "ckpt")
    source = _tokenizer_folder(tmp_path)
    first = checkpoints.save_hf(0, FakeTrain(1.0), str(source))
    assert sorted(p.name for p in first.iterdir()) == ["config.json", "model.safetensors",
                                                        "tokenizer.json"]
    with pytest.raises(CheckpointError, match="cannot write the HF folder"):
        checkpoints.save_hf(1, FakeTrain(2.0, fail=True), str(source))
    assert [p.name for p in (tmp_path / "ckpt" / "hf").iterdir()] == ["rollout_000000"]
    assert float(load_file(first / "model.safetensors")["w"][0]) == 1.0


def test_keep_last_bounds_hf_folders_and_a_repeated_rollout_replaces_its_folder(tmp_path):
    checkpoints = Checkpoints(tmp_path / "ckpt", keep_last=2)
    source = _tokenizer_folder(tmp_path)
    for rollout in range(3):
        checkpoints.save_hf(rollout, FakeTrain(float(rollout)), str(source))
    assert [p.name for p in checkpoints.hf_folders()] == ["rollout_000001", "rollout_000002"]
    again = checkpoints.save_hf(2, FakeTrain(9.0), str(source))
    assert float(load_file(again / "model.safetensors")["w"][0]) == 9.0
    assert sorted(p.name for p in (tmp_path / "ckpt" / "hf").iterdir()) == [
        "rollout_000001", "rollout_000002"]


def test_an_hf_save_that_cannot_fit_is_refused_before_writing(tmp_path):
    from test_disk_faults import tmpfs

    with tmpfs(tmp_path / "small", 400 << 10) as disk:  # one 256 KiB folder fits, not two
        checkpoints = Checkpoints(disk / "ckpt")
        checkpoints.save_hf(0, FakeTrain(1.0, floats=1 << 16), None)
        with pytest.raises(CheckpointError, match="not enough free space"):
            checkpoints.save_hf(1, FakeTrain(2.0, floats=1 << 16), None)
        assert [p.name for p in (disk / "ckpt" / "hf").iterdir()] == ["rollout_000000"]


class SavedTokenizer:
    def save_pretrained(self, folder: str) -> None:
        (Path(folder) / "tokenizer_config.json").write_text('{"saved": "by the run"}\n')


def test_without_hf_checkpoint_the_runs_tokenizer_is_saved_not_the_working_folders(
        tmp_path, monkeypatch):
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    (elsewhere / "tokenizer.json").write_text('{"of": "another model"}\n')
    monkeypatch.chdir(elsewhere)
    folder = Checkpoints(tmp_path / "ckpt").save_hf(0, FakeTrain(1.0), None, SavedTokenizer())
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors",
                                                         "tokenizer_config.json"]
