"""V3xx: mixture-of-experts rules for both sides, and vLLM's EPLB."""

from __future__ import annotations

from vime.check.layout import divisors
from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec
from vime.words import plural

# vllm/distributed/eplb/eplb_state.py: MAX_EXPERT_REDUNDANCY
MAX_REDUNDANT_EXPERTS = 1023


def redundant_experts_needed(num_experts: int, ep: int) -> int:
    """The fewest redundant experts that make (experts + redundant) divide over ep ranks."""
    return -num_experts % ep


@rule("V301", "ep-divides-experts", enforced_by="megatron", needs_arch=True)
def ep_divides_experts(spec: Spec):
    """Megatron's expert parallelism must divide the number of experts.

    Each EP rank holds experts ÷ ep whole experts. `validate_args` asserts "Number of
    experts should be a multiple of expert model parallel_size." and
    megatron/core/transformer/moe/moe_layer.py asserts `num_moe_experts % ep_size == 0`.
    Fix: an ep that divides the expert count (and the actor's GPUs, V202)."""
    ep, experts = spec.train.parallel.ep, spec.arch.num_experts
    if spec.arch.is_moe and experts % ep:
        fits = [d for d in divisors(experts) if d < ep and spec.train.num_gpus % d == 0]
        yield Finding("train.parallel.ep",
                      f"ep = {ep} does not divide the model's {experts} experts",
                      help=f"ep = {max(fits)}" if fits else "ep = 1")


@rule("V302", "moe-options-need-moe-model", enforced_by="megatron, vllm", needs_arch=True)
def moe_options_need_moe_model(spec: Spec):
    """Expert parallelism, routing replay or EPLB is asked of a dense model.

    These only mean something for a mixture-of-experts model. Megatron's `validate_args`
    asserts "num_experts must be non None to use expert model parallelism"; vLLM raises
    "ValueError: Number of experts in the model must be greater than 0 when expert
    parallelism is enabled." and refuses `--enable-return-routed-experts` on a non-MoE
    model (config/vllm.py `_verify_aux_output_compatibility`).
    Fix: turn the option off, or use an MoE checkpoint."""
    if spec.arch.is_moe:
        return
    name = spec.arch.model_type
    if spec.train.parallel.ep > 1:
        yield Finding("train.parallel.ep", f"ep = {spec.train.parallel.ep} but the model "
                      f"({name}) has no experts", help="set ep = 1")
    if spec.train.routing_replay:
        yield Finding("train.routing_replay", f"routing_replay needs an MoE model; {name} "
                      "has no router", help="set routing_replay = false")
    if spec.inference.expert_parallel:
        yield Finding("inference.expert_parallel", f"expert_parallel needs an MoE model; "
                      f"{name} has no experts", help="set expert_parallel = false")
    if spec.inference.eplb.enabled:
        yield Finding("inference.eplb.enabled", f"EPLB needs an MoE model; {name} has no "
                      "experts", help="set enabled = false")


@rule("V303", "vllm-experts-divide-ep", severity="warning", enforced_by="vime", needs_arch=True)
def vllm_experts_divide_ep(spec: Spec):
    """vLLM's expert-parallel group does not divide the experts evenly.

    vLLM's EP group is every GPU of the engine (EP = TP × DP). Without EPLB vLLM accepts an
    uneven split silently (fused_moe/expert_map_manager.py `determine_expert_map` gives the
    first `experts mod EP` ranks one expert more), so those GPUs carry more weights and
    more tokens and set the pace of every decoding step. With EPLB and redundant experts
    every rank holds the same number of physical experts; the smallest number of
    redundant experts is (−experts) mod EP (128 experts on 24 GPUs: 16, 144 = 6 × 24).
    Fix: enable [inference.eplb] with the suggested num_redundant_experts, or choose
    gpus_per_engine so that EP divides the experts."""
    inf = spec.inference
    ep, experts = spec.derived.vllm_ep, spec.arch.num_experts
    if spec.arch.is_moe and inf.expert_parallel and not inf.eplb.enabled and experts % ep:
        extra = redundant_experts_needed(experts, ep)
        yield Finding(
            "inference.expert_parallel",
            f"{experts} experts do not divide over vLLM's EP = {ep} GPUs: "
            f"{plural(experts % ep, 'GPU')} {'holds' if experts % ep == 1 else 'hold'} "
            f"{plural(experts // ep + 1, 'expert')}, the others {experts // ep}",
            help=f"[inference.eplb] enabled = true, num_redundant_experts = {extra} "
            f"({experts} + {extra} = {experts + extra} = {(experts + extra) // ep} × {ep})",
            related=("inference.gpus_per_engine",))


@rule("V304", "eplb-experts-divide-ep", enforced_by="vllm", needs_arch=True)
def eplb_experts_divide_ep(spec: Spec):
    """With EPLB, experts + redundant experts must divide over vLLM's EP ranks.

    vLLM's FusedMoE layer (model_executor/layers/fused_moe/layer.py) raises "ValueError:
    EPLB currently only supports even distribution of experts across ranks. Got N experts
    and E EP ranks." at model load, where N = experts + num_redundant_experts and
    E = TP × DP of the engine.
    Fix: num_redundant_experts such that N is a multiple of E (vime's help gives the
    smallest)."""
    eplb = spec.inference.eplb
    ep, experts = spec.derived.vllm_ep, spec.arch.num_experts
    if spec.arch.is_moe and eplb.enabled and spec.inference.expert_parallel and (
            (experts + eplb.num_redundant_experts) % ep):
        total = experts + eplb.num_redundant_experts
        smallest = redundant_experts_needed(experts, ep)
        yield Finding("inference.eplb.num_redundant_experts",
                      f"{experts} + {eplb.num_redundant_experts} = {total} physical experts do "
                      f"not divide over vLLM's EP = {ep} GPUs",
                      help=f"num_redundant_experts = {smallest}" + (
                          f" (or {smallest + ep})" if smallest + ep <= MAX_REDUNDANT_EXPERTS else ""),
                      related=("inference.gpus_per_engine",))


@rule("V305", "eplb-redundancy-limit", enforced_by="vllm")
def eplb_redundancy_limit(spec: Spec):
    """vLLM caps the number of redundant experts at 1023.

    vllm/distributed/eplb/eplb_state.py `add_model` asserts
    num_redundant_experts <= MAX_EXPERT_REDUNDANCY (1023).
    Fix: fewer redundant experts."""
    redundant = spec.inference.eplb.num_redundant_experts
    if redundant > MAX_REDUNDANT_EXPERTS:
        yield Finding("inference.eplb.num_redundant_experts",
                      f"num_redundant_experts = {redundant} exceeds vLLM's limit of "
                      f"{MAX_REDUNDANT_EXPERTS}", help="use fewer redundant experts")


@rule("V306", "eplb-needs-expert-parallel", enforced_by="vllm")
def eplb_needs_expert_parallel(spec: Spec):
    """EPLB balances expert-parallel ranks, so it needs expert parallelism.

    vLLM's ParallelConfig raises "ValueError: enable_expert_parallel must be True to use
    EPLB." (config/parallel.py `_validate_parallel_config`).
    Fix: inference.expert_parallel = true, or turn EPLB off."""
    if spec.inference.eplb.enabled and not spec.inference.expert_parallel:
        yield Finding("inference.eplb.enabled", "EPLB is on but expert_parallel is off",
                      help="set inference.expert_parallel = true",
                      related=("inference.expert_parallel",))


@rule("V307", "redundant-experts-need-eplb", enforced_by="vllm")
def redundant_experts_need_eplb(spec: Spec):
    """Redundant experts are only placed by EPLB.

    vLLM's ParallelConfig raises "ValueError: num_redundant_experts is set to N but EPLB
    is not enabled. Either enable EPLB or unset num_redundant_experts."
    Fix: [inference.eplb] enabled = true, or num_redundant_experts = 0."""
    eplb = spec.inference.eplb
    if eplb.num_redundant_experts and not eplb.enabled:
        yield Finding("inference.eplb.num_redundant_experts",
                      f"num_redundant_experts = {eplb.num_redundant_experts} but EPLB is off",
                      help="set [inference.eplb] enabled = true, or num_redundant_experts = 0",
                      related=("inference.eplb.enabled",))


@rule("V308", "eplb-needs-several-gpus", enforced_by="vllm")
def eplb_needs_several_gpus(spec: Spec):
    """EPLB needs an engine of more than one GPU.

    vLLM's ParallelConfig raises "ValueError: EPLB requires tensor, prefill-context, or
    data parallelism, but got TP=1, PCP=1, DP=1".
    Fix: gpus_per_engine > 1, or turn EPLB off."""
    if spec.inference.eplb.enabled and spec.inference.gpus_per_engine == 1:
        yield Finding("inference.eplb.enabled", "EPLB with engines of 1 GPU (TP = DP = 1)",
                      help="raise inference.gpus_per_engine, or turn EPLB off",
                      related=("inference.gpus_per_engine",))
