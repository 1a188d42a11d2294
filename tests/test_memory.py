"""The memory planner: the seed's own facts, and its terms against hand arithmetic."""

import pytest
from specsupport import ROOT, codes, run_spec

from vime.plan.memory import GiB, actor_shard, memory_plan, padded_vocab

SEED1 = ROOT / "specs" / "qwen3_30b.toml"
NO_CPU_ADAM = ["train.optimizer.cpu_offload=false", "train.optimizer.overlap_cpu_optimizer_d2h_h2d=false"]


def test_seed_1_without_cpu_adam_barely_fits_one_node():
    """Since the chunked loss head (issue 18) the seed's training step fits one node without
    CPU Adam, with less than 10% headroom (V801 warns); with 64k tokens per GPU it does not."""
    assert run_spec(SEED1).ok
    without = run_spec(SEED1, NO_CPU_ADAM)
    assert without.ok and 0 < without.plan.memory.train.headroom < 0.10
    v801 = next(d for d in without.diagnostics if d.code == "V801")
    assert v801.severity == "warning" and "cpu_offload = true" in v801.help
    longer = run_spec(SEED1, [*NO_CPU_ADAM, "train.max_tokens_per_gpu=65536"])
    assert "V801" in codes(longer) and not longer.ok
    v801 = next(d for d in longer.diagnostics if d.code == "V801")
    assert "cpu_offload = true" in v801.help and "max_tokens_per_gpu ≤" in v801.help


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



def test_loss_head_by_hand():
    """Issue 18: the runtime keeps no [tokens, vocab] logits; the term is one chunk's
    temporaries, the output weight's gradient and per-token hidden states, not the 16 bytes per
    token per vocabulary entry ÷ tp (11.6 GiB here) of the whole-vocabulary log-softmax."""
    spec = run_spec(SEED1).spec
    terms = {t.name: t for t in memory_plan(spec).train.terms}
    tokens, local = 20480, 152064 // 4
    rows = 2**26 // local
    assert rows == 1765
    assert terms["logits"].bytes == rows * local * 8 + 6 * local * 2048 + tokens * (6 * 2048 + 64)
    assert terms["logits"].bytes / GiB == pytest.approx(1.18, abs=0.01)
    assert tokens * local * 16 / GiB == pytest.approx(11.6, abs=0.05)  # the term before
    assert terms["logits"].note.startswith("chunk 1765 × vocab 152064 ÷ tp 4 × 8 B")
    # with top-p the chunk spans the whole vocabulary (the nucleus's cut needs every logit)
    cut = memory_plan(run_spec(SEED1, ["rollout.top_p=0.9"]).spec)
    top_p = {t.name: t for t in cut.train.terms}
    assert top_p["logits"].bytes == (110 * 152064 * 34 + 6 * local * 2048
                                     + tokens * (6 * 2048 + 64))
    greedy = run_spec(SEED1, ["rollout.top_p=0.9", "rollout.temperature=0"]).spec
    assert memory_plan(greedy).train.terms == memory_plan(spec).train.terms  # vLLM: no top-p


def test_loss_head_constants_are_the_runtimes():
    pytest.importorskip("torch")
    from runtime.core import loss_head
    from vime.plan import memory

    assert (memory.LOSS_HEAD_CHUNK_ENTRIES, memory.LOSS_HEAD_NUCLEUS_CHUNK_ENTRIES) == (
        loss_head.CHUNK_ENTRIES, loss_head.NUCLEUS_CHUNK_ENTRIES)
    assert (memory.LOSS_HEAD_CHUNK_BYTES, memory.LOSS_HEAD_NUCLEUS_CHUNK_BYTES) == (
        loss_head.CHUNK_BYTES_PER_ENTRY, loss_head.NUCLEUS_CHUNK_BYTES_PER_ENTRY)
    assert memory.LOSS_HEAD_WEIGHT_GRAD_BYTES == loss_head.WEIGHT_GRAD_BYTES
    assert loss_head.chunk_rows(152064 // 4) == 2**26 // (152064 // 4)

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
