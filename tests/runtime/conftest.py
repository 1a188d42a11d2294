"""Fixtures shared by the runtime tests."""

from __future__ import annotations

import pytest
from runtimekit import local_ray


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray with logical GPUs, one per test module (runtimekit.local_ray)."""
    with local_ray():
        yield
