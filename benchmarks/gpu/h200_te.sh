#!/usr/bin/env bash
# Transformer Engine against megatron-core's local layers, on one GPU (H200 on 2026-12-01;
# docs/gpu-runs.md holds the numbers): the same model built both ways must give the same
# log-probs and gradients, then the speed of a training step with each.
#
#   bash benchmarks/gpu/h200_te.sh          # from the repository root; results go to $OUT
#
# Needs installed: vime's runtime (`pip install 'vime[vllm]'`, or 'vime[runtime]'),
# megatron-core 0.19, and Transformer Engine for PyTorch built for torch's CUDA
# (`pip install --no-build-isolation 'transformer_engine[pytorch]'`). megatron-core takes TE's
# FusedAdam for every model once TE imports, so a cluster without TE is measured in another
# environment, without this package. LIMIT_CHECK, LIMIT_STEP, LIMIT_SPEED: each step's time
# limit in seconds; ALTERNATIONS: the step benchmark's rounds.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

"$python" - <<'PY' || { echo "Transformer Engine does not import here: install it first (see above)"; exit 1; }
import megatron.core, torch, transformer_engine, transformer_engine.pytorch as te
print("megatron-core", megatron.core.__version__, "torch", torch.__version__, "CUDA", torch.version.cuda,
      "transformer_engine", transformer_engine.__version__)
layer = te.Linear(64, 64).cuda()
print("TE Linear ok", tuple(layer(torch.randn(8, 64, device="cuda")).shape))
PY

timeout -k 5 "${LIMIT_CHECK:-150}" "$python" benchmarks/gpu/te_vs_local.py --out "$out/te-vs-local.json" \
  > "$out/te-vs-local.log" 2>&1
echo "te_vs_local: exit $?"; grep -E '"ok"|_bitwise|close|uses_every|same_names|"max"' "$out/te-vs-local.log" | head -20
tail -5 "$out/te-vs-local.log"
# fp32: routing ties rare, so the gradients compare tensor by tensor
timeout -k 5 "${LIMIT_CHECK:-150}" "$python" benchmarks/gpu/te_vs_local.py --fp32 \
  --out "$out/te-vs-local-fp32.json" > "$out/te-vs-local-fp32.log" 2>&1
echo "te_vs_local --fp32: exit $?"; grep -E '"ok"|close|"median"' "$out/te-vs-local-fp32.log" | head
timeout -k 5 "${LIMIT_STEP:-200}" "$python" benchmarks/gpu/grouped_experts_bench.py --parts step --kinds te \
  --alternations "${ALTERNATIONS:-2}" --out "$out/te-step.json" > "$out/te-step.log" 2>&1
echo "te step: exit $?"; grep -E '"tokens_per_s"|median_step_s|gpu_busy_share|error' "$out/te-step.json" | head
timeout -k 5 "${LIMIT_SPEED:-200}" "$python" benchmarks/gpu/megatron_backend_speed.py --impl transformer_engine \
  --layers 4 --tokens 16384 --rounds 10 --repeats 3 --out "$out/te-backend-speed.json" \
  > "$out/te-backend-speed.log" 2>&1
echo "te backend vs plain: exit $?"; grep -E '"ratio|tokens_per_s|Error' "$out/te-backend-speed.log" | head
