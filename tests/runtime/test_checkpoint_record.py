"""A checkpoint the loop saves records the model, backend and layout that wrote it
(vime_checkpoint.json), and `vime plan` of a spec that cannot load it says so (V708) before
anything starts, as the torch backend's own load would after the start."""

from __future__ import annotations

import json

import pytest
from runtimekit import TINY, in_process_loop, job_config, sets_for
from specsupport import run_spec

from runtime.backends.torch_train import TorchTrainingBackend


def test_a_saved_checkpoint_records_its_model_and_plan_refuses_another(tmp_path):
    _, _, config = job_config(tmp_path, rollout__num_rollout="1")
    in_process_loop(config).run()  # one rollout, then the checkpoint after the last
    checkpoint = tmp_path / "runs" / "tiny-cpu" / "checkpoints" / "rollout_000000"
    record = json.loads((checkpoint / "vime_checkpoint.json").read_text())
    assert (record["train_backend"], record["format"]) == ("torch", "torch")
    assert record["arch"] == {
        "model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 32,
        "tie_word_embeddings": False, "mlp_only_layers": [], "intermediate_size": 128,
        "num_experts": 4, "moe_intermediate_size": 64}
    assert record["layout"] == {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": 1, "dp": 1,
                                "edp": 1, "ranks": 1}
    assert "any number of data-parallel ranks" in record["loads_under"]

    def found(**keys):
        result = run_spec(TINY, sets_for(tmp_path, **keys))
        return [d for d in result.diagnostics if d.code in ("V708", "V709")]

    assert found() == []  # the spec that wrote it resumes it
    assert found(cluster__gpus_per_node="2") == []  # the torch format loads under any dp
    (diag,) = found(model__arch__hidden_size="96")
    assert diag.code == "V708" and diag.severity == "error"
    assert "hidden_size 64 in the checkpoint, 96 in this spec" in diag.message
    assert str(checkpoint / "vime_checkpoint.json") in diag.message

    # what the job would meet after its start: the backend of the new model cannot load it
    # (compiled for a folder of its own: in this one, compiling it is refused by V708)
    _, _, other = job_config(tmp_path / "other", model__arch__hidden_size="96")
    backend = TorchTrainingBackend()
    backend.init(other.train_slice(0, "127.0.0.1", 0, 1))
    with pytest.raises(RuntimeError, match="size mismatch"):
        backend.load(checkpoint / "train")
