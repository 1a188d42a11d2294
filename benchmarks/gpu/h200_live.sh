#!/usr/bin/env bash
# The live-vLLM runs of issue 14 on the lent H200 (docs/gpu-runs.md), one step per call:
#
#   bash benchmarks/gpu/h200_live.sh install   # after the parts are in /tmp/parts (below)
#   bash benchmarks/gpu/h200_live.sh grpo      # the toy task, R3 on, then R3 off (each run its
#                                              # own experiment: checkpoints are per experiment)
#   bash benchmarks/gpu/h200_live.sh fallback  # the toy task with the collective_rpc fallback
#   bash benchmarks/gpu/h200_live.sh fam       # the toy task with a tiny DeepSeek-V3, then a
#                                              # tiny GLM-4.5 (R3 on, 12 rollouts each;
#                                              # FAMILIES="dsv3 glm" chooses)
#   bash benchmarks/gpu/h200_live.sh famvllm   # families_hf_vs_megatron.py --vllm: vLLM's
#                                              # log-probs and routes against Megatron's
#   bash benchmarks/gpu/h200_live.sh sync      # weight sync of a Qwen3-30B-A3B slice: IPC, fallback
#   bash benchmarks/gpu/h200_live.sh rollout   # vime's rollout backend vs bare LLM.generate
#                                              # (SHAPE=tiny SEQS=8 TOKENS=16: a dry run first)
#   bash benchmarks/gpu/h200_live.sh mp        # the engine core in its own process: where it
#                                              # waits (stacks of every process every 30 s)
#   bash benchmarks/gpu/h200_live.sh grid      # issue 18: the memory grid of the backend's step
#   bash benchmarks/gpu/h200_live.sh grouped   # issue 19: grouped vs sequential experts, then
#                                              # the backend vs the plain loop in 10 rounds
#   bash benchmarks/gpu/h200_live.sh startup   # issue 18: a Qwen3-30B-A3B-shaped engine's start-up
#                                              # log (weights, activations, graphs, KV cache)
#
# Transformer Engine's install and its runs (issue 19 item 2) are benchmarks/gpu/h200_te.sh's.
#
# What the machine lacks travels as carried files (device README): vLLM 0.26.0 in the seven
# parts of ../shared/gpu/vllm-bundle.sh (.gpu/vllm/pNN), Ray's wheel in two parts
# (.gpu/ray/rNN: `split -b 37M` of ray-2.55.1-cp312-cp312-manylinux2014_x86_64.whl), and
# .whl/ (megatron-core 0.19.2, submitit, tomli-w). Each part is moved to /tmp/parts by the call
# that carries it. Results go to $OUT (JSON and logs); $OUT brings back a few files only: the
# steps with many files (grid) are best tarred into one.
#
# A call carries at most 64 MiB with the working tree (~3 MiB): one 58 MiB part a call, and the
# repository's snapshot (.snap: `git archive HEAD` + .whl/ + .gpu/vllm/install.sh*, ~6 MiB)
# with the last, small parts (p06 + r01), copied to /tmp at once; then run from there.
# grid and grouped need only megatron-core: `MEGATRON_ONLY=1` installs .whl/ alone, one call
# carrying .snap, no vLLM or Ray parts.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out"

setup() {
  if [ -n "${MEGATRON_ONLY:-}" ]; then
    [ -f /tmp/site/.megatron-ok ] || { python3 -m pip install -q --no-index --no-deps \
      --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && touch /tmp/site/.megatron-ok; } || return 1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    python3 -c "import megatron.core, torch; print('megatron-core', megatron.core.__version__, 'torch', torch.__version__)"
    return
  fi
  # shellcheck disable=SC1091
  source .gpu/vllm/install.sh >/dev/null || return 1
  if [ ! -f /tmp/site/.ray-ok ]; then
    mkdir -p /tmp/rayw && cat /tmp/parts/r?? > /tmp/rayw/ray-2.55.1-cp312-cp312-manylinux2014_x86_64.whl
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site /tmp/rayw/*.whl .whl/*.whl || return 1
    touch /tmp/site/.ray-ok
  fi
  export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled RAY_DEDUP_LOGS=0
  python3 -c "import vllm, ray, megatron.core, torch; print('vllm', vllm.__version__, 'ray', ray.__version__, 'megatron-core', megatron.core.__version__, 'torch', torch.__version__)"
}

grpo() {  # NAME SPEC [--set ...]: one run of the loop, its summary line printed
  local name=$1; shift
  python3 benchmarks/gpu/live_grpo.py "$@" --out "$out/$name.json" > "$out/$name.log" 2>&1
  local rc=$?
  grep -E "^vime:|RESULT|Error|error:" "$out/$name.log" | grep -v "^vime: engine 0" | tail -40
  echo "$name: exit $rc"
}

step=${1:?install, grpo, fallback, fam, famvllm, sync, rollout, mp, grid, grouped or startup}
setup || { echo "setup failed"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case $step in
  install) ;;
  grpo)
    python3 benchmarks/gpu/tiny_moe.py build/tiny-qwen3-moe
    grpo grpo-r3 specs/tiny_h200.toml --set experiment.name=tiny-h200-r3
    grpo grpo-nor3 specs/tiny_h200.toml --set experiment.name=tiny-h200-nor3 \
      --set train.routing_replay=false ;;
  fallback)
    [ -d build/tiny-qwen3-moe ] || python3 benchmarks/gpu/tiny_moe.py build/tiny-qwen3-moe
    grpo grpo-fallback specs/tiny_h200.toml --set rollout.num_rollout=10 \
      --set experiment.name=tiny-h200-fallback \
      --set 'inference.extra_args=["--weight-transfer-config={\"backend\":\"none\"}"]' ;;
  fam)
    # each run is its own experiment (checkpoints are per experiment); 12 rollouts of the toy
    # task fit ~3 minutes with the engine's start (the Qwen3-MoE's 30 took 135 s)
    for family in ${FAMILIES:-dsv3 glm}; do
      case $family in
        dsv3) shape=deepseek-v3-tiny folder=build/tiny-dsv3 ;;
        glm) shape=glm4-moe-tiny folder=build/tiny-glm4-moe ;;
        *) echo "unknown family $family"; continue ;;
      esac
      python3 benchmarks/gpu/tiny_moe.py "$folder" --shape "$shape" || { echo "$family: no checkpoint"; continue; }
      grpo "fam-$family" "specs/tiny_h200_$family.toml" --set "experiment.name=tiny-h200-$family-r3" \
        --set rollout.num_rollout="${ROLLOUTS:-12}"
      grep -E "vime: (train.transformer_impl|MoE experts)|weights reach|attention backend|Using .*MLA|backend" \
        "$out/fam-$family.log" | cut -c1-240 | head -8
      python3 - "$out/fam-$family.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except OSError as error:
    sys.exit(f"no summary: {error}")
for key in ("seconds", "rollouts", "reward", "acc", "logprob_abs_diff", "logprob_abs_diff_max",
            "replayed_route_match", "weight_version", "mean_time_s"):
    print(f"  {key}: {r.get(key)}")
PY
    done ;;
  famvllm)
    # one vLLM engine per family, each in a process of its own, eager (no CUDA graphs)
    timeout -k 5 540 python3 benchmarks/gpu/families_hf_vs_megatron.py --out "$out/families-vllm.json" \
      --vllm > "$out/families-vllm.log" 2>&1
    echo "families --vllm: exit $?"
    grep -E "^(deepseek_v3|glm4_moe) |Error|MLA|attention backend" "$out/families-vllm.log" | cut -c1-600 | tail -12 ;;
  sync)
    python3 benchmarks/gpu/tiny_moe.py build/qwen3-30b-a3b-slice --shape qwen3-30b-a3b --layers "${LAYERS:-4}"
    # the toy spec without its [model.arch] (the tiny shape): vime reads the slice's config.json
    sed '/^\[model.arch\]/,/^$/d' specs/tiny_h200.toml > specs/slice_h200.toml
    for path in ipc fallback; do
      extra=(); [ $path = fallback ] && extra=(--set 'inference.extra_args=["--weight-transfer-config={\"backend\":\"none\"}"]')
      python3 benchmarks/gpu/weight_sync_bench.py specs/slice_h200.toml \
        --set model.hf_checkpoint=../build/qwen3-30b-a3b-slice "${extra[@]}" --repeats "${REPEATS:-3}" \
        --out "$out/sync-$path.json" > "$out/sync-$path.log" 2>&1
      echo "sync $path: exit $?"; grep -E "^push|RESULT|Error" "$out/sync-$path.log" | tail -8
    done ;;
  rollout)
    for mode in ${MODES:-bare vime}; do
      python3 benchmarks/gpu/rollout_bench.py --mode "$mode" --out "$out/rollout-$mode.json" \
        --seqs "${SEQS:-512}" --tokens "${TOKENS:-1024}" --shape "${SHAPE:-qwen3-30b-a3b}" \
        > "$out/rollout-$mode.log" 2>&1
      echo "$mode: exit $?"; grep RESULT "$out/rollout-$mode.log" || tail -5 "$out/rollout-$mode.log"
    done ;;
  mp)
    # the same small generation with the engine core in its own process, under a time limit;
    # every Python process prints its threads' stacks every 30 s (stackdump/sitecustomize.py).
    # At 90 % of the GPU a 2-layer model's block pool (8 M blocks) alone takes long: UTIL=0.15
    # started in 40 s on 2026-12-01 (docs/gpu-runs.md); the first call on a fresh machine adds
    # ~45 s of cold imports
    for method in ${METHODS:-fork spawn}; do
      VLLM_ENABLE_V1_MULTIPROCESSING=1 VLLM_WORKER_MULTIPROC_METHOD=$method VIME_STACK_DUMP_S=30 \
        VLLM_LOGGING_LEVEL=DEBUG PYTHONPATH="$PWD/benchmarks/gpu/stackdump:$PYTHONPATH" \
        timeout -k 5 "${LIMIT:-150}" python3 benchmarks/gpu/rollout_bench.py --mode bare --shape tiny \
        --seqs 8 --tokens 16 --gpu-memory-utilization "${UTIL:-0.15}" --out "$out/mp-$method.json" \
        > "$out/mp-$method.log" 2>&1
      echo "mp $method: exit $?"; grep RESULT "$out/mp-$method.log" || tail -3 "$out/mp-$method.log"
      pkill -9 -f "EngineCore|rollout_bench" 2>/dev/null; sleep 2  # the engine core outlives a timeout
    done ;;
  grid)
    # the children's result files stay in /tmp/grid (one tar of them comes back): $OUT brings
    # back a few files only, and on 2026-12-01 the JSONL itself was left behind with them
    rm -rf /tmp/grid && mkdir -p /tmp/grid
    timeout -k 5 560 python3 benchmarks/gpu/backend_memory_grid.py --out /tmp/grid/backend-grid.jsonl \
      --budget-s "${BUDGET:-420}" 2>&1 | tail -20
    cp /tmp/grid/backend-grid.jsonl "$out/" && tar czf "$out/grid-children.tgz" -C /tmp/grid . ;;
  grouped)
    timeout -k 5 "${LIMIT:-420}" python3 benchmarks/gpu/grouped_experts_bench.py --out "$out/grouped.json" \
      --alternations "${ALTERNATIONS:-1}" > "$out/grouped.log" 2>&1
    echo "grouped: exit $?"
    python3 - "$out/grouped.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for c in r.get("experts", {}).get("cases", []):
    print("experts", c["local_experts"], "seq", round(c["sequential"]["median_s"], 4), "grouped",
          round(c["grouped"]["median_s"], 4), "x", round(c["speedup"], 1), "TFLOP/s",
          round(c["grouped"]["tflops"]), "gaps", c["gaps"], c["gaps_within_bf16"])
step = r.get("step", {})
print("step", step.get("tokens_per_s"), step.get("speedup"))
for run in step.get("runs", []):
    print(" ", {k: run.get(k) for k in ("experts", "modules", "median_step_s", "gpu_busy_share",
                                        "expert_gemm_tflops_in_step", "error")})
PY
    timeout -k 5 150 python3 benchmarks/gpu/megatron_backend_speed.py --layers 4 --tokens 16384 \
      --rounds 10 --repeats 3 --out "$out/backend-speed.json" > "$out/backend-speed.log" 2>&1
    echo "backend vs plain: exit $?"; grep -E '"ratio|tokens_per_s|Error' "$out/backend-speed.log" | head ;;
  startup)
    timeout -k 5 300 python3 benchmarks/gpu/rollout_bench.py --mode vime \
      --out "$out/startup.json" --seqs 512 --tokens 16 --shape qwen3-30b-a3b > "$out/startup.log" 2>&1
    echo "startup: exit $?"
    grep -E "Model loading took|KV cache|CUDA graph|Graph capturing|memory profiling|torch.compile|Maximum concurrency|RESULT" \
      "$out/startup.log" | cut -c1-300 | head -30 ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
