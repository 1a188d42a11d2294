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
#   bash benchmarks/gpu/h200_live.sh algorithms  # the toy task under each advantage estimator and
#                                              # Dr.GRPO, grpo with [eval] (pass@k): 5 runs at once
#   bash benchmarks/gpu/h200_live.sh dynamic   # a run that plateaus and the same seed with dynamic
#                                              # sampling, side by side (2 runs at once)
#   bash benchmarks/gpu/h200_live.sh tools     # the multi-turn tool example, Megatron actor
#   bash benchmarks/gpu/h200_live.sh kill      # the engine's process killed mid-generation, beside
#                                              # the same run left alone
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

# Several runs at once on the one GPU, each with its own Ray and experiment: every engine takes
# a small share of the memory, starts eager (no shared compile cache to race on) and a few
# seconds after the previous one (vLLM's memory profile counts what else the GPU allocates).
parallel() {  # NAME SPEC [--set ...] ; NAME SPEC ... : runs separated by ";" arguments
  local pids=() names=() run=() stagger=0
  launch() {
    local name=$1; shift
    ( sleep "$stagger"; grpo "$name" "$@" --set inference.gpu_memory_utilization="${UTIL:-0.1}" \
        --set 'inference.extra_args=["--enforce-eager"]' ) > "$out/$name.summary" 2>&1 &
    pids+=($!); names+=("$name"); stagger=$((stagger + ${STAGGER:-20}))
  }
  for arg in "$@"; do
    if [ "$arg" = ";" ]; then launch "${run[@]}"; run=(); else run+=("$arg"); fi
  done
  [ ${#run[@]} -gt 0 ] && launch "${run[@]}"
  wait "${pids[@]}"
  for name in "${names[@]}"; do cat "$out/$name.summary"; done
  python3 - "$out" "${names[@]}" <<'PY'
import json, sys
out = sys.argv[1]
for name in sys.argv[2:]:
    try:
        r = json.load(open(f"{out}/{name}.json"))
    except OSError:
        print(name, "no result"); continue
    reward = r["reward"]
    evals = {k: [round(m[k], 3) for m in r["metrics"] if k in m]
             for k in sorted({k for m in r["metrics"] for k in m if k.startswith("eval/")})}
    print(name, "reward first 5", round(sum(reward[:5]) / 5, 3), "last 5", round(sum(reward[-5:]) / 5, 3),
          "max", max(reward), "gap", r["logprob_abs_diff"][:2], r["logprob_abs_diff"][-2:], evals)
PY
}

step=${1:?install, grpo, fallback, fam, famvllm, sync, rollout, mp, grid, grouped, startup, algorithms, dynamic, tools or kill}
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
  algorithms)
    [ -d build/tiny-qwen3-moe ] || python3 benchmarks/gpu/tiny_moe.py build/tiny-qwen3-moe
    parallel algo-grpo specs/tiny_h200.toml --set experiment.name=h200-algo-grpo --set eval.interval=5 \
        --set 'eval.datasets=[{name="arith", prompt_data="data/tiny_arithmetic.jsonl", n_samples_per_prompt=4}]' \
      ";" algo-gspo specs/tiny_h200.toml --set experiment.name=h200-algo-gspo \
        --set 'algorithm.advantage_estimator="gspo"' --set algorithm.eps_clip=3e-4 --set algorithm.eps_clip_high=4e-4 \
      ";" algo-rpp specs/tiny_h200.toml --set experiment.name=h200-algo-rpp \
        --set 'algorithm.advantage_estimator="reinforce_plus_plus"' \
      ";" algo-rloo specs/tiny_h200.toml --set experiment.name=h200-algo-rloo \
        --set 'algorithm.advantage_estimator="rloo"' \
      ";" algo-drgrpo specs/tiny_h200.toml --set experiment.name=h200-algo-drgrpo \
        --set 'algorithm.loss_aggregation="seq-mean-token-sum-norm"' --set algorithm.std_normalization=false ;;
  dynamic)
    [ -d build/tiny-qwen3-moe ] || python3 benchmarks/gpu/tiny_moe.py build/tiny-qwen3-moe
    plateau=(--set rollout.n_samples_per_prompt=2 --set rollout.temperature=0.5 --set train.micro_batch_size=8
             --set rollout.num_rollout="${ROLLOUTS:-40}")
    parallel dyn-off specs/tiny_h200.toml --set experiment.name=h200-dyn-off "${plateau[@]}" \
      ";" dyn-on specs/tiny_h200.toml --set experiment.name=h200-dyn-on "${plateau[@]}" \
        --set rollout.dynamic_sampling=true ;;
  tools)
    [ -d build/tiny-qwen3-moe-tools ] || python3 benchmarks/gpu/tiny_moe.py build/tiny-qwen3-moe-tools \
      --prompts specs/data/tiny_arithmetic_tools.jsonl
    grpo tools specs/tiny_h200_tools.toml --set experiment.name=h200-tools ;;
  kill)
    # the run whose engine is killed carries VIME_RUN_TAG=kill in its environment (Ray's workers
    # inherit the driver's): the engine process is the one titled ray::RolloutWorker.generate
    # with that tag, killed (SIGKILL) the first time it generates after rollout AFTER's metrics
    [ -d build/tiny-qwen3-moe ] || python3 benchmarks/gpu/tiny_moe.py build/tiny-qwen3-moe
    (
      after=${AFTER:-4}
      while :; do
        metrics=$(ls -t build/runs/h200-kill/live-*/metrics.jsonl 2>/dev/null | head -1)
        [ -n "$metrics" ] && [ "$(wc -l < "$metrics")" -ge "$after" ] && break; sleep 0.5
      done
      while :; do
        for pid in $(pgrep -f "ray::RolloutWorker.generate"); do
          if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx VIME_RUN_TAG=kill; then
            kill -9 "$pid" && echo "killed engine pid $pid during generate, after $(wc -l < "$metrics") rollouts, $(date -u +%T.%N)"
            exit 0
          fi
        done
        sleep 0.01
      done
    ) > "$out/kill-watch.log" 2>&1 &
    watcher=$!
    small=(--set rollout.num_rollout="${ROLLOUTS:-12}" --set inference.gpu_memory_utilization="${UTIL:-0.1}"
           --set 'inference.extra_args=["--enforce-eager"]')
    ( VIME_RUN_TAG=kill grpo kill specs/tiny_h200.toml --set experiment.name=h200-kill "${small[@]}" ) \
      > "$out/kill.summary" 2>&1 &
    first=$!
    ( sleep "${STAGGER:-20}"; grpo nokill specs/tiny_h200.toml --set experiment.name=h200-nokill "${small[@]}" ) \
      > "$out/nokill.summary" 2>&1 &
    wait "$first" $!
    cat "$out/kill.summary" "$out/nokill.summary"
    kill "$watcher" 2>/dev/null; cat "$out/kill-watch.log"
    grep -E "restart|EngineFailed|replac" "$out/kill.log" | head -20
    python3 - "$out" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/{n}.json")) for n in ("kill", "nokill"))
print("reward kill  ", a["reward"]); print("reward nokill", b["reward"])
print("restarts", [m.get("rollout/engine_restarts") for m in a["metrics"]])
print("generate s kill", [round(m.get("time/generate", 0), 2) for m in a["metrics"]])
PY
    ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
