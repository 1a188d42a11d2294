from __future__ import annotations

import pytest
from specsupport import _preset_checkpoint


@pytest.fixture
def preset_checkpoint(tmp_path):
    """A folder with the config.json of a preset, as an HF checkpoint would have."""
    return _preset_checkpoint(tmp_path)
