"""Oracle: vime's Megatron-LM flag catalog equals the one vime/flags/generate.py makes from
megatron.training.arguments (shipped in the megatron-core wheel) as installed. `make oracle`."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.training.arguments")

from vime.flags import generate  # noqa: E402


def test_the_stored_catalog_is_this_megatrons():
    catalog = generate.megatron_catalog()
    stored = generate.path_of(catalog)
    assert stored.exists(), (f"no catalog for megatron-core {catalog['version']}: run "
                             "`python -m vime.flags.generate megatron` in this venv")
    assert stored.read_text() == generate.dumps(catalog), (
        f"{stored.name} differs from megatron-core {catalog['version']}'s parser: regenerate it")
