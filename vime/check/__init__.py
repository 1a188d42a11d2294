"""Stage 4, check: the rule registry run over a resolved Spec. Reports; never assigns."""

from vime.check import (  # noqa: F401  (registers rules)
    algorithm,
    asynchrony,
    batch,
    cards,
    checkpoint,
    cluster,
    data_files,
    disk,
    dispatcher,
    engine_flags,
    files,
    hf_export,
    install,
    layout,
    megatron_flags,
    memory,
    model,
    moe,
    positions,
    quantization,
    rewards,
    rollout,
    rope,
    router,
    runtime,
    scheduler,
    wasteful,
)
from vime.check.registry import RULES, STAGE_CODES, Finding, explain, rule, run

__all__ = ["RULES", "STAGE_CODES", "Finding", "explain", "rule", "run"]
