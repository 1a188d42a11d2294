"""V125: a context longer than a YaRN-scaled rotary embedding reaches."""

from __future__ import annotations

from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec


@rule("V125", "context-within-scaled-rotary", enforced_by="vime", needs_arch=True)
def context_within_scaled_rotary(spec: Spec):
    """The engines' context passes the positions a YaRN-scaled rotary embedding covers.

    YaRN stretches the rotary embedding of a model pretrained on
    original_max_position_embeddings positions to original × factor (DeepSeek-V3:
    4096 × 40 = 163840); megatron-core's YarnRotaryEmbedding and vLLM's rotary compute
    frequencies for any position, so neither refuses a longer context, and the positions
    past original × factor are ones the scaling was never fitted to. V506 bounds the
    context by max_position_embeddings, which [model.arch] may raise above the scaled
    length.
    Fix: max_prompt_len and max_response_len whose sum fits original × factor (the help line
    gives the response length), or a larger rope_scaling factor in the checkpoint."""
    yarn = spec.arch.rope_scaling
    if yarn is None:
        return
    covered, needed = yarn.max_positions, spec.max_model_len
    if needed <= covered:
        return
    yield Finding("rollout.max_response_len",
                  f"the engines' context of {needed} tokens passes the {covered} positions "
                  f"the YaRN rotary scaling covers (original_max_position_embeddings "
                  f"{yarn.original_max_position_embeddings} × factor {yarn.factor:g})",
                  help=f"rollout.max_response_len = {max(covered - spec.rollout.max_prompt_len, 1)}",
                  related=("rollout.max_prompt_len", "model.hf_checkpoint"))
