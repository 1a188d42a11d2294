"""The memory planner: the seed's own facts, and its terms against hand arithmetic."""

import pytest
from specsupport import ROOT, codes, run_spec

from vime.plan.memory import GiB, actor_shard, memory_plan, padded_vocab

SEED1 = ROOT / "specs" / "qwen3_30b.toml"
NO_CPU_ADAM = ["train.optimizer.cpu_offload=false", "train.optimizer.overlap_cpu_optimizer_d2h_h2d=false"]


def test_seed_1_needs_cpu_adam_on_one_node():
    """Without CPU Adam the seed does not fit one node of H100s. With the chunked loss head
    its backward does, with under 10% headroom; but without Transformer Engine or
    Apex megatron-core steps with torch's foreach AdamW, whose transient of 4 bytes per
    parameter of the expert shard (3.62 B parameters at edp 1: 13.5 GiB) comes on top of the
    static 65.2 GiB once the backward has freed its 3.4 GiB. The help moves the optimizer and
    that transient to the host, and suggests no smaller max_tokens_per_gpu (the step is the
    peak: fewer tokens would not lower it)."""
    assert run_spec(SEED1).ok
    without = run_spec(SEED1, NO_CPU_ADAM)
    assert not without.ok and "V801" in codes(without)
    terms = {t.name: t.bytes for t in memory_plan(without.spec).train.terms}
    expert_shard = 128 * 3 * 2048 * 768 * 48 / 8
    backward = sum(terms[n] for n in ("activations", "uneven routing", "expert stacks", "logits"))
    assert terms["optimizer step"] == pytest.approx(4 * expert_shard - backward)
    v801 = next(d for d in without.diagnostics if d.code == "V801")
    moved = (terms["optimizer"] + terms["optimizer step"]) / GiB
    assert f"cpu_offload = true (with precision_aware and distributed) moves {moved:.1f} GiB" in v801.help
    assert "max_tokens_per_gpu ≤" not in v801.help and 'recompute = "full"' not in v801.help


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
    """The runtime keeps no [tokens, vocab] logits; the term is one chunk's
    temporaries, the output weight's gradient and per-token hidden states, not the 16 bytes per
    token per vocabulary entry ÷ tp (11.6 GiB here) of the whole-vocabulary log-softmax."""
    spec = run_spec(SEED1).spec
    terms = {t.name: t for t in memory_plan(spec).train.terms}
    tokens, local = 20480, 152064 // 4
    rows = 2**26 // local
    assert rows == 1765
    # without top-p the backward goes by vocabulary columns: a bf16 weight gradient, and the
    # hidden states' gradient summed in fp32 (6 more bytes per hidden entry)
    assert terms["logits"].bytes == (rows * local * 8 + 2 * local * 2048
                                     + tokens * ((6 + 6) * 2048 + 64))
    assert terms["logits"].bytes / GiB == pytest.approx(1.11, abs=0.01)
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
    assert memory.LOSS_HEAD_PLAIN_WEIGHT_GRAD_BYTES == loss_head.PLAIN_WEIGHT_GRAD_BYTES
    assert memory.LOSS_HEAD_PLAIN_HIDDEN_GRAD_BYTES == loss_head.PLAIN_HIDDEN_GRAD_BYTES
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
        if "torch backends" in out:  # Megatron's and vLLM's model does not apply
            assert "memory (torch backends: fp32" in out and "KV cache" not in out
        else:
            assert "memory per GPU" in out and "KV cache" in out


def test_unknown_gpu_skips_memory_with_a_warning():
    result = run_spec(SEED1, ["cluster.gpu=X1"])
    assert result.ok and result.plan.memory is None and "V703" in codes(result)


# -- the terms with a recorded measurement --------------------------------------------------

# one H200, tp = ep = 1, as benchmarks/memory_validation.py plans the measured cases
ONE_H200 = ["cluster.nodes=1", "cluster.gpus_per_node=1", "cluster.gpu=H200",
            "train.parallel.tp=1", "train.parallel.ep=1", "train.parallel.sequence_parallel=false",
            *NO_CPU_ADAM, "train.optimizer.precision_aware=false", "inference.gpus_per_engine=1",
            "inference.expert_parallel=false", "train.routing_replay=false",
            "model.arch.num_hidden_layers=2", 'train.recompute="none"', "rollout.batch_size=1",
            "rollout.n_samples_per_prompt=1", "train.global_batch_size=1"]
TWO_H200 = [*ONE_H200, "cluster.gpus_per_node=2", "rollout.batch_size=2",
            "train.global_batch_size=2"]
SEQUENTIAL = 'cluster.env.VIME_MOE_EXPERTS="sequential"'


def _train(sets):
    result = run_spec(SEED1, sets)
    return result, {t.name: t for t in memory_plan(result.spec).train.terms}


def test_adam_step_transient_one_optimizer_and_chained():
    """torch's foreach AdamW (megatron-core's fallback without TE or Apex) holds 4 bytes per
    parameter of a param group for the step (4.00 measured on an H200); the step comes after
    the backward, so only what it needs beyond the backward's working set is added. One
    optimizer at ep 1; with ep 2 the dense and expert optimizers step one after the other."""
    result, terms = _train([*ONE_H200, "train.max_tokens_per_gpu=2048", SEQUENTIAL])
    shard = actor_shard(result.spec)
    backward = sum(terms[n].bytes for n in ("activations", "logits"))
    assert terms["optimizer step"].bytes == pytest.approx(4 * shard.total - backward)
    assert terms["optimizer step"].basis.kind == "gpu"
    # with many tokens the backward is the peak: the step adds nothing
    _, terms = _train([*ONE_H200, "train.max_tokens_per_gpu=65536", SEQUENTIAL])
    assert terms["optimizer step"].bytes == 0
    result, terms = _train([*TWO_H200, "train.parallel.ep=2", "train.max_tokens_per_gpu=1024",
                            "model.arch.num_hidden_layers=4", SEQUENTIAL])
    shard, dp = actor_shard(result.spec), result.spec.derived.dp
    assert (dp, result.spec.derived.edp) == (2, 1)
    step = 4 * max(shard.dense / dp, shard.expert)
    backward = sum(terms[n].bytes for n in ("activations", "uneven routing", "logits"))
    assert terms["optimizer step"].bytes == pytest.approx(step - backward)
    assert terms["optimizer step"].basis.kind == "estimate"  # the chained split: code only
    _, terms = _train([*ONE_H200, "train.optimizer.cpu_offload=true",
                       "train.optimizer.overlap_cpu_optimizer_d2h_h2d=true"])
    assert terms["optimizer step"].bytes == 0  # CPU Adam steps on the host


@pytest.mark.parametrize("impl", ["auto", "local", "transformer_engine"])
def test_only_the_te_layer_spec_drops_the_foreach_adamw_transient(impl):
    """transformer_impl = "transformer_engine" puts TE on every node, so megatron-core steps
    with TE's FusedAdam, which updates in place; auto and local may run where TE is not and
    keep torch's foreach AdamW transient. Nothing else changes but the fragmentation allowance,
    a share of what is allocated."""
    sets = [*ONE_H200, "train.max_tokens_per_gpu=2048", SEQUENTIAL]
    _, auto = _train(sets)
    assert auto["optimizer step"].bytes > 0
    _, terms = _train([*sets, f'train.transformer_impl="{impl}"'])
    te = impl == "transformer_engine"
    assert terms.keys() == auto.keys()
    changed = [n for n in terms if terms[n] != auto[n]]
    assert changed == (["optimizer step", "allowance"] if te else [])
    step = terms["optimizer step"]
    assert (step.bytes == 0) == te and ("FusedAdam" in step.note) == te
    assert ("FusedAdam" in step.basis.evidence) == te and step.basis.kind == (
        "estimate" if te else "gpu")


def test_etp_processes_the_rows_of_its_group():
    """With etp = 2 every rank processes all T·K routed rows, not T/tp: the dispatcher gathers
    the etp group's rows, each at ffn ÷ etp (docs/memory-validation.md)."""
    base = [*TWO_H200, "train.parallel.tp=2", "train.parallel.sequence_parallel=true",
            "train.max_tokens_per_gpu=4096", SEQUENTIAL]
    _, one = _train([*base, "train.parallel.etp=1", "train.parallel.ep=2"])
    _, two = _train([*base, "train.parallel.etp=2", "train.parallel.ep=1"])
    h, f, k, tokens, layers = 2048, 768, 8, 4096, 2
    row = lambda ffn: 2 * h + 12 * ffn + 24  # noqa: E731
    # per token and layer: T/tp × K rows at ffn against T/tp × K × 2 rows at ffn ÷ 2
    difference = tokens * layers * (k / 2) * (2 * row(f / 2) - row(f))
    assert two["activations"].bytes - one["activations"].bytes == pytest.approx(difference)


def test_uneven_routing_is_a_margin_the_spec_tunes():
    """ep > 1: the busiest rank's routed rows are train.routing_imbalance (default 1.8, issue
    18's measurement at ep 2) times the mean; the margin is a line of its own, capped at
    min(ep, experts ÷ top-k); none without expert parallelism or at 1."""
    base = [*TWO_H200, "train.max_tokens_per_gpu=4096", SEQUENTIAL]
    _, no_ep = _train(base)
    assert "uneven routing" not in no_ep
    result, terms = _train([*base, "train.parallel.ep=2"])
    assert result.spec.train.routing_imbalance == 1.8
    routed = 4096 * 2 * 8 * (2 * 2048 + 12 * 768 + 24)  # tokens × layers × K × bytes per row
    assert terms["uneven routing"].bytes == pytest.approx(0.8 * routed)
    assert terms["uneven routing"].note.startswith("busiest EP rank routes 1.8× the mean rows")
    _, terms = _train([*base, "train.parallel.ep=2", "train.routing_imbalance=1.25"])
    assert terms["uneven routing"].bytes == pytest.approx(0.25 * routed)
    _, terms = _train([*base, "train.parallel.ep=2", "train.routing_imbalance=1"])
    assert "uneven routing" not in terms
    _, terms = _train([*base, "train.parallel.ep=2", "train.routing_imbalance=50"])
    assert terms["uneven routing"].bytes == pytest.approx(1.0 * routed)  # capped at ep = 2
    assert codes(run_spec(SEED1, ["train.routing_imbalance=0.5"])) == {"V003"}  # below 1


def test_memory_outside_torch_from_the_measurements():
    """2.06 GiB outside torch's allocator on one H200 with vime's backend; up to
    2.0 GiB more for NCCL on two (3.8-4.4 against 2.4 in a stand-in loop). Beyond two GPUs it
    is an estimate. The offloaded actor keeps the same while the engines generate."""
    for sets, gib, kind in ((ONE_H200, 2.06, "gpu"), (TWO_H200, 4.06, "gpu"), ([], 4.06, "estimate")):
        plan = memory_plan(run_spec(SEED1, sets).spec)
        allowance = next(t for t in plan.train.terms if t.name == "allowance")
        outside, fragmentation = allowance.parts
        assert outside.name == "outside torch" and outside.bytes / GiB == pytest.approx(gib)
        assert outside.basis.kind == kind and fragmentation.basis.kind == "gpu"
        assert allowance.bytes == outside.bytes + fragmentation.bytes
        offloaded = next(t for t in plan.rollout.phase.terms if t.name == "offloaded actor")
        assert offloaded.bytes == outside.bytes


def test_expert_path_follows_the_runtime():
    """The grouped experts by default (their stacks charged), SequentialMLP where [cluster.env]
    asks for it or the widths do not suit the grouped GEMM (runtime/megatron/model.py)."""
    result, terms = _train([*ONE_H200, "train.max_tokens_per_gpu=4096"])
    assert terms["expert stacks"].bytes == 2 * 128 * (2 * 768) * 2048
    assert terms["activations"].basis.kind == "cpu"  # estimate, CPU-measured, GPU pending
    _, sequential = _train([*ONE_H200, "train.max_tokens_per_gpu=4096", SEQUENTIAL])
    assert "expert stacks" not in sequential and sequential["activations"].basis.kind == "gpu"
    assert sequential["activations"].bytes == terms["activations"].bytes  # same saved tensors
    _, odd = _train([*ONE_H200, "model.arch.moe_intermediate_size=36"])
    assert "expert stacks" not in odd and "sequential experts" in odd["activations"].note
    _, seed = _train([])
    assert seed["activations"].basis.kind == "estimate"  # tp 4, ep 8: not measured there


def test_every_term_says_what_it_was_checked_against(capsys):
    """Each line of the breakdown has a basis (a GPU measurement, the CPU
    only, or the model's estimate) in plan --json, with its evidence and sources, and a mark
    in the text; each phase's peak is split by basis."""
    import json

    from vime.cli import main
    from vime.plan.evidence import KINDS, LEGEND, MARKS

    assert main(["plan", str(SEED1), "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    for phase in ("train", "rollout", "host"):
        for term in memory["breakdown"][phase]:
            basis = term["basis"]
            assert basis["kind"] in KINDS and basis["evidence"], term
            assert all(isinstance(s, str) for s in basis["sources"])
            assert {"name", "gib", "note"} <= set(term)  # the keys of before stay
    for phase in ("train", "rollout"):
        split = memory["peak_by_basis_gib"][phase]
        assert set(split) == set(KINDS)
        assert sum(split.values()) == pytest.approx(memory[f"{phase}_peak_gib"], abs=0.03)
    allowance = next(t for t in memory["breakdown"]["train"] if t["name"] == "allowance")
    assert [p["name"] for p in allowance["parts"]] == ["outside torch", "fragmentation"]

    assert main(["plan", str(SEED1)]) == 0
    text = capsys.readouterr().out.split("memory per GPU")[1]
    assert all(LEGEND[k] in text for k in KINDS)
    terms = [t for p in ("train", "rollout") for t in memory["breakdown"][p]]
    marked = [line for line in text.splitlines()
              if line.startswith("    ") and line[4:22].strip() in {t["name"] for t in terms}]
    assert len(marked) == len(terms)
    for line, term in zip(marked, terms, strict=True):
        assert line[30] == MARKS[term["basis"]["kind"]], line
    assert "the peak by basis: ● " in text


def _planned(tmp_path, name: str, *sets):
    import shutil

    shutil.copy(ROOT / "tests" / "fixtures" / "configs" / f"{name}.json", tmp_path / "config.json")
    return run_spec(SEED1, [f'model.hf_checkpoint="{tmp_path}"', "rollout.max_response_len=4096",
                            *sets]).spec


def test_mla_kv_cache_is_one_latent_per_layer_on_every_tp_rank(tmp_path):
    # vLLM's MLA caches kv_lora_rank + qk_rope_head_dim = 576 values per layer and token, the
    # same on every TP rank: DeepSeek-V3 70,272 bytes, against 2 × 128 heads × 192 × 2 × 61
    # = 5.7 MiB per token for its 128 attention heads uncompressed
    for tp_sets in ([], ["inference.data_parallel_size=8"]):
        spec = _planned(tmp_path, "deepseek_v3", *tp_sets)
        assert memory_plan(spec).rollout.kv_bytes_per_token == 61 * (512 + 64) * 2
    moonlight = _planned(tmp_path, "moonlight_16b_a3b")
    assert memory_plan(moonlight).rollout.kv_bytes_per_token == 27 * 576 * 2


def test_glm_kv_cache_is_grouped_query_attention(tmp_path):
    spec = _planned(tmp_path, "glm_4_5_air")  # 8 KV heads over TP 8: one each
    assert memory_plan(spec).rollout.kv_bytes_per_token == 2 * 46 * 1 * 128 * 2


def test_shared_experts_and_mla_down_projections_in_the_actor_shard(tmp_path):
    spec = _planned(tmp_path, "moonlight_16b_a3b")  # tp 4, ep 8 on 8 GPUs
    arch, shard = spec.arch, actor_shard(spec)
    h, vocab = 2048, padded_vocab(163840, 4)
    down = h * (512 + 64) + 512  # kv_a_proj_with_mqa and its norm: whole on every tp rank
    up = h * 16 * 192 + 512 * 16 * (128 + 128) + 16 * 128 * h  # q_proj, kv_b_proj, o_proj
    assert (arch.attention_replicated_params, arch.attention_params) == (down, down + up)
    shared = 3 * h * 2 * 1408
    sharded = (up * 27 + 3 * h * 11264 * 1 + shared * 26 + 2 * h * vocab) / 4
    replicated = 2 * h * 27 + h * 64 * 26 + down * 27 + h
    assert shard.dense == pytest.approx(sharded + replicated)
    assert shard.expert == 64 * 3 * h * 1408 * 26 / 8
