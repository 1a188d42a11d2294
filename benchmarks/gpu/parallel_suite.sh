#!/usr/bin/env bash
# On a machine with 2 GPUs (2 × H200 on 2026-12-01, docs/gpu-runs.md), no Ray needed: the
# Megatron backend and `vime convert` under tensor- and expert-parallel layouts. Run from the
# repository root; needs vime's runtime (`pip install 'vime[runtime]'`) and megatron-core
# installed. Results go to $OUT.
#   parallel_suite.sh [convert] [check] [grpo] [resume]     (default: all four)
# LAYOUTS="tp,ep[,cp] ..." picks the check and grpo layouts (default "2,1" "1,2"; cp 1).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stages=" ${*:-convert check grpo resume} "
run() { echo "=== $*"; "$@"; echo "=== exit $?"; }
hf=/tmp/parallel-hf
[ -d $hf ] || python3 benchmarks/gpu/megatron_parallel.py make-hf $hf
if [[ $stages == *" convert "* ]]; then
# conversion: saved with one layout, read back under another, bit-identical
for pair in "tp=2,ep=1:tp=1,ep=2" "tp=1,ep=2:tp=2,ep=1" "tp=2,ep=2:tp=2,ep=2"; do
  to=${pair%%:*}; back=${pair##*:}
  TO_TORCH_DIST="--set train.parallel.${to/,/ --set train.parallel.}" \
  TO_HF="--set train.parallel.${back/,/ --set train.parallel.}" \
    run bash benchmarks/gpu/convert_round_trip.sh | tee -a "$OUT/convert_layouts.txt"
done
fi
# the backend against transformers, export, replay, a step, a checkpoint
if [[ $stages == *" check "* ]]; then
for layout in ${LAYOUTS:-"2,1" "1,2"}; do
  set -- ${layout//,/ }; cp=${3:-1}; name=tp$1_ep$2${3:+_cp$3}
  run python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
    benchmarks/gpu/megatron_parallel.py check $hf --tp $1 --ep $2 --set train.parallel.cp=$cp \
    --out "$OUT/parallel_$name.json" > "$OUT/parallel_$name.log" 2>&1
  grep -v "Warning\|warnings.warn" "$OUT/parallel_$name.log" | grep -m3 -B2 -A12 "Traceback\|Error" 
done
fi
# GRPO on the toy task with rank 0 driving both ranks (runtime/node/torchrun.py), then a resume
if [[ $stages == *" grpo "* ]]; then
for layout in ${LAYOUTS:-"2,1" "1,2"}; do
  set -- ${layout//,/ }; cp=${3:-1}; name=tp$1_ep$2${3:+_cp$3}
  job=/tmp/grpo-$name/job
  run python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m runtime.node.torchrun \
    specs/tiny_cpu.toml --set 'train.backend="megatron"' --set 'cluster.gpu="H200"' \
    --set cluster.gpus_per_node=2 --set train.parallel.tp=$1 --set train.parallel.ep=$2 \
    --set train.parallel.cp=$cp \
    --set rollout.num_rollout=${ROLLOUTS:-20} --set checkpoint.save_interval=10 --job-dir $job \
    --cpu-threads 4 > "$OUT/grpo_$name.log" 2>&1
  grep "^vime\|^rollout\|Error" "$OUT/grpo_$name.log" | tail -30
  cp $job/metrics.jsonl "$OUT/grpo_$name.jsonl"
done
fi
# resume: 12 rollouts with a checkpoint every 6, then a second job to 16 from the checkpoint,
# against one uninterrupted job to 16 (same seed): rollouts 12-15 should match
[[ $stages == *" resume "* ]] || exit 0
spmd() {  # experiment folder, job name, rollouts, save interval
  python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m runtime.node.torchrun \
    specs/tiny_cpu.toml --set 'train.backend="megatron"' --set 'cluster.gpu="H200"' \
    --set cluster.gpus_per_node=2 --set train.parallel.ep=2 --set rollout.num_rollout=$3 \
    --set checkpoint.save_interval=$4 --job-dir $1/$2 --cpu-threads 4 > "$OUT/resume_$2.log" 2>&1
  grep "^vime\|^rollout\|Error" "$OUT/resume_$2.log" | tail -8
  cp $1/$2/metrics.jsonl "$OUT/resume_$2.jsonl"
}
spmd /tmp/resume-ep2 first 12 6
spmd /tmp/resume-ep2 resumed 16 6
spmd /tmp/straight-ep2 straight 16 100
