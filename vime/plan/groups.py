"""The actor's layout and rank groups, under the name the plan stage imports (vime/layout.py)."""

from vime.layout import (  # noqa: F401
    DEFAULT_ORDER,
    Grid,
    Layout,
    axis_column,
    axis_members,
    chunked,
    orthogonal_groups,
)
