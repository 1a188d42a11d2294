"""The Megatron backend's choice of layer spec (train.transformer_impl) and
what makes the Transformer Engine spec's parameters look like the local spec's.

The TE spec itself needs CUDA and transformer_engine, so it is checked on the GPU
(benchmarks/gpu/te_vs_local.py, docs/gpu-runs.md); here: the decision, its messages, the
name translation, and the optimizer-state repair that must leave TE's FusedAdam alone.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from runtime.megatron import model, shards


def test_local_is_taken_as_asked():
    assert model.choose_transformer_impl("local")[0] == "local"


def test_auto_without_transformer_engine_falls_back_and_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # import fails
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    impl, why = model.choose_transformer_impl("auto")
    assert impl == "local"
    assert "transformer_engine does not import" in why


def test_auto_without_cuda_is_local(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert model.choose_transformer_impl("auto") == ("local", "no CUDA device")


def test_forced_transformer_engine_fails_at_start_with_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError) as error:
        model.choose_transformer_impl("transformer_engine")
    message = str(error.value)
    assert "transformer-engine[pytorch]" in message and '"auto" or "local"' in message


def test_auto_takes_transformer_engine_where_it_imports(monkeypatch):
    te = types.ModuleType("transformer_engine")
    te.__version__ = "2.20.2"
    te.pytorch = types.ModuleType("transformer_engine.pytorch")
    monkeypatch.setitem(sys.modules, "transformer_engine", te)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te.pytorch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert model.choose_transformer_impl("auto") == ("transformer_engine",
                                                     "transformer_engine 2.20.2 imports")


def test_an_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="expected one of auto, transformer_engine, local"):
        model.choose_transformer_impl("te")


@pytest.mark.parametrize(("te_name", "local"), [
    ("decoder.layers.3.self_attention.linear_qkv.layer_norm_weight",
     "decoder.layers.3.input_layernorm.weight"),
    ("decoder.layers.0.mlp.linear_fc1.layer_norm_weight",  # a dense layer's fused norm
     "decoder.layers.0.pre_mlp_layernorm.weight"),
    ("decoder.layers.1.mlp.experts.linear_fc1.weight12",
     "decoder.layers.1.mlp.experts.local_experts.12.linear_fc1.weight"),
    ("decoder.layers.1.mlp.experts.linear_fc2.weight0",
     "decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight"),
    # the names both specs share stay as they are
    ("decoder.layers.1.pre_mlp_layernorm.weight", "decoder.layers.1.pre_mlp_layernorm.weight"),
    ("decoder.layers.1.self_attention.linear_qkv.weight",
     "decoder.layers.1.self_attention.linear_qkv.weight"),
    ("decoder.layers.1.self_attention.q_layernorm.weight",
     "decoder.layers.1.self_attention.q_layernorm.weight"),
    ("decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.0.mlp.linear_fc1.weight"),
    ("decoder.final_layernorm.weight", "decoder.final_layernorm.weight"),
])
def test_te_names_become_the_local_specs(te_name, local):
    assert shards.local_name(te_name) == local


def test_the_te_spec_wants_grouped_experts_in_its_config():
    pytest.importorskip("megatron.core")
    from vime.resolve.model import arch_from_config

    arch = arch_from_config({"model_type": "qwen3_moe", "num_hidden_layers": 1, "hidden_size": 64,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                             "vocab_size": 128, "intermediate_size": 64,
                             "moe_intermediate_size": 32, "num_experts": 4,
                             "num_experts_per_tok": 2, "max_position_embeddings": 64})
    config = types.SimpleNamespace(moe_grouped_gemm=False)
    with pytest.raises(ValueError, match="moe_grouped_gemm=True"):
        model.build_gpt(arch, config, 64, impl="transformer_engine")
    with pytest.raises(ValueError, match="expected local or transformer_engine"):
        model.build_gpt(arch, config, 64, impl="auto")


def test_adam_step_repair_leaves_other_optimizers_alone():
    """TE's FusedAdam keeps one step per param group, which megatron-core saves and loads;
    the backend's per-parameter step repair is for torch's Adam/AdamW only (here a plain SGD
    with momentum stands for any optimizer that is not torch's Adam)."""
    pytest.importorskip("megatron.core")
    from runtime.backends.megatron_train import MegatronTrainingBackend

    backend = MegatronTrainingBackend.__new__(MegatronTrainingBackend)
    adam = torch.optim.AdamW([torch.nn.Parameter(torch.randn(3))])
    other = torch.optim.SGD([torch.nn.Parameter(torch.randn(3))], lr=0.1, momentum=0.9)
    backend.optimizer = types.SimpleNamespace(chained_optimizers=[
        types.SimpleNamespace(optimizer=adam), types.SimpleNamespace(optimizer=other)])
    assert backend._torch_adams() == [adam]
    backend._fresh_adam_state()
    assert all(set(s) == {"step", "exp_avg", "exp_avg_sq"} for s in adam.state.values())
    assert not other.state  # no Adam state put into it


def _choose_on_rank(rank: int, port: int, choices, results) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=len(choices))
    try:
        model.agree_on_impl(*choices[rank])
        results[rank] = "agreed"
    except RuntimeError as error:
        results[rank] = str(error)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mixed", [False, True], ids=["same", "mixed"])
def test_ranks_that_chose_different_specs_all_fail_at_start(mixed):
    """auto decides per node: a node without TE among nodes with it stops every rank."""
    import torch.multiprocessing as mp
    from megatroncpu import free_port

    te = ("transformer_engine", "transformer_engine 2.20.2 imports")
    local = ("local", "transformer_engine does not import (ModuleNotFoundError)")
    choices = [te, te, local if mixed else te]
    results = mp.Manager().dict()
    mp.spawn(_choose_on_rank, args=(free_port(), choices, results), nprocs=3, join=True)
    if not mixed:
        assert dict(results) == {0: "agreed", 1: "agreed", 2: "agreed"}
        return
    assert len(results) == 3
    for message in results.values():
        assert message.startswith("the training ranks chose different layer specs: rank 0 "
                                  "transformer_engine (transformer_engine 2.20.2 imports), "
                                  "rank 2 local (transformer_engine does not import")
        assert 'train.transformer_impl = "local"' in message
