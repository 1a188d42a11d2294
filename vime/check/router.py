"""V312: the MoE router's settings (score function, expert bias, expert groups) against what
megatron-core's TransformerConfig accepts together."""

from __future__ import annotations

from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec

# megatron/core/transformer/transformer_config.py (0.19), __post_init__: the expert bias of
# aux-loss-free routing is added to these scores only
BIAS_SCORE_FUNCTIONS = ("sigmoid", "sqrtsoftplus")


def _key(spec: Spec, name: str) -> str:
    """The key that sets a config.json value: [model.arch] where written, else the checkpoint."""
    if name in spec.model.arch:
        return f"model.arch.{name}"
    origin = spec.model_config.origin if spec.model_config else None
    return "model.preset" if origin is not None and origin.kind == "preset" \
        else "model.hf_checkpoint"


@rule("V312", "router-settings-megatron-accepts", enforced_by="megatron", needs_arch=True)
def router_settings_megatron_accepts(spec: Spec):
    """The MoE router's score function, expert bias and groups are a mix megatron-core refuses.

    The Megatron backend builds the router from config.json (runtime/megatron/model.py):
    scoring_func becomes --moe-router-score-function, topk_method "noaux_tc" (DeepSeek-V3,
    Kimi-K2, GLM-4.5) the expert bias (--moe-router-enable-expert-bias), n_group and
    topk_group --moe-router-num-groups and --moe-router-group-topk. megatron-core's
    TransformerConfig checks them when the actor is built, after the queue wait:
    "ValueError: Expert bias for aux-loss-free routing only supports 'sigmoid' and
    'sqrtsoftplus' score functions" (a softmax router with the bias: GPT-OSS users met it,
    https://github.com/NVIDIA/Megatron-LM/issues/1971), "num_moe_experts (256) should be
    divisible by moe_router_num_groups (3)" and "moe_router_group_topk (8) should be smaller
    than moe_router_num_groups (4)". transformers accepts such groups and routes tokens
    wrongly without an error (https://github.com/huggingface/transformers/issues/48647),
    and vLLM's grouped top-k fails on groups it cannot split
    (https://github.com/vllm-project/vllm/pull/29439, "selected index k out of range").
    A [model.arch] override of scoring_func, topk_method, n_group or topk_group is where
    these combinations come from; a checkpoint's own config.json is consistent.
    Fix: scoring_func = "sigmoid" with topk_method "noaux_tc" (or another topk_method
    without the bias); n_group a divisor of the routed experts, and topk_group at most
    n_group (the checkpoint's config.json values)."""
    arch = spec.arch
    if not arch.is_moe:
        return
    if arch.expert_bias and arch.score_function not in BIAS_SCORE_FUNCTIONS:
        yield Finding(_key(spec, "scoring_func"),
                      f"scoring_func = {arch.score_function!r} with topk_method \"noaux_tc\"'s "
                      "expert bias: megatron-core adds the bias to sigmoid or sqrtsoftplus "
                      "scores only, and refuses the actor at start",
                      help='scoring_func = "sigmoid" (DeepSeek-V3 and GLM-4.5 route by it)',
                      related=("model.arch.topk_method",))
    if arch.num_groups > 1:
        if arch.num_experts % arch.num_groups:
            fits = [g for g in range(arch.num_groups, 0, -1) if arch.num_experts % g == 0]
            yield Finding(_key(spec, "n_group"),
                          f"n_group = {arch.num_groups} groups cannot split the "
                          f"{arch.num_experts} routed experts evenly: megatron-core refuses it "
                          "(num_moe_experts should be divisible by moe_router_num_groups)",
                          help=f"n_group = {fits[0]}", related=("model.arch.n_routed_experts",))
        elif arch.group_topk > arch.num_groups:
            yield Finding(_key(spec, "topk_group"),
                          f"topk_group = {arch.group_topk} groups of n_group = "
                          f"{arch.num_groups}: megatron-core refuses a token's groups outnumbering "
                          "the groups", help=f"topk_group = {arch.num_groups} or fewer",
                          related=("model.arch.n_group",))
