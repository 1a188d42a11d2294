"""V120-V122, V126: a quantized checkpoint (config.json's quantization_config) against the actor
that trains from it and the weight push that updates the engines, vLLM's fused-MoE kernel
against the experts' dtype and the card, and FP8 weights against the card."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

from vime.check.engine_flags import parse
from vime.check.registry import Finding, rule
from vime.resolve import gpu_name
from vime.resolve.spec import Spec

# quant_method values whose linear weights are float8 `weight` tensors beside a scale tensor
# (weight_scale_inv per block, weight_scale per tensor or channel); the others store packed
# integers under other names (GPTQ and AWQ: qweight, qzeros, scales; compressed-tensors'
# pack-quantized: weight_packed; bitsandbytes: uint8 bytes; MXFP4 and NVFP4: packed blocks)
FP8_METHODS = {"fp8", "fbgemm_fp8", "ptpc_fp8", "fp8_per_tensor"}


@dataclass(frozen=True)
class Quantization:
    """A checkpoint's quantization_config, as much of it as the rules name."""

    method: str  # quant_method as written ("fp8", "gptq", "compressed-tensors", ...)
    fp8_weights: bool  # float8 `weight` tensors with separate scales
    detail: str  # the method in a user's words: "GPTQ 4-bit", "compressed-tensors (int4 weights)"


def _compressed_weights(quant: dict) -> tuple[bool, str]:
    """(float8 weights, what its first config group stores) of a compressed-tensors config."""
    groups = quant.get("config_groups")
    if isinstance(groups, dict):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, dict) else None
            if isinstance(weights, dict):
                kind, bits = weights.get("type", "int"), weights.get("num_bits")
                return kind == "float" and bits == 8, f"{kind}{bits or ''} weights"
    form = str(quant.get("format", "")) or "unknown format"
    return "float" in form and "8" in form, form


def quantization(config: dict | None) -> Quantization | None:
    """The quantization of a checkpoint's config.json, or None for bf16/fp16/fp32 weights."""
    quant = (config or {}).get("quantization_config")
    if not isinstance(quant, dict):
        return None
    method = quant.get("quant_method")
    if not isinstance(method, str) or not method:
        return None
    method = method.lower()
    if method == "compressed-tensors":
        fp8, stored = _compressed_weights(quant)
        return Quantization(method, fp8, f"compressed-tensors ({stored})")
    if method == "modelopt":
        algo = str(quant.get("quant_algo") or "unknown algorithm")
        return Quantization(method, "FP8" in algo.upper(), f"ModelOpt {algo}")
    bits = quant.get("bits") or quant.get("w_bit")
    label = {"gptq": "GPTQ", "awq": "AWQ", "fp8": "FP8", "bitsandbytes": "bitsandbytes",
             "mxfp4": "MXFP4"}.get(method, method)
    if method == "fp8" and isinstance(quant.get("weight_block_size"), list):
        label = f"block FP8 {quant['weight_block_size']}"
    elif isinstance(bits, int) and not isinstance(bits, bool):
        label = f"{label} {bits}-bit"
    return Quantization(method, method in FP8_METHODS, label)


def _actor_reads_hf_weights(spec: Spec) -> bool:
    """Whether the actor starts from model.hf_checkpoint's weights: not from random weights,
    a torch_dist checkpoint, or the run checkpoint a resume loads."""
    return not (spec.model.random_init or spec.model.torch_dist_checkpoint
                or spec.resume_checkpoint is not None)


def _found(spec: Spec) -> Quantization | None:
    return quantization(spec.model_config.values if spec.model_config else None)


# the suffixes the quantized releases of a model add to its name (Qwen3-30B-A3B-FP8,
# Qwen3-32B-AWQ, Qwen2.5-7B-Instruct-GPTQ-Int4, Llama-3.1-8B-Instruct-quantized.w8a8)
_QUANTIZED_SUFFIX = re.compile(r"[-_.](FP8|FP4|NVFP4|MXFP4|AWQ|GPTQ|INT4|INT8|W4A16|W8A8|W8A16|"
                               r"BNB|4BIT|8BIT|QUANTIZED)([-_.].*)?$", re.IGNORECASE)


def bf16_help(spec: Spec) -> str:
    """The fix: the bf16 release, named where the folder's name says which it is."""
    name = PurePath(spec.model.hf_checkpoint).name
    base = _QUANTIZED_SUFFIX.sub("", name)
    named = f" ({base} for {name})" if base and base != name else ""
    return (f"point model.hf_checkpoint at the bf16 release the quantized one was made "
            f"from{named}: the actor trains it and the engines serve the weights it pushes")


@rule("V120", "actor-trains-from-quantized-checkpoint", enforced_by="vime")
def actor_trains_from_quantized_checkpoint(spec: Spec):
    """The actor would load its weights from a quantized checkpoint, which it cannot train.

    The Megatron backend builds a bf16 model and fills it from model.hf_checkpoint's
    safetensors by their Hugging Face names (runtime/megatron/convert.py, HFCheckpoint;
    runtime/megatron/shards.py, fill). A checkpoint whose config.json has a
    quantization_config does not hold those tensors in that form:
    GPTQ, AWQ, compressed-tensors' packed int4/int8, bitsandbytes and MXFP4 store packed
    integers under other names (qweight, qzeros, scales, weight_packed), and the actor stops
    at load, after the queue wait, with "KeyError: 'model.layers.0.self_attn.q_proj.weight'";
    FP8 checkpoints (quant_method "fp8" with weight_block_size, as DeepSeek-V3, Kimi-K2 and
    the -FP8 releases of Qwen3 and GLM-4.5 ship; compressed-tensors float8) store float8
    `weight` tensors whose scales (weight_scale_inv, weight_scale) sit beside them, and the
    actor copies the float8 values into bf16 without them: every run trains a model that is
    not the checkpoint, and nothing fails. The torch backend loads through transformers'
    from_pretrained, which builds the method's quantized modules rather than trainable fp32
    ones. Reported by users of the frameworks vime learns from: an AWQ policy for RL is
    refused outright (https://github.com/hiyouga/EasyR1/issues/130), Megatron users
    dequantized FP8 checkpoints to bf16 by hand before importing them
    (https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/1746), and a cast that drops the
    scales is https://github.com/Lightricks/LTX-2/pull/172 ("load_state_dict(strict=False)
    silently drops the weight_scale tensors"). Not checked with model.random_init, a
    model.torch_dist_checkpoint or a run checkpoint to resume from, which the actor reads
    instead (V121 then judges the engines' side).
    Fix: point model.hf_checkpoint at the bf16 release the quantized one was made from (the
    name without -FP8, -AWQ or -GPTQ-Int4)."""
    found = _found(spec)
    if found is None or not _actor_reads_hf_weights(spec):
        return
    where = spec.model_config.origin.describe()
    if found.fp8_weights:
        what = ("its float8 weights would be copied into the bf16 actor without their scales "
                "(weight_scale_inv): the run trains a different model and nothing fails")
    else:
        what = ("its linear weights are packed integers (qweight, weight_packed), not the bf16 "
                "`weight` tensors the actor loads: it stops at load with KeyError")
    yield Finding("model.hf_checkpoint",
                  f"model.hf_checkpoint is quantized ({found.detail}, quantization_config in "
                  f"{where}), and the actor trains in bf16 from it: {what}",
                  help=bf16_help(spec))


@rule("V121", "weight-sync-into-quantized-engine", enforced_by="vllm")
def weight_sync_into_quantized_engine(spec: Spec):
    """vLLM would serve a quantized checkpoint that the weight push cannot update.

    vLLM builds its layers in the checkpoint's quantized form (FP8 weights with
    weight_scale_inv, GPTQ/AWQ qweight with scales and zeros, compressed-tensors' packed
    weights), and the actor, started from model.torch_dist_checkpoint or a run checkpoint,
    pushes bf16 tensors under the Hugging Face names after every step
    (runtime/backends/vllm_worker.py,
    vime_load; vLLM's layerwise reload, vllm/model_executor/model_loader/reload). The push
    casts bf16 values into float8 or integer parameters and leaves the scales that the
    checkpoint had: vLLM's own report https://github.com/vllm-project/vllm/pull/45835
    ("FP8 weights without scale_inv tensors ... All subsequent inference produces NaN"),
    upstream vime's https://github.com/vllm-project/vime/pull/248 (FP8 MoE rollouts answer
    HTTP 400 after the first update), and with SGLang's engine slime's
    https://github.com/THUDM/slime/issues/1679 ("Downcasting not allowed:
    target.dtype=torch.float8_e4m3fn, loaded_weight.dtype=torch.bfloat16"). From the first
    update the engines sample
    from a model that is neither the actor nor the checkpoint, and the importance ratios and
    rewards are of that model. Checked when the actor does not read model.hf_checkpoint
    itself (V120 covers that case).
    Fix: point model.hf_checkpoint at the bf16 release of the model (its config.json and
    tokenizer are what the engines and the driver read); the engines then serve exactly the
    weights the actor pushes."""
    found = _found(spec)
    if found is None or _actor_reads_hf_weights(spec) or spec.inference.backend != "vllm":
        return
    where = spec.model_config.origin.describe()
    yield Finding("model.hf_checkpoint",
                  f"the engines would load model.hf_checkpoint as {found.detail} (quantization_config "
                  f"in {where}), and the actor pushes bf16 weights into them after each step: "
                  "the quantized layers keep their old scales, and the engines stop serving the "
                  "actor's policy", help=bf16_help(spec), related=("model.torch_dist_checkpoint",))


# vLLM 0.32's fused-MoE kernels for unquantized (bf16) experts:
# vllm/model_executor/layers/fused_moe/oracle/unquantized.py, map_unquantized_backend; each
# kernel's _supports_current_device (fused_moe/experts/): flashinfer_trtllm runs on Blackwell
# (compute capability 10.x) only, flashinfer_cutlass on 9.0, 10.x and 12.x, aiter on ROCm only.
UNQUANTIZED_MOE_BACKENDS = ("triton", "batched_triton", "flashinfer_trtllm",
                            "flashinfer_cutlass", "aiter")
# compute capability (major × 10 + minor) of the cards vime knows (NVIDIA's CUDA GPUs table)
CAPABILITY = {"H100": 90, "H800": 90, "H20": 90, "H200": 90, "A100-80GB": 80, "A100-40GB": 80,
              "A800": 80, "B200": 100, "GB200": 100, "GB300": 103, "L40S": 89}
BACKEND_CARDS = {
    "flashinfer_trtllm": (lambda cc: cc // 10 == 10, "Blackwell cards (B200, GB200, GB300)"),
    "flashinfer_cutlass": (lambda cc: cc == 90 or cc // 10 in (10, 12),
                           "Hopper and Blackwell cards (H100, H200, B200, ...)"),
    "aiter": (lambda cc: False, "AMD's ROCm cards"),
}


def _engine_quantizes(spec: Spec) -> bool:
    """Whether the engines serve quantized experts: a quantized checkpoint,
    inference.quantization or --quantization."""
    return _found(spec) is not None or spec.inference.quantization != "none" or any(
        p.resolved.option == "--quantization" for p in parse(spec.inference.extra_args))


@rule("V122", "moe-backend-runs-bf16-experts", enforced_by="vllm", needs_arch=True)
def moe_backend_runs_bf16_experts(spec: Spec):
    """inference.moe_backend names a fused-MoE kernel vLLM refuses for bf16 experts or the card.

    vime serves the weights the actor trains, in bf16 (V120 and V121 keep quantized
    checkpoints out), and vLLM picks the experts' kernel by the experts' dtype: for
    unquantized experts it takes triton, batched_triton, flashinfer_trtllm,
    flashinfer_cutlass or aiter, and any other --moe-backend stops the engine at model load,
    after the queue wait: "ValueError: moe_backend='deep_gemm' is not supported for
    unquantized MoE. Expected one of ['triton', 'batched_triton', 'flashinfer_trtllm',
    'flashinfer_cutlass', 'aiter']." (vLLM 0.32,
    vllm/model_executor/layers/fused_moe/oracle/unquantized.py; reported in those words in
    https://github.com/vllm-project/vllm/issues/56832, and vLLM has no bf16 DeepGEMM path,
    https://github.com/vllm-project/vllm/issues/49271). deep_gemm, cutlass and
    marlin are kernels for FP8 or int4 experts. The kernels also check the card: FlashInfer's
    TRT-LLM kernel runs on Blackwell only, its CUTLASS kernel on Hopper and Blackwell, AITER
    on AMD's ROCm cards, and elsewhere the engine stops with "Unquantized MoE backend
    flashinfer_trtllm does not support the deployment configuration since kernel does not
    support current device NVIDIA H100 80GB HBM3." (fused_moe/modular_kernel.py,
    is_supported_config; each kernel's _supports_current_device in fused_moe/experts/).
    Not checked when the engines quantize (inference.quantization, or --quantization in
    inference.extra_args: vLLM then quantizes the experts and other kernels apply, V126
    judges FP8's against the card), nor the card
    for a cluster.gpu vime does not know.
    Fix: inference.moe_backend = "auto" (vLLM picks a kernel that runs), or "triton", which
    runs on every NVIDIA card."""
    backend = spec.inference.moe_backend
    if backend == "auto" or not spec.arch.is_moe or spec.inference.backend != "vllm" \
            or _engine_quantizes(spec):
        return
    if backend not in UNQUANTIZED_MOE_BACKENDS:
        yield Finding("inference.moe_backend",
                      f"inference.moe_backend = {backend!r} is a kernel for quantized experts; "
                      "vLLM refuses it for the bf16 experts vime serves: \"moe_backend="
                      f"'{backend}' is not supported for unquantized MoE\"",
                      help='inference.moe_backend = "auto" (or "triton")')
        return
    card = gpu_name(spec.cluster.gpu)
    if backend in BACKEND_CARDS and card in CAPABILITY:
        runs_on, cards = BACKEND_CARDS[backend]
        if not runs_on(CAPABILITY[card]):
            yield Finding("inference.moe_backend",
                          f"inference.moe_backend = {backend!r} runs on {cards}, not on the "
                          f"{card} of cluster.gpu: vLLM stops the engine at model load",
                          help='inference.moe_backend = "auto" (or "triton")',
                          related=("cluster.gpu",))


# compute capability of cards outside vime's catalog that people serve vLLM on (NVIDIA's CUDA
# GPUs table), as cluster.gpu may name them; vime plans no memory for them (V703)
OTHER_CAPABILITY = {"V100": 70, "P100": 60, "T4": 75, "A10": 86, "A10G": 86, "A30": 80,
                    "A40": 86, "A16": 86, "A2": 86, "A6000": 86, "RTX-A6000": 86,
                    "RTX-3090": 86, "L4": 89, "L20": 89, "L40": 89, "RTX-4090": 89}
# vLLM 0.32: Fp8Config.get_min_capability() (layers/quantization/fp8.py) and FP8 Marlin
# (utils/marlin_utils_fp8.py, is_fp8_marlin_supported) need 7.5; native FP8 matmuls 8.9
FP8_MIN_CAPABILITY = 75
FP8_NATIVE_CAPABILITY = 89
# FP8 MoE kernels that run on Hopper or Blackwell only (vLLM 0.32: deep_gemm_moe.py and the
# FlashInfer experts' _supports_current_device), refused below 8.9 by select_fp8_moe_backend
# (--moe-backend: the Fp8MoeBackend value vLLM names in its error)
FP8_HARDWARE_MOE_BACKENDS = {"deep_gemm": "DEEPGEMM", "flashinfer_cutlass": "FLASHINFER_CUTLASS",
                             "flashinfer_trtllm": "FLASHINFER_TRTLLM"}


def card_capability(written: str) -> tuple[str, int] | None:
    """(card, compute capability × 10) of cluster.gpu as written, or None when not known."""
    card = gpu_name(written)
    if card in CAPABILITY:
        return card, CAPABILITY[card]
    name = re.sub(r"^((NVIDIA|TESLA|GEFORCE)-)+", "", written.strip().upper()
                  .replace("_", "-").replace(" ", "-"))
    for other, capability in OTHER_CAPABILITY.items():
        if name == other or name.startswith(other + "-"):
            return other, capability
    return None


def _served_fp8(spec: Spec) -> tuple[str, str] | None:
    """(key, what) where the engines serve FP8 weights: inference.quantization or the
    checkpoint's quantization_config."""
    if spec.inference.quantization == "fp8":
        return "inference.quantization", 'inference.quantization = "fp8"'
    found = _found(spec)
    if found is not None and found.fp8_weights:
        return "model.hf_checkpoint", f"model.hf_checkpoint's {found.detail} weights"
    return None


@rule("V126", "fp8-on-card-without-fp8", severity="warning", enforced_by="vllm")
def fp8_on_card_without_fp8(spec: Spec):
    """The engines would serve FP8 weights on a card without FP8 tensor cores.

    FP8 matmuls need compute capability 8.9 (Ada: L4, L40S; Hopper: H100, H200; Blackwell).
    vLLM 0.32 serves FP8 weights (inference.quantization = "fp8", or a checkpoint whose
    quantization_config is FP8) on older cards as follows. From compute capability 7.5 to
    8.8 (T4, A100, A800, A30, A10, A40, RTX 3090) it picks the FP8 Marlin kernel
    (MarlinFP8ScaledMMLinearKernel; MarlinExperts for the MoE layers), a weight-only kernel:
    the weights stay 8-bit in memory and are widened to bf16 for every matmul, with no FP8
    compute, and the engine logs "Your GPU does not have native support for FP8 computation
    but FP8 quantization is being used. Weight-only FP8 compression will be used leveraging
    the Marlin kernel. This may degrade performance for compute-heavy workloads."
    (quantization/utils/marlin_utils_fp8.py). Rollouts' prefill and large-batch decode are
    those workloads: the memory is saved, the FP8 speed-up is not had, and the step can be
    slower than bf16 engines. Below 7.5 (V100, P100) the engine stops at start: "ValueError:
    The quantization method fp8 is not supported for the current GPU. Minimum capability:
    75. Current capability: 70." (vllm/config/vllm.py; Fp8Config.get_min_capability). A
    warning from 7.5 to 8.8, an error below. On those cards an MoE model's FP8 experts
    also refuse the kernels that need FP8 hardware: inference.moe_backend = "deep_gemm"
    (DeepGEMM runs on Hopper and Blackwell only: platforms/cuda.py, support_deep_gemm),
    "flashinfer_cutlass" or "flashinfer_trtllm" stop the engine at load with "FP8 MoE
    backend DEEPGEMM does not support the deployment configuration since kernel does not
    support current device ..." (fused_moe/oracle/fp8.py, select_fp8_moe_backend): an
    error at inference.moe_backend; "auto" takes the Marlin experts. Users meet it as an FP8 release on A800s that
    vLLM serves only through Marlin, then fails (https://github.com/vllm-project/vllm/issues/22821,
    GLM-4.5V-FP8; zai-org/GLM-V#123: "A800没有fp8"), and as FP8 Kimi on 8 × A100-40GB
    through the Marlin path (https://github.com/vllm-project/vllm/issues/31387). Not checked
    for a cluster.gpu whose compute capability vime does not know.
    Fix: inference.quantization = "none" and the bf16 release of the model on these cards
    (memory permitting: `vime plan`'s KV cache line), or cards of compute capability 8.9 or
    more (L40S, H100, H200, B200) for FP8 engines."""
    served = _served_fp8(spec)
    known = card_capability(spec.cluster.gpu)
    if served is None or known is None or spec.inference.backend != "vllm":
        return
    key, what = served
    card, capability = known
    cc = f"{capability // 10}.{capability % 10}"
    fix = ('inference.quantization = "none" with the bf16 release of the model, or cards of '
           "compute capability 8.9 or more (L40S, H100, H200) for FP8 engines")
    if capability < FP8_MIN_CAPABILITY:
        yield Finding(key, f"{what} on the {card} of cluster.gpu (compute capability {cc}): "
                      "vLLM serves FP8 from 7.5 only and stops at start with \"The quantization "
                      f"method fp8 is not supported for the current GPU. Minimum capability: 75. "
                      f"Current capability: {capability}.\"", help=fix, related=("cluster.gpu",),
                      severity="error")
    elif capability < FP8_NATIVE_CAPABILITY:
        yield Finding(key, f"{what} on the {card} of cluster.gpu (compute capability {cc}, no "
                      "FP8 tensor cores): vLLM falls back to its weight-only FP8 Marlin kernel, "
                      "which widens the weights to bf16 for every matmul: the memory is saved, "
                      "FP8's speed is not had, and compute-heavy steps (prefill, large batches) "
                      "run slower than bf16 engines", help=fix, related=("cluster.gpu",))
    backend = spec.inference.moe_backend
    if capability < FP8_NATIVE_CAPABILITY and spec.arch is not None and spec.arch.is_moe \
            and backend in FP8_HARDWARE_MOE_BACKENDS:
        yield Finding("inference.moe_backend",
                      f"inference.moe_backend = {backend!r} with FP8 experts on the {card} "
                      f"(compute capability {cc}): the kernel needs Hopper or Blackwell, and "
                      "vLLM stops at load with \"FP8 MoE backend "
                      f"{FP8_HARDWARE_MOE_BACKENDS[backend]} does not "
                      "support the deployment configuration since kernel does not support "
                      "current device\"", help='inference.moe_backend = "auto" (vLLM takes its '
                      "Marlin experts on this card)", related=("cluster.gpu", key),
                      severity="error")
