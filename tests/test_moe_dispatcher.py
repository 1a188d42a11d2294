"""train.moe_token_dispatcher and moe_flex_backend: what `vime import` makes of upstream's
dispatcher flags, and what the imported spec plans to (the rules V309-V311, megatron.args)."""

from __future__ import annotations

from specsupport import ROOT, run_text

from vime.emit.megatron import megatron_args
from vime.importer import import_argv

SEED = (ROOT / "specs" / "qwen3_30b.toml").read_text()


def _said(result, flag: str) -> list[tuple[str, str]]:
    return [(f.code, f.severity) for f in result.findings if f.message.startswith(flag)]


def test_flex_with_deepep_becomes_the_flex_dispatcher_with_the_deepep_backend():
    """`--moe-token-dispatcher-type flex --moe-enable-deepep` (THUDM/slime
    scripts/run-deepseek-r1.sh and run-kimi-k2-Instruct.sh at 624b824a, in MISC_ARGS or
    PERF_ARGS); `--moe-flex-dispatcher-backend deepep`, megatron-core 0.19's spelling."""
    for argv in (["--moe-token-dispatcher-type", "flex", "--moe-enable-deepep"],
                 ["--moe-enable-deepep", "--moe-token-dispatcher-type", "flex"],
                 ["--moe-flex-dispatcher-backend", "deepep", "--moe-token-dispatcher-type",
                  "flex"]):
        result = import_argv(argv)
        assert result.values["train.moe_token_dispatcher"] == "flex", argv
        assert result.values["train.moe_flex_backend"] == "deepep", argv
        assert not [f for f in result.findings if "moe" in f.message], result.findings
    hybrid = import_argv(["--moe-token-dispatcher-type", "flex",
                          "--moe-flex-dispatcher-backend", "hybridep"])
    assert hybrid.values["train.moe_flex_backend"] == "hybridep"
    assert import_argv(["--moe-token-dispatcher-type", "alltoall"]).values[
        "train.moe_token_dispatcher"] == "alltoall"


def test_deepep_without_flex_is_the_error_megatron_would_stop_with():
    result = import_argv(["--moe-enable-deepep"])
    assert _said(result, "--moe-enable-deepep") == [("V963", "error")]
    assert "DeepEP backend is only supported with flex token dispatcher." in \
        result.findings[0].message
    assert "train.moe_flex_backend" not in result.values
    quiet = import_argv(["--moe-token-dispatcher-type", "alltoall",
                         "--moe-flex-dispatcher-backend", "hybridep"])
    assert _said(quiet, "--moe-flex-dispatcher-backend") == [("V965", "note")]


def test_allgather_becomes_alltoall_and_ncclep_has_no_equivalent():
    allgather = import_argv(["--moe-token-dispatcher-type", "allgather"])
    assert allgather.values["train.moe_token_dispatcher"] == "alltoall"
    assert _said(allgather, "--moe-token-dispatcher-type") == [("V965", "note")]
    ncclep = import_argv(["--moe-token-dispatcher-type", "flex",
                          "--moe-flex-dispatcher-backend", "ncclep"])
    assert _said(ncclep, "--moe-flex-dispatcher-backend") == [("V963", "error")]
    sms = import_argv(["--moe-deepep-num-sms", "24"])
    assert _said(sms, "--moe-deepep-num-sms") == [("V963", "warning")]


def test_the_flex_dispatcher_plans_to_megatrons_flags_and_its_rules():
    flex = run_text(SEED, ['train.moe_token_dispatcher="flex"'])
    assert flex.ok and flex.plan is not None
    args = [group for group in megatron_args(flex.plan) if "dispatcher" in group[0]]
    assert args == [["--moe-token-dispatcher-type", "flex"],
                    ["--moe-flex-dispatcher-backend", "deepep"]]
    plain = run_text(SEED)
    assert [g for g in megatron_args(plain.plan) if "dispatcher" in g[0]] == [
        ["--moe-token-dispatcher-type", "alltoall"]]
    one_rank = run_text(SEED, ['train.moe_token_dispatcher="flex"', "train.parallel.ep=1"])
    [v309] = [d for d in one_rank.diagnostics if d.code == "V309"]
    assert "DeepEP dispatcher requires TPxEP > 1" in v309.message
    dense = run_text(SEED, ['model.preset="qwen3-8b"', 'train.moe_token_dispatcher="flex"',
                            "train.parallel.ep=1", "inference.expert_parallel=false",
                            "train.routing_replay=false"])
    assert "has no experts" in [d for d in dense.diagnostics if d.code == "V309"][0].message


def test_vime_plan_says_how_the_moe_layers_dispatch(capsys):
    from vime.cli import main

    seed = str(ROOT / "specs" / "qwen3_30b.toml")
    main(["plan", seed])
    assert "  MoE dispatch: alltoall (NCCL all-to-all over ep 8)\n" in capsys.readouterr().out
    main(["plan", seed, "--set", 'train.moe_token_dispatcher="flex"'])
    assert ("  MoE dispatch: flex, deepep over etp × ep = 8 ranks (deep_ep on every training "
            "node)\n") in capsys.readouterr().out
    main(["plan", str(ROOT / "specs" / "qwen3_30b.toml"), "--set", 'model.preset="qwen3-8b"',
          "--set", "train.parallel.ep=1", "--set", "inference.expert_parallel=false",
          "--set", "train.routing_replay=false"])
    assert "MoE dispatch" not in capsys.readouterr().out
