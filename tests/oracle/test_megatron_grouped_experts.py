"""Oracle: runtime/megatron/grouped_experts.py's GroupedMLP (torch._grouped_mm)
against megatron-core's own SequentialMLP, on the CPU (torch's grouped GEMM has a CPU path in
bf16; no GPU here), in spawned gloo worlds:

- the experts alone, on the same weights and the same routed tokens: outputs and gradients
  (tokens, routing probs, every expert weight) equal within bf16 rounding, with experts that
  get no token, with no token at all, with the probs applied on the input (top-1), and under
  expert parallelism 2 and expert tensor parallelism 2 (each rank's shards; under etp the
  ranks' partial outputs add up to the unsharded experts' output);
- the whole tiny Qwen3-MoE GPTModel built by runtime/megatron/model.py either way: the same
  parameter names (the HF mapping's, megatron_names) and sharded-state-dict keys, the same
  logits and gradients, and routing replay (R3) unchanged: a replayed route reaches the
  experts as the same tokens per expert, an unrouted expert included.

Under ep/etp 2 the token dispatch itself is not run on the CPU: the alltoall dispatcher makes
CUDA streams and the allgather one's combine reduce-scatters, which gloo lacks; the experts'
inputs and weights are the dispatcher's outputs either way.
"""

from __future__ import annotations

import os
import warnings

import pytest

pytest.importorskip("megatron.core")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from megatroncpu import TINY_MOE, free_port  # noqa: E402

TINY = TINY_MOE


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference relative to the largest value: 0 for bitwise equal; bf16 keeps 8
    bits of mantissa, so a few 2^-8 is rounding and anything near 1 is a wrong result."""
    a, b = a.detach().float(), b.detach().float()
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) if b.numel() else 0.0


BF16 = 2 ** -6  # four bf16 roundings of the largest value


def _config(arch, **overrides):
    from runtime.megatron.model import transformer_config

    return transformer_config(arch, use_cpu_initialization=True,
                              moe_token_dispatcher_type="allgather", variable_seq_lengths=False,
                              **overrides)


def _experts(config, cls, seed: int):
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.moe_utils import get_default_pg_collection

    from runtime.megatron.grouped_experts import GroupedMLP  # noqa: F401  (cls may be it)

    pg = get_default_pg_collection()
    local = config.num_moe_experts // pg.ep.size()
    torch.manual_seed(seed)
    return cls(local, config, MLPSubmodules(linear_fc1=ColumnParallelLinear,
                                            linear_fc2=RowParallelLinear), pg_collection=pg)


def _run_experts(module, hidden, counts, probs, grad_out=None):
    """Output and gradients (tokens, probs, each expert weight by name) of one pass."""
    hidden = hidden.clone().requires_grad_(True)
    probs = probs.clone().requires_grad_(True)
    module.zero_grad(set_to_none=True)
    out, bias = module(hidden, counts, probs)
    assert bias is None
    if grad_out is None:
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (out.float() * grad_out).sum().backward()
    grads = {n: p.grad for n, p in module.named_parameters()}
    return out, hidden.grad, probs.grad, grads


def _compare_experts(config, counts, seed=0, probs_on_input=False) -> dict:
    """GroupedMLP vs SequentialMLP with the same weights on the same routed tokens."""
    from megatron.core.transformer.moe.experts import SequentialMLP

    from runtime.megatron.grouped_experts import GroupedMLP

    sequential = _experts(config, SequentialMLP, seed)
    grouped = _experts(config, GroupedMLP, seed + 1)
    same_names = list(dict(grouped.named_parameters())) == list(dict(sequential.named_parameters()))
    grouped.load_state_dict(sequential.state_dict(), strict=False)
    counts = torch.tensor(counts)
    generator = torch.Generator().manual_seed(seed + 2)
    hidden = torch.randn(int(counts.sum()), config.hidden_size, generator=generator).bfloat16()
    probs = torch.rand(int(counts.sum()), generator=generator)
    want = _run_experts(sequential, hidden, counts, probs)
    got = _run_experts(grouped, hidden, counts, probs)
    gaps = {"output": _gap(got[0], want[0]), "tokens": _gap(got[1], want[1]),
            "probs": _gap(got[2], want[2])}
    gaps.update({n: _gap(got[3][n], want[3][n]) for n in want[3]})
    empty = [i for i, c in enumerate(counts.tolist()) if c == 0]
    zero = all(not got[3][f"local_experts.{i}.linear_fc{k}.weight"].any()
               for i in empty for k in (1, 2))
    return {"gaps": gaps, "empty_experts_zero_grad": zero, "same_names": same_names,
            "output": got[0].detach()}


def _single(arch) -> dict:
    """The world-1 checks."""
    from megatron.core.transformer.moe.experts import SequentialMLP
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    from runtime.megatron import shards
    from runtime.megatron.grouped_experts import GroupedMLP
    from runtime.megatron.mapping import megatron_names
    from runtime.megatron.model import build_gpt

    config = _config(arch)
    out = {"uneven": _compare_experts(config, [5, 0, 7, 0]),
           "none_routed": _compare_experts(config, [0, 0, 0, 0]),
           "many": _compare_experts(config, [40, 1, 17, 22], seed=5)}
    top1 = _config(arch, moe_router_topk=1, moe_apply_probs_on_input=True,
                   moe_router_pre_softmax=True)
    out["probs_on_input"] = _compare_experts(top1, [3, 4, 0, 6])
    # a gradient that is not contiguous (y.sum()'s expanded one) reaches the grouped backward
    grouped = _experts(config, GroupedMLP, 0)
    y, _ = grouped(torch.randn(6, 64).bfloat16().requires_grad_(), torch.tensor([2, 0, 4, 0]),
                   torch.rand(6))
    y.sum().backward()
    out["expanded_grad_ok"] = all(p.grad is not None for p in grouped.parameters())
    for item in out.values():
        if isinstance(item, dict):
            item.pop("output")

    # the whole model, built by the backend's own model.py both ways
    torch.cuda.current_device = lambda: "cpu"  # megatron's rotary embedding asks for it
    config = _config(arch, moe_enable_routing_replay=True)
    models = {}
    for kind in ("grouped", "sequential"):
        RouterReplay.clear_global_router_replay_instances()
        torch.manual_seed(0)
        models[kind] = build_gpt(arch, config, 256, experts=kind)
        models[kind].replays = list(RouterReplay.global_router_replay_instances)
    kinds = {k: sorted({type(m).__name__ for m in g.modules()
                        if isinstance(m, (SequentialMLP, GroupedMLP))}) for k, g in models.items()}
    names = {k: [n for n in g.state_dict() if not n.endswith("_extra_state")]
             for k, g in models.items()}
    sharded = {k: sorted((key, tuple(v.global_offset), tuple(v.global_shape)) for key, v in
                         g.sharded_state_dict().items() if hasattr(v, "global_offset"))
               for k, g in models.items()}
    pieces = {k: sorted(p.name for p in shards.pieces(g)) for k, g in models.items()}
    models["grouped"].load_state_dict(models["sequential"].state_dict(), strict=False)
    ids = torch.randint(0, arch.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(24).unsqueeze(0)
    # replayed routes: expert 3 never, expert 0 for every token
    routes = torch.stack([torch.zeros(24, dtype=torch.long),
                          torch.arange(24) % 3]).t().clone()
    routes[routes[:, 1] == 0, 1] = 2
    results = {}
    for kind, gpt in models.items():
        seen: list[list[int]] = []
        for module in gpt.modules():
            if isinstance(module, (SequentialMLP, GroupedMLP)):
                module.register_forward_pre_hook(
                    lambda _m, args, _seen=seen: _seen.append(torch.as_tensor(args[1]).tolist()))
        RouterReplay.global_router_replay_instances[:] = gpt.replays
        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
        natural = gpt(ids, positions, None)
        natural_counts = list(seen)
        seen.clear()
        RouterReplay.clear_global_indices()
        RouterReplay.set_replay_data([routes])
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        logits = gpt(ids, positions, None)
        logits.float().square().mean().backward()
        RouterReplay.clear_global_indices()
        RouterReplay.clear_global_router_replay_action()
        results[kind] = {"natural": natural.detach(), "logits": logits.detach(),
                         "natural_counts": natural_counts, "replayed_counts": list(seen),
                         "grads": {n: p.grad for n, p in gpt.named_parameters()}}
    g, s = results["grouped"], results["sequential"]
    out["model"] = {
        "kinds": kinds, "names_equal": names["grouped"] == names["sequential"],
        "names_are_the_mappings": names["grouped"] == megatron_names(arch),
        "sharded_equal": sharded["grouped"] == sharded["sequential"],
        "pieces_equal": pieces["grouped"] == pieces["sequential"],
        "natural_gap": _gap(g["natural"], s["natural"]),
        "natural_counts": [g["natural_counts"], s["natural_counts"]],
        "replayed_counts": [g["replayed_counts"], s["replayed_counts"]],
        "wanted_counts": torch.bincount(routes.flatten(), minlength=4).tolist(),
        "logits_gap": _gap(g["logits"], s["logits"]),
        "grad_gaps": {n: _gap(g["grads"][n], s["grads"][n]) for n in s["grads"]},
        "replay_changes_logits": _gap(s["logits"], s["natural"]),
        # which experts got a weight gradient from the replayed pass, each kind
        "experts_with_grad": {k: [e for e in range(4) if any(
            r["grads"][f"decoder.layers.1.mlp.experts.local_experts.{e}.linear_fc{i}.weight"]
            .any() for i in (1, 2))] for k, r in results.items()},
    }
    return out


def _sharded(arch, ep: int, etp: int, rank: int) -> dict:
    """Under ep or etp 2: each rank's experts, grouped vs sequential; under etp the ranks'
    partial outputs add up to the unsharded experts' output, computed here from the gathered
    shards (fc1 = [gate | up] of this rank's ffn columns, fc2 its ffn rows)."""
    from runtime.megatron.grouped_experts import GroupedMLP

    config = _config(arch, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    counts = [6, 0, 9, 3] if ep == 1 else ([6, 0] if rank == 0 else [0, 9])
    out = _compare_experts(config, counts)
    local = out.pop("output")
    grouped = _experts(config, GroupedMLP, 0)
    out["shapes"] = {n: tuple(p.shape) for n, p in grouped.named_parameters()}
    if etp > 1:
        partial = local.float()
        dist.all_reduce(partial)

        def gathered(t):
            parts = [torch.empty_like(t) for _ in range(etp)]
            dist.all_gather(parts, t.contiguous())
            return parts

        generator = torch.Generator().manual_seed(2)  # _compare_experts' tokens and probs
        hidden = torch.randn(sum(counts), config.hidden_size, generator=generator).bfloat16()
        probs = torch.rand(sum(counts), generator=generator)
        start, want = 0, []
        sequential_weights = _experts(config, _sequential(), 0)
        for e, n in enumerate(counts):
            expert = sequential_weights.local_experts[e]
            gates, ups = zip(*(w.float().chunk(2) for w in
                               gathered(expert.linear_fc1.weight.detach())), strict=True)
            down = torch.cat(gathered(expert.linear_fc2.weight.detach()), dim=1).float()
            x = hidden[start:start + n].float()
            h = torch.nn.functional.silu(x @ torch.cat(gates).t()) * (x @ torch.cat(ups).t())
            want.append((h * probs[start:start + n, None]) @ down.t())
            start += n
        out["etp_sum_gap"] = _gap(partial, torch.cat(want))
    return out


def _sequential():
    from megatron.core.transformer.moe.experts import SequentialMLP

    return SequentialMLP


def _rank(rank: int, world: int, port: int, case: str, results) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from megatron.core import parallel_state

        from vime.resolve.model import arch_from_config

        arch = arch_from_config(TINY)
        ep, etp = {"single": (1, 1), "ep2": (2, 1), "etp2": (1, 2)}[case]
        parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=ep,
                                                 expert_tensor_parallel_size=etp)
        results[rank] = _single(arch) if case == "single" else _sharded(arch, ep, etp, rank)
    except Exception as error:  # noqa: BLE001  (reported to the test, which fails on it)
        import traceback

        results[rank] = {"error": traceback.format_exc(), "repr": repr(error)}
    finally:
        dist.destroy_process_group()


def _run(case: str, world: int) -> dict:
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(world, free_port(), case, results), nprocs=world)
        results = dict(results)
    for result in results.values():
        assert "error" not in result, result["error"]
    return results


def _assert_experts_match(item: dict) -> None:
    bad = {k: v for k, v in item["gaps"].items() if v > BF16}
    assert not bad, bad
    assert item["empty_experts_zero_grad"]
    assert item["same_names"]


@pytest.fixture(scope="module")
def single():
    return _run("single", 1)[0]


@pytest.mark.parametrize("case", ["uneven", "none_routed", "many", "probs_on_input"])
def test_grouped_experts_equal_sequential_on_the_same_tokens(single, case):
    _assert_experts_match(single[case])
    assert single["expanded_grad_ok"]


def test_model_keeps_names_mapping_and_checkpoint_keys(single):
    model = single["model"]
    assert model["kinds"] == {"grouped": ["GroupedMLP"], "sequential": ["SequentialMLP"]}
    assert model["names_equal"] and model["names_are_the_mappings"]
    assert model["sharded_equal"] and model["pieces_equal"]


def test_model_logits_and_gradients_equal_sequential(single):
    model = single["model"]
    assert model["natural_gap"] <= BF16 and model["logits_gap"] <= BF16
    bad = {n: g for n, g in model["grad_gaps"].items() if g > BF16}
    assert not bad, bad
    assert model["natural_counts"][0] == model["natural_counts"][1]  # the routers agree


def test_routing_replay_reaches_the_grouped_experts_unchanged(single):
    model = single["model"]
    grouped, sequential = model["replayed_counts"]
    assert grouped == sequential == [model["wanted_counts"]]  # one MoE layer; expert 3: none
    assert model["wanted_counts"][3] == 0
    # the expert no replayed token reached has no gradient, the others have one
    assert model["experts_with_grad"] == {"grouped": [0, 1, 2], "sequential": [0, 1, 2]}
    assert model["replay_changes_logits"] > 0.01  # the replay did force other experts


def test_expert_parallel_2():
    results = _run("ep2", 2)
    for rank, result in results.items():
        _assert_experts_match(result)
        assert len(result["shapes"]) == 4, rank  # 2 local experts × fc1, fc2
        assert result["shapes"]["local_experts.0.linear_fc1.weight"] == (64, 64)


def test_expert_tensor_parallel_2():
    results = _run("etp2", 2)
    for result in results.values():
        _assert_experts_match(result)
        # fc1 holds [gate | up] of this rank's 16 of 32 columns; fc2 16 of 32 input columns
        assert result["shapes"]["local_experts.0.linear_fc1.weight"] == (32, 64)
        assert result["shapes"]["local_experts.0.linear_fc2.weight"] == (64, 16)
        assert result["etp_sum_gap"] <= BF16


def test_choice_default_override_and_fallback(monkeypatch):
    from runtime.megatron.model import EXPERTS_ENV, choose_experts
    from vime.resolve.model import arch_from_config

    arch = arch_from_config(TINY)
    bf16 = _config(arch)
    monkeypatch.delenv(EXPERTS_ENV, raising=False)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    assert choose_experts(bf16)[0] == "grouped"  # the default, where the op works (CPU here)
    assert torch.equal(torch.rand(3), expected)  # the probe leaves the global RNG alone
    monkeypatch.setenv(EXPERTS_ENV, "sequential")
    assert choose_experts(bf16)[0] == "sequential"
    monkeypatch.setenv(EXPERTS_ENV, "grouped")
    fp32 = _config(arch, bf16=False, params_dtype=torch.float32, pipeline_dtype=torch.float32)
    with pytest.raises(ValueError, match="cannot run: parameters in torch.float32"):
        choose_experts(fp32)
    monkeypatch.setenv(EXPERTS_ENV, "auto")
    kind, why = choose_experts(fp32)
    assert kind == "sequential" and "bf16" in why
    odd = _config(arch, moe_ffn_hidden_size=36)
    assert choose_experts(odd) == ("sequential", "ffn / etp = 36: the grouped GEMM needs "
                                   "multiples of 8 (16-byte strides in bf16)")
    monkeypatch.setenv(EXPERTS_ENV, "fast")
    with pytest.raises(ValueError, match="expected grouped, sequential or auto"):
        choose_experts(bf16)
