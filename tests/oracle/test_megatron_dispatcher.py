"""Oracle: train.moe_token_dispatcher's megatron.args pass Megatron-LM's parse_args,
validate_args and TransformerConfig (test_megatron_args.py's megatron_parse), and the
TransformerConfig the Megatron backend builds for each dispatcher is one megatron-core accepts."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.training.arguments")

from test_megatron_args import SEED, argv_of, megatron_parse, plan  # noqa: E402

from runtime.megatron.model import transformer_config  # noqa: E402


@pytest.mark.parametrize("sets, dispatcher, backend", [
    ([], "alltoall", None),
    (['train.moe_token_dispatcher="flex"'], "flex", "deepep"),
    (['train.moe_token_dispatcher="flex"', 'train.moe_flex_backend="hybridep"'], "flex",
     "hybridep"),
])
def test_the_dispatcher_reaches_megatrons_arguments(sets, dispatcher, backend):
    result = plan(SEED, sets)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics]
    argv = argv_of(result)
    args = megatron_parse(argv, result.spec.train.num_gpus)
    assert args.moe_token_dispatcher_type == dispatcher
    assert ("--moe-flex-dispatcher-backend" in argv) == (backend is not None)
    if backend is not None:
        assert args.moe_flex_dispatcher_backend == backend


@pytest.mark.parametrize("settings", [
    {"moe_token_dispatcher_type": "alltoall"},
    {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep"},
    {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep",
     "moe_hybridep_pad_uneven_dispatch_inputs": True},
])
def test_the_backends_transformer_config_takes_each_dispatcher(settings):
    """What runtime/megatron/model.py's choose_dispatcher returns, with the variable sequence
    lengths vime trains with (megatron-core refuses allgather there)."""
    result = plan(SEED, [])
    config = transformer_config(result.spec.arch, expert_model_parallel_size=8, **settings)
    assert config.variable_seq_lengths
    assert config.moe_token_dispatcher_type == settings["moe_token_dispatcher_type"]
    with pytest.raises(ValueError, match="allgather does not support variable sequence"):
        transformer_config(result.spec.arch, moe_token_dispatcher_type="allgather")
