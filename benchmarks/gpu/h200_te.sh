#!/usr/bin/env bash
# Transformer Engine on the lent H200 (issue 19, item 2), one step per call, in this order:
#
#   bash benchmarks/gpu/h200_te.sh start      # megatron-core + TE's small wheels into /tmp/site,
#                                             # TE's torch extension built in the background
#   bash benchmarks/gpu/h200_te.sh part       # each call that carries a part of the core wheel
#   bash benchmarks/gpu/h200_te.sh finish     # the core wheel joined, TE installed in /tmp/te-site
#   bash benchmarks/gpu/h200_te.sh run        # the TE spec against the local one, then its speed
#
# What travels (device README): .whl/ (megatron-core 0.19.2), .gpu/te/small/ (transformer_engine
# 2.20.2's meta wheel, transformer_engine_torch's sdist, nvidia-cudnn-frontend, pydantic and
# its needs, nvdlfw-inspect), and transformer_engine_cu13-2.20.2's 264 MiB wheel as five parts
# .gpu/te/tNN (`split -b 56M -d -a 2`), one a call. The torch extension is C++ only (33 files);
# the machine has nvcc 13.0 and torch 2.11.0+cu130's headers, so it is built there, in the
# background while the parts arrive (2.5 min on 2026-12-01); where .gpu/te/built/ holds the
# wheel that build made (1.7 MB, brought back then), it is used instead. TE goes to
# /tmp/te-site, apart from megatron-core in /tmp/site: megatron-core takes TE's FusedAdam for
# every model whenever TE imports, so runs that stand for a cluster without TE must not see it
# (`te_env` adds it for the others); the meta wheel alone would make megatron-core's import
# fail ("Found empty transformer-engine meta package installed"), so it goes with the rest.
# Seen on 2026-12-01: a carried folder did not stay between calls that carried other paths,
# so `finish` must carry the meta wheel (and .gpu/te/built) again.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/parts
export PYTHONUNBUFFERED=1

base_env() { export PYTHONPATH=/tmp/site:$PWD; }
te_env() { export PYTHONPATH=/tmp/te-site:/tmp/site:$PWD; }

copy_parts() {
  for part in .gpu/te/t??; do [ -f "$part" ] && cp "$part" /tmp/parts/ && echo "part $(basename "$part") in"; done
  ls /tmp/parts | tr '\n' ' '; echo
}

build_status() {
  if [ -f /tmp/tebuild.rc ]; then echo "TE build: exit $(cat /tmp/tebuild.rc)"; else echo "TE build: running"; fi
  tail -c 1500 /tmp/tebuild.log 2>/dev/null | tail -6
}

step=${1:?start, part or finish}
case $step in
  start)
    small=$(ls .gpu/te/small/*.whl | grep -v '/transformer_engine-')
    # shellcheck disable=SC2086
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl $small || exit 1
    touch /tmp/site/.megatron-ok  # h200_live.sh's MEGATRON_ONLY setup: already done
    base_env
    python3 -c "import megatron.core, torch; print('megatron-core', megatron.core.__version__, 'torch', torch.__version__, torch.version.cuda)"
    command -v nvcc && nvcc --version | tail -2
    nproc
    rm -rf /tmp/tebuild && mkdir -p /tmp/tebuild /tmp/tewheel
    if ls .gpu/te/built/transformer_engine_torch-*.whl >/dev/null 2>&1; then
      cp .gpu/te/built/transformer_engine_torch-*.whl /tmp/tewheel/ && echo 0 > /tmp/tebuild.rc
      echo "TE's torch extension: the wheel built on 2026-12-01"; copy_parts; exit 0
    fi
    tar xzf .gpu/te/small/transformer_engine_torch-*.tar.gz -C /tmp/tebuild
    cat > /tmp/tebuild.sh <<'SH'
cd /tmp/tebuild/transformer_engine_torch-* || exit 1
PYTHONPATH=/tmp/site MAX_JOBS=16 NVTE_PYTORCH_FORCE_BUILD=TRUE \
  python3 -m pip wheel -v --no-build-isolation --no-deps --no-index -w /tmp/tewheel .
echo $? > /tmp/tebuild.rc
SH
    # its own session, so that it outlives this call (device README: setsid runs on)
    setsid nohup bash /tmp/tebuild.sh > /tmp/tebuild.log 2>&1 < /dev/null &
    sleep 15
    copy_parts
    build_status ;;
  part)
    copy_parts
    build_status ;;
  finish)
    copy_parts
    for _ in $(seq 1 "${WAIT_S:-300}"); do [ -f /tmp/tebuild.rc ] && break; sleep 1; done
    build_status
    cp /tmp/tebuild.log "$out/te-build.log" 2>/dev/null
    [ "$(cat /tmp/tebuild.rc 2>/dev/null)" = 0 ] || exit 1
    cat /tmp/parts/t?? > /tmp/tewheel/transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl
    (cd /tmp/tewheel && echo "30063d3699e779cce63617c3458804f7a504ce8279f2749c98313db9daae273e  transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl" | sha256sum -c) || exit 1
    # one pip call: the meta wheel and the core wheel share the transformer_engine folder
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/te-site /tmp/tewheel/*.whl .gpu/te/small/transformer_engine-2.20.2-py3-none-any.whl \
      || exit 1
    ls /tmp/tewheel
    te_env
    python3 -c "import transformer_engine, transformer_engine.pytorch as te, torch; print('transformer_engine', transformer_engine.__version__); l = te.Linear(64, 64).cuda(); print('TE Linear ok', l(torch.randn(8, 64, device='cuda')).shape)" ;;
  run)
    te_env
    timeout -k 5 "${LIMIT_CHECK:-150}" python3 benchmarks/gpu/te_vs_local.py --out "$out/te-vs-local.json" \
      > "$out/te-vs-local.log" 2>&1
    echo "te_vs_local: exit $?"; grep -E '"ok"|_bitwise|close|uses_every|same_names|"max"' "$out/te-vs-local.log" | head -20
    tail -5 "$out/te-vs-local.log"
    # fp32: routing ties rare, so the gradients compare tensor by tensor
    timeout -k 5 "${LIMIT_CHECK:-150}" python3 benchmarks/gpu/te_vs_local.py --fp32 \
      --out "$out/te-vs-local-fp32.json" > "$out/te-vs-local-fp32.log" 2>&1
    echo "te_vs_local --fp32: exit $?"; grep -E '"ok"|close|"median"' "$out/te-vs-local-fp32.log" | head
    timeout -k 5 "${LIMIT_STEP:-200}" python3 benchmarks/gpu/grouped_experts_bench.py --parts step --kinds te \
      --alternations "${ALTERNATIONS:-2}" --out "$out/te-step.json" > "$out/te-step.log" 2>&1
    echo "te step: exit $?"; grep -E '"tokens_per_s"|median_step_s|gpu_busy_share|error' "$out/te-step.json" | head
    timeout -k 5 "${LIMIT_SPEED:-200}" python3 benchmarks/gpu/megatron_backend_speed.py --impl transformer_engine \
      --layers 4 --tokens 16384 --rounds 10 --repeats 3 --out "$out/te-backend-speed.json" \
      > "$out/te-backend-speed.log" 2>&1
    echo "te backend vs plain: exit $?"; grep -E '"ratio|tokens_per_s|Error' "$out/te-backend-speed.log" | head ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
