"""The memory planner: the seed's own facts, and its terms against hand arithmetic."""

import pytest
from specsupport import ROOT, codes, run_spec

from vime.plan.memory import GiB, actor_shard, memory_plan, padded_vocab

SEED1 = ROOT / "specs" / "qwen3_30b.toml"
NO_CPU_ADAM = ["train.optimizer.cpu_offload=false", "train.optimizer.overlap_cpu_optimizer_d2h_h2d=false"]


def test_seed_1_needs_cpu_adam_on_one_node():
    assert run_spec(SEED1).ok
    without = run_spec(SEED1, NO_CPU_ADAM)
    assert "V801" in codes(without) and not without.ok
    v801 = next(d for d in without.diagnostics if d.code == "V801")
    assert "cpu_offload = true" in v801.help


def test_seed_2_fits_without_cpu_adam():
    result = run_spec(ROOT / "specs" / "qwen3_30b_2node.toml")
    assert result.ok and not result.spec.train.optimizer.cpu_offload
    assert result.plan.memory.train.headroom > 0.10


def test_weights_and_optimizer_match_megatrons_formula_for_the_worked_example():
    # shared/reference/megatron.md §3.5: TP4 / EP8 on 8 GPUs, distributed optimizer: 65.2 GiB
    spec = run_spec(SEED1, NO_CPU_ADAM).spec
    terms = {t.name: t.bytes for t in memory_plan(spec).train.terms}
    assert (terms["weights"] + terms["gradients"] + terms["optimizer"]) / GiB == pytest.approx(65.2, abs=0.1)


def test_actor_shard_by_hand():
    spec = run_spec(SEED1).spec
    shard = actor_shard(spec)
    h, vocab = 2048, padded_vocab(151936, 4)
    assert vocab == 152064
    attention = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 2 * 128
    assert shard.expert == 128 * 3 * 2048 * 768 * 48 / 8
    assert shard.dense == pytest.approx((attention * 48 + 2 * h * vocab) / 4 + 2 * h * 48 + h * 128 * 48 + h)


def test_kv_cache_tokens_by_hand():
    plan = memory_plan(run_spec(SEED1).spec)
    roll = plan.rollout
    assert roll.kv_bytes_per_token == 2 * 48 * 1 * 128 * 2  # 4 KV heads < TP 8: one head replicated
    assert roll.kv_tokens == int(roll.kv_cache_bytes // roll.kv_bytes_per_token)
    assert roll.sequences_at_once == roll.kv_tokens // (1024 + 8192)


def test_every_spec_shows_a_memory_breakdown(capsys):
    from vime.cli import main
    for spec in sorted((ROOT / "specs").glob("*.toml")):
        assert main(["plan", str(spec)]) == 0
        out = capsys.readouterr().out
        if "torch backends" in out:  # Megatron's and vLLM's model does not apply (issue 17)
            assert "memory (torch backends: fp32" in out and "KV cache" not in out
        else:
            assert "memory per GPU" in out and "KV cache" in out


def test_unknown_gpu_skips_memory_with_a_warning():
    result = run_spec(SEED1, ["cluster.gpu=X1"])
    assert result.ok and result.plan.memory is None and "V703" in codes(result)
