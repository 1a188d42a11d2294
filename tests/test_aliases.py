"""Did-you-mean for names from slime, Megatron-LM and vLLM: a table of known aliases
(vime/aliases.py) before edit distance, which sent them to unrelated keys."""

from __future__ import annotations

import pytest
from specsupport import ROOT, run_text

from vime import schema
from vime.aliases import ALIASES, alias

BASE = (ROOT / "specs" / "qwen3_30b.toml").read_text()


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_every_alias_points_at_a_key_of_the_schema(name):
    _, target = ALIASES[name]
    assert schema.node(tuple(target.split("."))) is not None, target


@pytest.mark.parametrize(("where", "value", "meant"), [
    ("train.tensor_model_parallel_size", "4", "train.parallel.tp"),
    ("train.parallel.expert_model_parallel_size", "8", "train.parallel.ep"),
    ("rollout.rm_type", '"dapo"', "rollout.reward"),
    ("rollout.rollout_batch_size", "32", "rollout.batch_size"),
    ("train.use_distributed_optimizer", "true", "train.optimizer.distributed"),
])
def test_a_flag_name_written_as_a_key_points_at_the_key_that_sets_it(where, value, meant):
    (diag,) = [d for d in run_text(BASE, [f"{where}={value}"]).diagnostics if d.code == "V002"]
    assert diag.help.startswith(f"did you mean {meant}? {where.rsplit('.', 1)[1]} is ")
    table, _, name = meant.rpartition(".")
    assert diag.help.endswith(f"write {name} = ... under [{table}]")


def test_flag_spellings_with_dashes_are_the_same_alias():
    assert alias("--tensor-model-parallel-size") == alias("tensor_model_parallel_size") == (
        "Megatron-LM", "train.parallel.tp")
    assert alias("tp") is None
