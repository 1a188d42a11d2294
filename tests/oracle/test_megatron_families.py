"""Oracle: the DeepSeek-V3 and GLM-4.5 families in megatron-core, built by the runtime's
builder (runtime/megatron/model.py: MLA, shared experts, sigmoid routing with an expert bias,
group-limited routing, scaled routing weights, QKV bias, partial rotary, q/k norms as the
config says), against transformers' model of the same config.json on the CPU in fp32:
- megatron-core's parameter count is vime's and transformers';
- transformers' weights mapped to Megatron (runtime/megatron/mapping.py) load strictly and
  come back bit for bit;
- the log-probabilities of both models agree (fp32: to 1e-5);
- R3 (routed experts only): the routes megatron-core records under sigmoid scores with an
  expert bias and group-limited routing, replayed, give the same log-probabilities; other
  routes replayed change them (the replay is used).
A spawned gloo process of one rank builds them: megatron-core's alltoall dispatcher asks for
CUDA streams, answered on the CPU there."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core")
transformers = pytest.importorskip("transformers")

from megatroncpu import gloo_ranks  # noqa: E402
from moe_families import FAMILIES  # noqa: E402

from vime.resolve.model import arch_from_config  # noqa: E402

# the fast tier's families, and those the full tier adds (one spawned build each, about 20 s)
FAST = ("deepseek_v3", "glm4_moe", "glm4_moe_air")
FULL = ("deepseek_v3_yarn", "moonlight")  # YaRN; MLA without a query latent
BUILT_ON_THE_CPU = [*FAST, *(pytest.param(name, marks=pytest.mark.slow) for name in FULL)]


def _hf_model(config: dict):
    """transformers' model of a family's config.json, its weights drawn wide enough (std 0.2)
    that the log-probabilities are far from uniform, and an expert bias that moves the
    routing (transformers initialises it to zeros)."""
    import torch

    kind = (transformers.DeepseekV3Config if config["model_type"] == "deepseek_v3"
            else transformers.Glm4MoeConfig)
    hf = kind(initializer_range=0.2,
              **{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf).eval()
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn_like(buffer) * 0.1)
    return model


def _megatron_side(rank: int, names: tuple[str, ...]) -> dict[str, dict]:
    import torch
    import transformers.models.deepseek_v3.modeling_deepseek_v3  # noqa: F401  (before cpu_streams)
    import transformers.models.glm4_moe.modeling_glm4_moe  # noqa: F401
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.router_replay import RouterReplay
    from megatroncpu import cpu_streams

    from runtime.megatron.mapping import hf_to_megatron, megatron_to_hf, unfuse_experts
    from runtime.megatron.model import build_gpt, transformer_config

    cpu_streams()
    parallel_state.initialize_model_parallel(1, 1)
    tokens = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    out = {}
    for name in names:
        arch = arch_from_config(FAMILIES[name])
        config = transformer_config(arch, bf16=False, params_dtype=torch.float32,
                                    pipeline_dtype=torch.float32, use_cpu_initialization=True,
                                    moe_enable_routing_replay=True)
        RouterReplay.clear_global_router_replay_instances()  # one per router of this model
        model = build_gpt(arch, config, 256, experts="sequential").eval()
        hf_model = _hf_model(FAMILIES[name])
        hf = unfuse_experts(hf_model.state_dict())
        model.load_state_dict(hf_to_megatron(hf, arch), strict=False)
        state = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
        missing = sorted(set(state) - set(hf_to_megatron(hf, arch)))
        back = megatron_to_hf(state, arch)
        with torch.no_grad():
            reference = torch.log_softmax(hf_model(tokens).logits, -1)
        logits, recorded = _forward(model, tokens, "record")
        replayed, _ = _forward(model, tokens, recorded)
        others = [(r + 1) % arch.num_experts for r in recorded]
        moved, _ = _forward(model, tokens, others)
        out[name] = {
            "routes": [tuple(r.shape) for r in recorded],
            "replay_gap": (replayed - logits).abs().max().item(),
            "other_routes_gap": (moved - logits).abs().max().item(),
            "params": sum(p.numel() for p in model.parameters()),
            "expert_bias": any(k.endswith("router.expert_bias") for k in state),
            "qkv_bias": any(k.endswith("linear_qkv.bias") for k in state),
            "not_mapped": missing,
            "round_trip": sorted(back) == sorted(hf) and all(
                torch.equal(back[k], hf[k]) for k in hf),
            "logprob_gap": (torch.log_softmax(logits, -1) - reference).abs().max().item(),
            "reference_spread": reference.std().item(),
        }
    return out


def _forward(model, tokens, routes):
    """Logits with the routers' own choice recorded ("record"), or with `routes` replayed
    (one [tokens, top_k] tensor per MoE layer); and the routes recorded."""
    import torch
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    RouterReplay.clear_global_indices()
    if isinstance(routes, str):
        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
    else:
        RouterReplay.set_replay_data(routes)
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        logits = model(tokens, positions, attention_mask=None)
    recorded = [r.clone() for r in RouterReplay.get_recorded_data()] if isinstance(
        routes, str) else None
    RouterReplay.clear_global_router_replay_action()
    return logits, recorded


@pytest.fixture(scope="module")
def megatron_side():
    """name -> what the spawned build measured; FAST and FULL are built once each, when a
    test first asks for one of theirs."""
    built: dict[str, dict] = {}

    class Built(dict):
        def __missing__(self, name):
            built.update(gloo_ranks(_megatron_side, 1, FAST if name in FAST else FULL)[0])
            self.update(built)
            return built[name]

    return Built()


def _transformers_count(config: dict) -> int:
    kind = (transformers.DeepseekV3Config if config["model_type"] == "deepseek_v3"
            else transformers.Glm4MoeConfig)
    hf = kind(**{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    return sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(hf).parameters())


@pytest.mark.parametrize("name", BUILT_ON_THE_CPU)
def test_megatron_core_counts_what_vime_and_transformers_count(megatron_side, name):
    arch = arch_from_config(FAMILIES[name])
    built = megatron_side[name]
    assert built["params"] == arch.params_total == _transformers_count(FAMILIES[name])
    # the expert bias is a buffer on both sides (megatron-core's router, transformers'
    # e_score_correction_bias): in the model, not among the parameters
    assert built["expert_bias"] is arch.expert_bias is True
    assert built["qkv_bias"] is arch.qkv_bias


@pytest.mark.parametrize("name", BUILT_ON_THE_CPU)
def test_mapping_loads_every_weight_and_round_trips_bit_for_bit(megatron_side, name):
    assert megatron_side[name]["not_mapped"] == []
    assert megatron_side[name]["round_trip"] is True


@pytest.mark.parametrize("name", BUILT_ON_THE_CPU)
def test_log_probs_are_transformers_own(megatron_side, name):
    built = megatron_side[name]
    assert built["reference_spread"] > 0.5  # far from a uniform distribution
    assert built["logprob_gap"] < 1e-5


@pytest.mark.parametrize("name", BUILT_ON_THE_CPU)
def test_routing_replay_of_routed_experts(megatron_side, name):
    built, arch = megatron_side[name], arch_from_config(FAMILIES[name])
    # one [tokens, top_k] route per MoE layer: the routed experts, not the shared ones
    assert built["routes"] == [(24, arch.topk)] * arch.num_moe_layers
    assert built["replay_gap"] == 0.0
    assert built["other_routes_gap"] > 0.1
