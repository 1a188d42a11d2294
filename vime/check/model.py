"""V102-V104, V119, V124: the model's architecture, against what the runtime can run, against the
checkpoint's own config.json, a context length nothing gives, and its FP8 blocks against the
engine's tensor parallelism; the engines' quantization against what the runtime serves."""

from __future__ import annotations

import math
from dataclasses import dataclass

from vime.check.registry import Finding, rule
from vime.resolve.model import Arch
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

    The Megatron backend (runtime/megatron/model.py) builds Qwen3 blocks and the two MoE
    families below, and the weight mapping to Hugging Face and vLLM names knows those
    tensors alone. vime's planner reads any config.json with those keys, so another
    architecture (Qwen2.5-VL, Qwen3-Next's hybrid linear attention, Qwen2's QKV bias, a
    YaRN rope) would plan, then die after the queue wait on the first tensor the checkpoint
    lacks, or train a different function than vLLM serves.
    Supported: Qwen3 dense (model_type "qwen3", Qwen3ForCausalLM) and Qwen3-MoE
    ("qwen3_moe", Qwen3MoeForCausalLM), with tied or untied embeddings and MoE layers placed
    by decoder_sparse_step and mlp_only_layers; the DeepSeek-V3 family ("deepseek_v3",
    "kimi_k2", DeepseekV3ForCausalLM: DeepSeek-V3/R1, Kimi-K2, Moonlight) and the GLM-4.5
    family ("glm4_moe": GLM-4.5, 4.6, 4.7 and Air): routed and shared experts, dense first
    layers, MLA with or without a query latent (q_lora_rank null: Moonlight), YaRN rotary
    scaling with MLA (megatron-core's YarnRotaryEmbedding and its mscale softmax scale),
    sigmoid routing with the expert bias, group-limited routing, QKV bias and partial
    rotary, trained by the Megatron backend, served by vLLM with the weights it pushes,
    routes replayed over their MoE layers. Not run, each named in the message in words:
    rotary scalings other than YaRN (linear, dynamic, llama3, mrope), YaRN without MLA,
    a YaRN attention_factor written out, an unrounded correction range (truncate false) or
    an mscale without mscale_all_dim (transformers scales cos and sin otherwise than
    megatron-core and vLLM), group scores that megatron-core sums over top_k ÷ topk_group
    experts where transformers and vLLM take 2, sigmoid weights not renormalised. Their MTP
    layers (num_nextn_predict_layers) are neither counted nor trained.
    `vime plan` still shows the layout of such a spec, marked as planning only, so its
    GPUs and memory can be studied; `vime compile` and `vime submit` refuse it.
    Fix: a checkpoint of a supported architecture, or remove the [model.arch] key named."""
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


@rule("V124", "runtime-runs-engine-quantization", enforced_by="vime")
def runtime_runs_engine_quantization(spec: Spec):
    """vime's runtime cannot serve the engines' weights quantized yet.

    inference.quantization = "fp8" or "int4" says the engines hold their weights quantized
    (FP8 with 128 × 128 block scales, or int4 in groups of 128), as slime's and upstream
    vime's low-precision rollouts do with a quantized checkpoint beside a bf16 actor. vime
    plans it: the engines' weights are counted at that width, which leaves the KV cache the
    room the run would have. Its runtime starts vLLM on model.hf_checkpoint and pushes bf16
    weights after every step (runtime/backends/vllm_worker.py); a push that quantizes on the
    way is issue 45's to build. Until then such a spec is planned only: `vime plan` shows
    its layout and memory marked as planning only; `vime compile` and `vime submit` refuse it.
    Fix: inference.quantization = "none" (bf16 engines, more weight memory: check the
    plan's KV cache line) to run it with vime today."""
    kind = spec.inference.quantization
    if kind == "none":
        return
    yield Finding("inference.quantization",
                  f"vime's runtime does not serve the engines' weights as {kind} yet "
                  f"(inference.quantization = {kind!r}): the plan counts them at that width, "
                  "and the run would push bf16 weights into them",
                  help='inference.quantization = "none" runs bf16 engines (the plan then '
                  "counts bf16 weights)")


def _config_value(config: dict, key: str):
    if key in config:
        return True, config[key]
    if key in ("rope_theta", "partial_rotary_factor") \
            and isinstance(config.get("rope_parameters"), dict) \
            and key in config["rope_parameters"]:  # transformers v5
        return True, config["rope_parameters"][key]
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


@dataclass(frozen=True)
class BlockSplit:
    """One weight of an engine GPU whose tensor-parallel share is not whole FP8 blocks."""

    weight: str
    width: int  # the split dimension on one GPU
    block: int
    side: str  # "block_n" (output rows) or "block_k" (input columns)
    every_version: bool  # False: vLLM 0.26 refuses it, later releases pad the shard


def fp8_block_size(config: dict | None) -> tuple[int, int] | None:
    """[block_n, block_k] of a block-FP8 checkpoint's quantization_config, else None."""
    quant = (config or {}).get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "fp8":
        return None
    block = quant.get("weight_block_size")
    if (isinstance(block, list) and len(block) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        return block[0], block[1]
    return None


def fp8_ignored_layers(config: dict | None) -> tuple[str, ...]:
    """The modules a block-FP8 checkpoint keeps unquantized (vLLM's Fp8Config reads
    ignored_layers, or modules_to_not_convert)."""
    quant = (config or {}).get("quantization_config") or {}
    names = quant.get("ignored_layers") or quant.get("modules_to_not_convert") or []
    return tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()


def _quantized(module: str, layers: list[int], ignored: tuple[str, ...]) -> bool:
    """Whether any of the layers' `module` is FP8: an ignored name covers the module itself
    or a module above it (model.layers.0.mlp covers model.layers.0.mlp.down_proj)."""
    for i in layers:
        name = f"model.layers.{i}.{module}"
        if not any(name == n or name.startswith(n + ".") for n in ignored):
            return True
    return False


def block_splits(arch: Arch, tp: int, expert_parallel: bool, block: tuple[int, int],
                 ignored: tuple[str, ...] = ()) -> list[BlockSplit]:
    """The weights whose share on one of vLLM's TP ranks does not split into whole blocks.

    Column-parallel weights split their output rows (block_n), row-parallel ones their input
    columns (block_k): vllm/model_executor/layers/quantization/utils/fp8_utils.py
    `validate_fp8_block_shape` and `validate_fp8_block_shape_moe`."""
    if tp <= 1:
        return []
    block_n, block_k = block
    heads = arch.num_attention_heads
    found: list[BlockSplit] = []
    every_layer = list(range(arch.num_layers))
    layers_of = {"mlp.down_proj": [i for i, moe in enumerate(arch.moe_layers) if not moe],
                 "mlp.shared_experts.down_proj": [i for i, m in enumerate(arch.moe_layers) if m],
                 "mlp.experts": [i for i, moe in enumerate(arch.moe_layers) if moe]}

    def check(weight: str, width: int, every_version: bool, sides=("block_n", "block_k")):
        if not _quantized(f"self_attn.{weight}" if "proj" in weight and "mlp" not in weight
                          else weight, layers_of.get(weight, every_layer), ignored):
            return
        for side in sides:
            size = block_n if side == "block_n" else block_k
            if width % tp == 0 and (width // tp) % size:
                found.append(BlockSplit(weight, width // tp, size, side, every_version))
                return

    if arch.is_mla:
        qk_head = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        check("q_b_proj" if arch.q_lora_rank else "q_proj", heads * qk_head, True, ("block_n",))
        check("kv_b_proj", heads * (arch.qk_nope_head_dim + arch.v_head_dim), True, ("block_n",))
        check("o_proj", heads * arch.v_head_dim, True, ("block_k",))
    else:
        check("o_proj", heads * arch.head_dim, True, ("block_k",))
    if arch.num_layers > arch.num_moe_layers:
        check("mlp.down_proj", arch.ffn_hidden_size, True, ("block_k",))
    if arch.is_moe and arch.shared_expert_ffn_hidden_size:
        check("mlp.shared_experts.down_proj", arch.shared_expert_ffn_hidden_size, True,
              ("block_k",))
    if arch.is_moe and not expert_parallel:
        check("mlp.experts", arch.moe_ffn_hidden_size, False)
    return found


@rule("V104", "max-positions-defaulted", severity="warning", enforced_by="vime",
      needs_arch=True)
def max_positions_defaulted(spec: Spec):
    """The model's max_position_embeddings is vime's default: nothing the spec reads says it.

    Neither the checkpoint's config.json (not readable here), the preset nor [model.arch]
    gives max_position_embeddings, so vime takes 2048, transformers' default for a config
    without it. It bounds the rollout's context (V506 compares max_prompt_len plus the
    longest response with it), and Megatron sizes its rotary table by it
    (--max-position-embeddings in megatron.args): a real model's context is usually
    much longer (Qwen3's 40960), and a plan made with 2048 refuses lengths the model takes,
    or, the other way, accepts ones it does not.
    Fix: [model.arch] max_position_embeddings = the checkpoint's (its config.json's
    max_position_embeddings; a launch script's --max-position-embeddings or --seq-length,
    which `vime import` writes), or a model.preset, or model.hf_checkpoint readable here."""
    origin = spec.origins.get("model.arch.max_position_embeddings")  # resolve's, when defaulted
    if origin is None or origin.kind != "default":
        return
    limit = spec.arch.max_position_embeddings
    read = spec.origin("model.arch")
    source = "a config.json nor a preset" if read.kind == "arch" else read.describe()
    yield Finding("model.arch" if spec.model.arch else _model_key(spec, "max_position_embeddings"),
                  f"max_position_embeddings is vime's default {limit}: neither {source} nor "
                  "[model.arch] gives it, and it bounds the rollout's context (V506) and "
                  "Megatron's rotary table",
                  help="[model.arch] max_position_embeddings = the checkpoint's context "
                  "length (its config.json's max_position_embeddings)")


@rule("V119", "fp8-blocks-split-over-engine-tp", enforced_by="vllm", needs_arch=True)
def fp8_blocks_split_over_engine_tp(spec: Spec):
    """A block-FP8 checkpoint's weights do not split into whole blocks over vLLM's TP ranks.

    A checkpoint whose config.json has quantization_config.quant_method = "fp8" with a
    weight_block_size [block_n, block_k] (DeepSeek-V3, Kimi-K2, the -FP8 releases of
    GLM-4.5 and Qwen3) stores one scale per block. vLLM splits each weight over the engine's
    TP ranks; a share that is not a whole number of blocks cannot keep its scales, and the
    engine stops at model load, after the queue wait:
    "ValueError: Weight input_size_per_partition = 176 is not divisible by weight
    quantization block_k = 128." (row-parallel weights: o_proj, down_proj of the dense and
    shared-expert MLPs; every vLLM release vime supports), and for routed experts without
    expert parallelism "ValueError: The output_size of gate's and up's weight = 96 is not
    divisible by weight quantization block_n = 128." (vLLM 0.26; later releases pad the
    experts' shard, so that case is a warning). Expert parallelism keeps each routed expert
    whole on one GPU. Modules the checkpoint lists in quantization_config.ignored_layers
    stay in bf16 and are not checked.
    Fix: a smaller TP per engine (inference.data_parallel_size splits the engine's GPUs into
    DP ranks; or fewer gpus_per_engine), or inference.expert_parallel = true for the
    routed experts."""
    block = fp8_block_size(spec.model_config.values if spec.model_config else None)
    if block is None:
        return
    inf, tp = spec.inference, spec.derived.vllm_tp
    ignored = fp8_ignored_layers(spec.model_config.values)
    found = block_splits(spec.arch, tp, inf.expert_parallel, block, ignored)
    if not found:
        return
    def layout_that_fits(whole_experts_too: bool) -> str | None:
        for smaller in range(tp - 1, 0, -1):
            splits = block_splits(spec.arch, smaller, inf.expert_parallel, block, ignored)
            if inf.gpus_per_engine % smaller == 0 and not any(
                    whole_experts_too or s.every_version for s in splits):
                dp = inf.gpus_per_engine // smaller
                return f"inference.data_parallel_size = {dp} (TP {smaller} × DP {dp})"
        return None

    where = spec.model_config.origin.describe()
    for split in found:
        text = (f"{split.weight}: {split.width} per GPU under vLLM's TP = {tp} is not a "
                f"multiple of the checkpoint's FP8 {split.side} = {split.block} "
                f"(weight_block_size {list(block)}, {where})")
        if split.every_version:
            yield Finding("inference.gpus_per_engine", text, help=layout_that_fits(False),
                          related=("inference.data_parallel_size", "model.hf_checkpoint"))
        else:
            other = layout_that_fits(True)
            yield Finding("inference.expert_parallel",
                          text + "; vLLM 0.26 refuses it at model load",
                          help="inference.expert_parallel = true" + (f", or {other}" if other else ""),
                          related=("inference.gpus_per_engine", "model.hf_checkpoint"),
                          severity="warning")
