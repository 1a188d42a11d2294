"""The fast and the full tier of a sampled test (docs/install.md, "The test suite").

A test that samples a large space (hypothesis examples, megatron layouts, fuzz cases) runs in
both tiers: `tiered(fast=..., full=...)` parametrizes it as `[sample]`, a fixed, seeded sample
that `make test` runs, and `[full]`, marked slow, the whole budget that `make test-all` runs.
Fixed cases (hypothesis' @example) run in both. A case that fails in the full tier joins the
test's fixed cases, so the fast tier keeps it from then on.
"""

from __future__ import annotations

import pytest


def tiered(fast: int, full: int):
    """Parametrize a test by its budget: `examples` is `fast` in the fast tier's case and
    `full` in the slow tier's."""
    return pytest.mark.parametrize("examples", [
        pytest.param(fast, id="sample"),
        pytest.param(full, id="full", marks=pytest.mark.slow),
    ])
