"""V102-V103: the model's architecture, against what the runtime can run and against the
checkpoint's own config.json."""

from __future__ import annotations

import math

from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec
from vime.support import SUPPORTED, Unsupported, unsupported

# [model.arch] keys a user may set to another value than config.json's: neither side reads
# them as part of the model's weights or its function. max_position_embeddings only bounds
# the positions: Megatron sizes its rotary table by it, vLLM takes --max-model-len from the
# plan, and the weights do not depend on it (a shorter value saves the table's memory, a
# longer one is how context is extended beyond the published length).
OVERRIDABLE = {"max_position_embeddings"}


def unsupported_features(spec: Spec) -> list[Unsupported]:
    config = spec.model_config
    if config is None:
        return []
    return unsupported({**config.values, **spec.model.arch})


def _model_key(spec: Spec, key: str) -> str:
    top = key.split(".")[0]
    if top in spec.model.arch:
        return f"model.arch.{top}"
    origin = spec.model_config.origin if spec.model_config else None
    if origin is not None and origin.kind == "preset":
        return "model.preset"
    return "model.hf_checkpoint"


@rule("V102", "runtime-runs-the-model", enforced_by="vime")
def runtime_runs_the_model(spec: Spec):
    """vime's runtime cannot train or serve this model's architecture.

    The Megatron backend builds Qwen3 blocks (runtime/megatron/model.py: q/k RMSNorm, no
    bias, full causal attention in every layer, SwiGLU, rotary embeddings without scaling,
    softmax top-k experts without a shared expert), and the weight mapping to Hugging Face
    and vLLM names knows those tensors alone. vime's planner reads any config.json as a
    Qwen3, so another architecture (Qwen2.5-VL, Qwen3-Next's hybrid linear attention,
    Qwen2's QKV bias, a YaRN rope) would plan, then die after the queue wait on the first
    tensor the checkpoint lacks, or train a different function than vLLM serves.
    Supported: Qwen3 dense (model_type "qwen3", Qwen3ForCausalLM) and Qwen3-MoE
    ("qwen3_moe", Qwen3MoeForCausalLM), with tied or untied embeddings and MoE layers placed
    by decoder_sparse_step and mlp_only_layers. The support matrix is vime/support.py.
    `vime plan` still shows the layout of such a spec, marked as planning only, so its
    GPUs and memory can be studied; `vime compile` and `vime submit` refuse it.
    Fix: a Qwen3 or Qwen3-MoE checkpoint, or remove the [model.arch] key named."""
    found = unsupported_features(spec)
    if not found:
        return
    where = spec.model_config.origin.describe()
    features = "; ".join(f"{u.what} ({u.key} = {u.value!r})" for u in found)
    yield Finding(_model_key(spec, found[0].key),
                  f"vime's runtime cannot run this model: {features}, from {where}",
                  help=f"supported: {SUPPORTED}",
                  related=tuple(f"model.arch.{u.key.split('.')[0]}" for u in found[1:]
                                if u.key.split(".")[0] in spec.model.arch))


def _config_value(config: dict, key: str):
    if key in config:
        return True, config[key]
    if key == "rope_theta" and isinstance(config.get("rope_parameters"), dict) \
            and "rope_theta" in config["rope_parameters"]:  # transformers v5
        return True, config["rope_parameters"]["rope_theta"]
    return False, None


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


@rule("V103", "arch-agrees-with-config-json", enforced_by="vime")
def arch_agrees_with_config_json(spec: Spec):
    """A [model.arch] value contradicts the checkpoint's own config.json.

    [model.arch] overrides what vime reads, and the Megatron actor is built from the
    result; vLLM loads model.hf_checkpoint and serves what its config.json says. A
    contradiction (rope_theta = 10000 against the checkpoint's 1e6, tie_word_embeddings =
    true against false) makes Megatron train one model while vLLM serves another: the
    log-probabilities disagree from the first step, or the weights fail to load.
    The rule reads config.json only where it is readable (on a machine without the weights
    the spec's values are all vime has, and are taken as written).
    Allowed to differ: max_position_embeddings, which bounds positions without changing
    the weights (vLLM's max-model-len comes from the plan; Megatron sizes its rotary table
    by it).
    Fix: remove the key from [model.arch] (config.json already says it), or point
    model.hf_checkpoint at the checkpoint you meant."""
    config = spec.model_config
    if config is None or config.origin.kind != "config.json":
        return
    for key, written in sorted(spec.model.arch.items()):
        if key in OVERRIDABLE:
            continue
        present, value = _config_value(config.values, key)
        if present and not _same(written, value):
            yield Finding(f"model.arch.{key}",
                          f"model.arch.{key} = {written!r} contradicts {key} = {value!r} in "
                          f"{config.origin.detail}: Megatron would train with the spec's value, "
                          "vLLM serve config.json's",
                          help=f"remove {key} from [model.arch] (config.json says {value!r})",
                          related=("model.hf_checkpoint",))
