"""Stage 4, check: the rule registry run over a resolved Spec. Reports; never assigns."""

from vime.check import batch, cluster, layout, memory, moe, rollout, runtime  # noqa: F401  (registers rules)
from vime.check.registry import RULES, STAGE_CODES, Finding, explain, rule, run

__all__ = ["RULES", "STAGE_CODES", "Finding", "explain", "rule", "run"]
