#!/usr/bin/env bash
# Create the vLLM oracle venv: Python 3.12, vllm==0.33.0 (pulls torch 2.14.0 with its CUDA
# libraries; about 9.4 GB and 8 minutes, measured 2026-11-29), pytest, hypothesis and this
# repo (editable). Idempotent. VLLM_VENV picks the folder (default ${TMPDIR:-/tmp}/vllm-venv).
#
#   tests/oracle/setup-vllm.sh [--run [PYTEST ARGS...]]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VLLM_VENV:-${TMPDIR:-/tmp}/vllm-venv}"

if ! "$VENV/bin/python" -c 'import vllm, pytest, hypothesis; assert vllm.__version__ == "0.33.0"' 2>/dev/null; then
    python=""
    for candidate in python3.12; do
        if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            python="$(command -v "$candidate")"
        fi
    done
    if [ -z "$python" ] && command -v pyenv >/dev/null; then
        for v in $(pyenv versions --bare | grep -E '^3\.12\.[0-9]+$'); do
            python="$(PYENV_VERSION="$v" pyenv which python3.12)" && break
        done
    fi
    [ -n "$python" ] || { echo "setup-vllm.sh: no Python 3.12 found" >&2; exit 1; }
    rm -rf "$VENV"
    "$python" -m venv "$VENV"
    # pip's downloads shown: 8 minutes of nothing otherwise
    echo "installing vLLM 0.33.0 and its torch into $VENV (about 9.4 GB; measured: 8 minutes)"
    "$VENV/bin/python" -m pip install "vllm==0.33.0" "pytest>=8" "hypothesis>=6.100"
fi
"$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT"
"$VENV/bin/python" -m pip install --quiet "jsonschema>=4.18" "tomli-w>=1.0"
echo "vLLM oracle venv ready: $VENV"
if [ "${1:-}" = "--run" ]; then
    shift
    cd "$ROOT"
    exec "$VENV/bin/python" -m pytest -p no:cacheprovider tests/oracle/test_vllm.py \
        tests/oracle/test_vllm_backend.py tests/oracle/test_vllm_flags.py "$@"
fi
