"""An HF folder written during training (checkpoint.save_hf_interval) is a model vLLM serves:
the torch training backend's weights of the tiny spec, written by Checkpoints.save_hf, started
as a vLLM CPU engine (in a child process: an engine core needs a main module it can spawn
from), whose log-probs of what it samples equal transformers' on the same folder. vLLM's CPU
attention has no kernels for the tiny spec's head_dim 16, so the folder's model has head_dim 32.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.backends.torch_train import TorchTrainingBackend
from runtime.core.slices import JobConfig, compile_job
from runtime.rl.checkpoint import Checkpoints

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 5e-5  # float32 on both sides (the same as test_vllm_cpu.py's)

CHILD = """
import json, sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm import LLM, SamplingParams


def main():
    folder = sys.argv[1]
    llm = LLM(model=folder, dtype="float32", enforce_eager=True,
              kv_cache_memory_bytes=64 << 20, max_model_len=64, seed=0)
    prompt = AutoTokenizer.from_pretrained(folder)("What is 3 + 4 ?")["input_ids"]
    out = llm.generate([{"prompt_token_ids": prompt}],
                       SamplingParams(max_tokens=4, temperature=1.0, seed=1, logprobs=0))
    sample = out[0].outputs[0]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokens = prompt + list(sample.token_ids)
    with torch.no_grad():
        log_probs = torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), -1)
    Path(sys.argv[2]).write_text(json.dumps({
        "tokens": list(sample.token_ids),
        "vllm": [step[t].logprob for step, t in zip(sample.logprobs, sample.token_ids)],
        "transformers": [float(log_probs[len(prompt) + i - 1, t])
                         for i, t in enumerate(sample.token_ids)]}))


if __name__ == "__main__":
    main()
"""


def test_vllm_serves_an_hf_folder_of_the_torch_backend(tmp_path):
    files = compile_job(ROOT / "specs" / "tiny_cpu.toml", [
        f'experiment.output_dir="{tmp_path / "runs"}"', "model.arch.head_dim=32"])
    job_dir = tmp_path / "runs" / "tiny-cpu" / "job"
    job_dir.mkdir(parents=True)
    config = JobConfig.from_job(json.loads(files["plan.json"]), files["resolved.toml"], job_dir)
    backend = TorchTrainingBackend()
    backend.init(config.train_slice(0, "127.0.0.1", 0, 1))
    from runtime.toy import build_tokenizer, prompt_texts

    tokenizer = build_tokenizer(prompt_texts(config.data.prompt_data, config.data.input_key,
                                             config.data.label_key))
    folder = Checkpoints(config.save_dir).save_hf(0, backend, config.model.hf_checkpoint,
                                                   tokenizer)
    child = tmp_path / "serve.py"
    child.write_text(CHILD)
    done = subprocess.run([sys.executable, str(child), str(folder), str(tmp_path / "out.json")],
                          capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads((tmp_path / "out.json").read_text())
    assert got["tokens"]
    assert got["vllm"] == pytest.approx(got["transformers"], abs=TOLERANCE)
