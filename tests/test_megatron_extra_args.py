"""train.extra_args: raw Megatron-LM flags after vime's own in megatron.args, judged against
Megatron-LM's flag catalog (V540 unknown, V542 value) and the flags vime sets (V541), shown
in `vime plan`. tests/oracle/test_megatron_args.py parses them with Megatron's own parser."""

from __future__ import annotations

import pytest
from specsupport import ROOT, codes, run_spec

from vime.emit.megatron import megatron_args
from vime.render import plan_text

SPEC = ROOT / "specs" / "qwen3_30b.toml"


def _run(*extra: str):
    listed = ", ".join(f'"{e}"' for e in extra)
    return run_spec(SPEC, [f"train.extra_args=[{listed}]"])


def test_extra_flags_come_after_vimes_own_with_their_values():
    result = _run("--recompute-modules", "core_attn", "mlp", "--no-gradient-accumulation-fusion",
                  "--attention-dropout=0.0")
    assert result.ok and not codes(result) & {"V540", "V541", "V542"}
    args = megatron_args(result.plan)
    assert args[-3:] == [["--recompute-modules", "core_attn", "mlp"],
                         ["--no-gradient-accumulation-fusion"], ["--attention-dropout=0.0"]]
    assert "extra Megatron flags: --recompute-modules core_attn mlp" in plan_text(result.plan)


def test_without_extra_args_megatron_args_are_vimes_alone():
    result = run_spec(SPEC)
    assert "extra Megatron flags" not in plan_text(result.plan)


@pytest.mark.parametrize(("extra", "says"), [
    (["--lr-decay-sytle=cosine"], "did you mean --lr-decay-style?"),
    (["--recompute_activations"], "did you mean --recompute-activations?"),
    (["core_attn"], "start train.extra_args with a flag"),
])
def test_a_flag_megatron_does_not_have(extra, says):
    (diag,) = [d for d in _run(*extra).diagnostics if d.code == "V540"]
    assert diag.key == "train.extra_args[0]" and says in diag.help


@pytest.mark.parametrize(("extra", "key"), [
    (["--lr=1e-5"], "train.optimizer.lr"),
    (["--tensor-model-parallel-size", "2"], "train.parallel.tp"),
    (["--sequence-parallel"], "train.parallel.sequence_parallel"),
    (["--no-rope-fusion", "--num-layers=4"], "[model.arch]"),
    (["--moe-token-dispatcher-type=flex"], "train.moe_token_dispatcher"),
])
def test_a_flag_vime_sets_names_the_key(extra, key):
    result = _run(*extra)
    (diag,) = [d for d in result.diagnostics if d.code == "V541"]
    assert key in diag.help and not result.ok


@pytest.mark.parametrize(("extra", "says"), [
    (["--attention-dropout=fast"], "not a number"),
    (["--no-gradient-accumulation-fusion=1"], "takes no value"),
    (["--attention-dropout"], "needs a value"),
    (["--attention-dropout", "0.1", "0.2"], "takes one value"),
    (["--moe-router-load-balancing-type=sometimes"], "not one of"),
])
def test_a_value_megatrons_parser_refuses(extra, says):
    (diag,) = [d for d in _run(*extra).diagnostics if d.code == "V542"]
    assert says in diag.message


def test_yarn_flags_name_model_arch():
    (diag,) = [d for d in _run("--yarn-beta-fast=4").diagnostics if d.code == "V541"]
    assert "[model.arch]" in diag.help
