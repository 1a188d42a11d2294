"""The model family a script's model args show, and the [model.arch] keys of the DeepSeek-V3
and GLM-4.5 families that its flags give (the table rows' `family`).

vime/importer/__init__.py's _model writes [model.arch] for Qwen3, Qwen3-MoE, DeepSeek-V3 and
GLM-4.5, and for the families the planner reads but the runtime does not run (Qwen2, GLM-4,
GLM-4.7-Flash, Qwen3-Next, GPT-OSS: vime/support.py's PLANNED_ONLY), whose published shapes
are presets; model args that show another family (Llama, ...) are said (V975) rather than
written as a Qwen3. The families vime builds are vime/support.py's MODEL_TYPES.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from vime.importer import table

# Megatron's multi-head latent attention (megatron/core/transformer/multi_latent_attention.py)
MLA_FLAGS = ("--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
             "--qk-pos-emb-head-dim", "--v-head-dim")
# a MoE router and experts that Qwen3-MoE does not have: sigmoid scores with an expert bias,
# shared experts (GLM-4.5's and DeepSeek-V3's)
ROUTER_FLAGS = ("--moe-router-enable-expert-bias", "--moe-shared-expert-intermediate-size")

# GPT-OSS's attention sinks, alternating sliding windows and clamped quick-GeGLU
# (megatron/core/transformer/transformer_config.py: softmax_type, window_size, glu_linear_offset)
GPT_OSS_FLAGS = ("--quick-geglu", "--glu-linear-offset", "--activation-func-clamp-value")
WINDOW_FLAGS = ("--window-size", "--window-attn-skip-freq")
# Qwen3-Next's output-gated attention and gated shared expert
GATED_ATTENTION_FLAGS = ("--use-gated-attention", "--attention-output-gate",
                         "--moe-shared-expert-gate")
# GLM-4's dense layers: a norm after attention and after the MLP, interleaved rotary halves
GLM4_FLAGS = ("--post-self-attn-layernorm", "--post-mlp-layernorm", "--rotary-interleaved")
# Llama 3.1's rope scaling (Qwen3 has none)
LLAMA_ROPE_FLAGS = ("--use-rope-scaling", "--rotary-scaling-factor")

# the flags of a DeepSeek-V3 or GLM-4.5 model's settings: what vime builds for those families
FAMILY_FLAGS = frozenset({name for row in table.FLAGS if row.family for name in row.names}
                         | set(MLA_FLAGS))


class Family(NamedTuple):
    name: str  # in the user's words: "Qwen3", "a DeepSeek-V3-family model", ...
    model_types: tuple[str, ...]  # the config.json model_type values it is; () none vime has
    flags: tuple[str, ...]  # the flags that show it, as the script writes them


QWEN3 = Family("Qwen3", ("qwen3", "qwen3_moe"), ())


def model_family(given: dict[str, tuple[str, ...]]) -> Family:
    """The family of the model args `given` (flag -> its words): Qwen3 unless a flag shows
    another one."""

    def shown(*flags: str) -> tuple[str, ...]:
        return tuple(f"{flag} {' '.join(given[flag])}".strip() for flag in flags if flag in given)

    mla = shown(*MLA_FLAGS)
    bias = shown("--add-qkv-bias")
    partial = tuple(text for text in shown("--rotary-percent")
                    if not _is_number(text.split(" ", 1)[-1], 1.0))
    sigmoid = tuple(text for text in shown("--moe-router-score-function")
                    if text.endswith(" sigmoid"))
    router = sigmoid + shown(*ROUTER_FLAGS)
    oss = tuple(text for text in shown("--softmax-type") if text.endswith(" learnable")) + \
        shown(*GPT_OSS_FLAGS)
    if oss:
        return Family("a GPT-OSS-family model (attention sinks, sliding-window layers, clamped "
                      "GeGLU experts)", ("gpt_oss",),
                      oss + shown(*WINDOW_FLAGS) + shown(*LLAMA_ROPE_FLAGS, "--rope-scaling-factor"))
    gated = shown(*GATED_ATTENTION_FLAGS) + tuple(
        text for text in shown("--spec") if "qwen3_next" in text)
    if gated:
        return Family("a Qwen3-Next (gated attention beside gated DeltaNet linear attention)",
                      ("qwen3_next",), gated)
    if mla and bias:
        return Family("a GLM-4.7-Flash (GLM-4-MoE-Lite: multi-head latent attention with "
                      "QKV bias)", ("glm4_moe_lite",), mla + bias + router)
    if mla:
        return Family("a DeepSeek-V3-family model (multi-head latent attention)",
                      ("deepseek_v3", "kimi_k2"), mla + router)
    if bias and (partial or router) and "--num-experts" in given:
        return Family("a GLM-4.5-family model (QKV bias, partial rotary, sigmoid routing, "
                      "shared experts)", ("glm4_moe",), bias + partial + router)
    if bias and "--num-experts" not in given and (partial or shown(*GLM4_FLAGS)):
        return Family("a GLM-4 (dense: QKV bias, partial interleaved rotary, norms after "
                      "attention and MLP)", ("glm4",), bias + partial + shown(*GLM4_FLAGS))
    if bias and "--qk-layernorm" not in given:
        return Family("a Qwen2 (QKV bias without q/k norm)", ("qwen2",),
                      bias + ("no --qk-layernorm",))
    if partial or router:
        return Family("a model that is not Qwen3 (partial rotary, sigmoid routing or shared "
                      "experts)", (), partial + router)
    llama = shown(*LLAMA_ROPE_FLAGS) + tuple(
        text for text in shown("--vocab-size") if text.endswith(" 128256"))
    if llama and "--qk-layernorm" not in given:
        return Family("a Llama (no q/k norm, Llama-3 rope scaling or vocabulary)", (),
                      llama + ("no --qk-layernorm",))
    return QWEN3


class FamilyArch(NamedTuple):
    values: dict[str, object]  # [model.arch] key -> value
    flags: dict[str, str]  # [model.arch] key -> the flag it came from
    problems: list[tuple[str, str]]  # (flag, why its words give no value)


def family_arch(words: dict[str, tuple[str, ...]], moe_ffn_hidden_size) -> FamilyArch:
    """The [model.arch] keys the table's `family` rows give from the flags `words` (flag ->
    its words), for a DeepSeek-V3 or GLM-4.5 model."""
    values: dict[str, object] = {}
    flags: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    for row in table.FLAGS:
        flag = next((name for name in row.names if name in words), None)
        if not row.family or flag is None:
            continue
        key, _, kind = row.family.partition(":")
        given = words[flag]
        try:
            value = _family_value(kind, given, moe_ffn_hidden_size)
        except ValueError as err:
            problems.append((flag, str(err)))
            continue
        values[key], flags[key] = value, flag
    if values.get("scoring_func") == "sigmoid":
        # megatron-core renormalises sigmoid top-k weights (vime/support.py), as HF's
        # norm_topk_prob = true does
        values["norm_topk_prob"], flags["norm_topk_prob"] = True, "--moe-router-score-function"
    return FamilyArch(values, flags, problems)


def _family_value(kind: str, given: tuple[str, ...], moe_ffn_hidden_size):
    if "?" in given:  # mapping.py's mark of a word the reader cannot know
        raise ValueError("the reader cannot know its value; pass its variable with --env")
    if kind == "true" or kind not in ("int", "float", "str", "shared"):
        if given:
            raise ValueError(f"a switch, given {' '.join(given)!r}")
        return True if kind == "true" else kind
    if len(given) != 1:
        raise ValueError(f"takes one value, given {len(given)}")
    text = given[0]
    if kind == "str":
        return text
    try:
        number = float(text) if kind == "float" else int(text)
    except ValueError:
        raise ValueError(f"takes a number, not {text!r}") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"takes a finite number ≥ 0, not {text!r}")
    if kind != "shared":
        return number
    if not isinstance(moe_ffn_hidden_size, int) or moe_ffn_hidden_size <= 0 or \
            number % moe_ffn_hidden_size:
        raise ValueError(f"{number} is not a whole number of experts of --moe-ffn-hidden-size "
                         f"{moe_ffn_hidden_size}")
    return number // moe_ffn_hidden_size


def _is_number(text: str, number: float) -> bool:
    try:
        return float(text) == number
    except ValueError:
        return False
