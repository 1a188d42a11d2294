"""V123: a context that [model.arch] max_position_embeddings stretches beyond what the
checkpoint's own config.json says its positions were trained for."""

from __future__ import annotations

from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec

KEY = "model.arch.max_position_embeddings"


def _allows_long(spec: Spec) -> bool:
    """vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN as vllm/envs.py reads it, from [cluster.env]."""
    return spec.cluster.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower() in (
        "1", "true")


def _scaled(config: dict) -> bool:
    """Whether config.json scales its rotary embedding (YaRN and the like), which lets vLLM
    derive a longer context than max_position_embeddings."""
    scaling = config.get("rope_scaling") or (config.get("rope_parameters") or {})
    kind = scaling.get("rope_type") or scaling.get("type") if isinstance(scaling, dict) else None
    return kind not in (None, "default")


@rule("V123", "context-beyond-checkpoint-positions", enforced_by="vllm", needs_arch=True)
def context_beyond_checkpoint_positions(spec: Spec):
    """[model.arch] max_position_embeddings lets the run's context pass the positions the
    checkpoint's config.json gives.

    V506 measures the context (max_prompt_len plus the longest response) against
    max_position_embeddings as the spec resolves it, [model.arch] included; vLLM reads the
    checkpoint's config.json instead and stops the engine at start, after the queue wait:
    "ValueError: User-specified max_model_len (65536) is greater than the derived
    max_model_len (max_position_embeddings=40960 or model_max_length=None in model's
    config.json). To allow overriding this maximum, set the env var
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1." (vllm/config/model.py; reported for instance in
    https://github.com/vllm-project/vllm/issues/3676). With that variable in [cluster.env]
    the engine starts, and samples at positions the rotary embedding was never trained on:
    "positions exceeding derived_max_model_len lead to nan"
    (https://github.com/vllm-project/vllm/pull/20904), and the run learns from those
    samples. A config.json with rope_scaling (YaRN) derives its own longer context and is
    not checked here (V102 judges it).
    Fix: max_prompt_len and max_response_len whose sum fits the checkpoint's
    max_position_embeddings (the help line gives the response length), or a checkpoint
    whose config.json gives the longer context."""
    config = spec.model_config
    if KEY.rsplit(".", 1)[1] not in spec.model.arch or config is None \
            or config.origin.kind != "config.json" or _scaled(config.values):
        return
    trained = config.values.get("max_position_embeddings")
    if not isinstance(trained, int) or isinstance(trained, bool):
        return
    needed = spec.max_model_len
    if needed <= trained or needed > spec.arch.max_position_embeddings:  # the latter is V506's
        return
    where = config.origin.describe()
    fits = max(trained - spec.rollout.max_prompt_len, 1)
    if _allows_long(spec):
        yield Finding(KEY, f"the engines' context of {needed} tokens passes the {trained} "
                      f"positions of {where}; VLLM_ALLOW_LONG_MAX_MODEL_LEN lets vLLM start, "
                      "and samples past position "
                      f"{trained} come from positions the model was not trained on",
                      help=f"rollout.max_response_len = {fits}",
                      related=("rollout.max_response_len", "cluster.env"), severity="warning")
    elif spec.inference.backend == "vllm":
        yield Finding(KEY, f"model.arch.max_position_embeddings = "
                      f"{spec.arch.max_position_embeddings} lets the context reach {needed} "
                      f"tokens, but vLLM reads {trained} from {where} and refuses "
                      f"max_model_len {needed} at start",
                      help=f"rollout.max_response_len = {fits}",
                      related=("rollout.max_response_len", "rollout.max_prompt_len"))
