"""A torch_dist checkpoint of one layer spec read by the other (runtime/megatron/torch_dist.py),
on the CPU over gloo with megatron-core's own dist-checkpointing.

Transformer Engine does not build here, so its spec's sharded state dict is the local one's
with the two differences an H200 showed (docs/gpu-runs.md, 2026-12-01): an MoE layer's
pre-MLP norm keyed `pre_mlp_layernorm.weight` where the local spec saves
`mlp.linear_fc1.layer_norm_weight`, and `_extra_state` objects the local checkpoint lacks.
"""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("psutil")  # megatron-core's checkpoint writer starts its workers with it

import torch  # noqa: E402
from megatroncpu import TINY_MOE, single_rank_parallel_state  # noqa: E402

from runtime.megatron import torch_dist  # noqa: E402
from vime.resolve.model import arch_from_config  # noqa: E402

LOCAL_MOE_NORM = "decoder.layers.1.mlp.linear_fc1.layer_norm_weight"
TE_MOE_NORM = "decoder.layers.1.pre_mlp_layernorm.weight"


@pytest.fixture(scope="module")
def parallel_state():
    return single_rank_parallel_state()


def _model(seed: int):
    from runtime.megatron.model import build_gpt, transformer_config

    arch = arch_from_config(TINY_MOE)
    config = transformer_config(arch, use_cpu_initialization=True, bf16=False,
                                params_dtype=torch.float32, pipeline_dtype=torch.float32,
                                moe_token_dispatcher_type="allgather", variable_seq_lengths=False)
    torch.manual_seed(seed)
    gpt = build_gpt(arch, config, 64)
    with torch.no_grad():
        for p in gpt.parameters():
            p.normal_()
    return gpt


def _te_keyed(gpt) -> dict:
    """The local model's sharded state dict as the TE spec keys it."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    state = gpt.sharded_state_dict()
    norm = state["decoder.layers.1.pre_mlp_layernorm.weight"]
    assert norm.key == LOCAL_MOE_NORM  # megatron-core's local spec, as the H200 showed
    norm.key = TE_MOE_NORM
    state["decoder.layers.1.self_attention.core_attention._extra_state"] = ShardedObject(
        "decoder.layers.1.self_attention.core_attention._extra_state", None, (1,), (0,))
    return state


def _save(state, folder) -> None:
    from megatron.core import dist_checkpointing

    from runtime.megatron.convert import _cpu_checkpointing

    folder.mkdir()
    with _cpu_checkpointing():
        dist_checkpointing.save(state, str(folder))


def _load(state, folder):
    from megatron.core import dist_checkpointing

    from runtime.megatron.convert import _cpu_checkpointing

    with _cpu_checkpointing():
        return dist_checkpointing.load(state, str(folder))


def _weights(gpt) -> dict:
    return {k: v.clone() for k, v in gpt.state_dict().items() if not k.endswith("_extra_state")}


def test_a_local_checkpoint_loads_into_the_te_keys(parallel_state, tmp_path):
    source = _model(1)
    _save(source.sharded_state_dict(), tmp_path / "local")
    target = _model(2)
    state = _te_keyed(target)
    with pytest.raises(BaseException, match="pre_mlp_layernorm.weight from model not in"):
        _load(_te_keyed(_model(3)), tmp_path / "local")  # what the H200 hit
    done = torch_dist.align(state, tmp_path / "local")
    assert done == [f"{TE_MOE_NORM}: read from {LOCAL_MOE_NORM}",
                    "decoder.layers.1.self_attention.core_attention._extra_state: not in the "
                    "checkpoint, left out"]
    target.load_state_dict(_load(state, tmp_path / "local"), strict=False)
    want, got = _weights(source), _weights(target)
    assert [k for k in want if not torch.equal(want[k], got[k])] == []


def test_a_te_checkpoint_loads_into_the_local_keys(parallel_state, tmp_path):
    source = _model(4)
    _save(_te_keyed(source), tmp_path / "te")
    target = _model(5)
    state = target.sharded_state_dict()
    done = torch_dist.align(state, tmp_path / "te")
    assert done == [f"{LOCAL_MOE_NORM}: read from {TE_MOE_NORM}"]
    target.load_state_dict(_load(state, tmp_path / "te"), strict=False)
    want, got = _weights(source), _weights(target)
    assert [k for k in want if not torch.equal(want[k], got[k])] == []


def test_the_same_spec_needs_nothing(parallel_state, tmp_path):
    source = _model(6)
    _save(source.sharded_state_dict(), tmp_path / "same")
    assert torch_dist.align(_model(7).sharded_state_dict(), tmp_path / "same") == []
