#!/usr/bin/env bash
# Create the oracle venv: Python 3.12, torch, megatron-core 0.19.2, pytest, hypothesis and this
# repo (editable), so that tests/oracle compares vime with megatron-core's own code.
#
#   tests/oracle/setup.sh                  # create (or reuse) the venv, print how to run
#   tests/oracle/setup.sh --run [ARGS...]  # ... then run pytest tests/oracle ARGS
#
# ORACLE_VENV picks the venv folder (default: $TMPDIR or /tmp, then oracle-venv).
# Idempotent: a venv that already imports megatron.core 0.19.2 is reused as it is (only the
# editable install of this repo is refreshed if it points elsewhere).
#
# Cost (measured 2026-11-29, docs/oracles.md): about 5.5 GB in the venv and 2 to 3 minutes on
# a cold pip cache. PyPI's Linux x86_64 torch is a CUDA build; it cannot be imported without
# its nvidia-* libraries (libtorch links libcudnn, libcublas, libnccl, ... directly), so there
# is no CPU-only shortcut on Python 3.12. It runs fine on a machine without a GPU.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${ORACLE_VENV:-${TMPDIR:-/tmp}/oracle-venv}"

# Versions the oracle was last run with (docs/oracles.md). torch 2.14.1 is also the highest
# release some machines' pip constraints allow.
TORCH_VERSION=2.14.1
MCORE_VERSION=0.19.2
PYTEST_VERSION=9.2.0
HYPOTHESIS_VERSION=6.170.17

find_python() {
    local p
    if p="$(command -v python3.12)" && "$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
        echo "$p"; return 0
    fi
    if command -v pyenv >/dev/null 2>&1; then
        local v
        for v in 3.12.1 $(pyenv versions --bare 2>/dev/null | grep -E '^3\.12\.[0-9]+$' | sort -t. -k3,3nr); do
            if p="$(PYENV_VERSION="$v" pyenv which python3.12 2>/dev/null)" \
                && "$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
                echo "$p"; return 0
            fi
        done
    fi
    if PYENV_VERSION=3.12.1 python3.12 -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
        PYENV_VERSION=3.12.1 python3.12 -c 'import sys; print(sys.executable)'; return 0
    fi
    echo "tests/oracle/setup.sh: no Python 3.12 found (megatron-core $MCORE_VERSION needs >= 3.12)" >&2
    return 1
}

has_megatron() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$MCORE_VERSION" <<'EOF' 2>/dev/null
import sys, warnings
warnings.simplefilter("ignore")
import hypothesis, pytest, torch  # noqa: F401
from megatron.core import package_info
from megatron.core.parallel_state import RankGenerator  # noqa: F401
sys.exit(package_info.__version__ != sys.argv[1])
EOF
}

vime_is_this_repo() {
    "$VENV/bin/python" - "$ROOT" <<'EOF' 2>/dev/null
import pathlib, sys
import vime
sys.exit(pathlib.Path(vime.__file__).resolve().parent.parent != pathlib.Path(sys.argv[1]).resolve())
EOF
}

if has_megatron; then
    echo "oracle venv $VENV already imports megatron.core $MCORE_VERSION: reusing it"
else
    python="$(find_python)"
    echo "creating oracle venv $VENV with $python"
    start=$SECONDS
    rm -rf "$VENV"
    "$python" -m venv "$VENV"
    # One resolve: torch with all of its declared dependencies (nvidia-* CUDA libraries, triton)
    # because its shared libraries need them at import time, and megatron.core imports triton.
    # pip's downloads shown: 2 to 3 minutes of nothing otherwise
    echo "installing torch $TORCH_VERSION and megatron-core $MCORE_VERSION into $VENV" \
         "(about 5.5 GB; measured: 2 to 3 minutes with a cold pip cache)"
    "$VENV/bin/python" -m pip install \
        "torch==$TORCH_VERSION" "megatron-core==$MCORE_VERSION" \
        "pytest==$PYTEST_VERSION" "hypothesis==$HYPOTHESIS_VERSION"
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT"
    has_megatron || { echo "tests/oracle/setup.sh: megatron.core does not import in $VENV" >&2; exit 1; }
    echo "oracle venv ready in $((SECONDS - start)) s, $(du -sh "$VENV" | cut -f1)"
fi

if ! vime_is_this_repo; then
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT"
fi

if [ "${1:-}" = "--run" ]; then
    shift
    cd "$ROOT"
    exec "$VENV/bin/python" -m pytest tests/oracle "$@"
fi
echo "run: $VENV/bin/python -m pytest tests/oracle"
