"""The built-in reward names (rollout.reward), as plain data: the compiler checks a spec's
reward against them without importing the runtime; runtime/rl/rewards.py implements each
(tests/test_reward_names.py keeps its BUILTIN and this table the same names)."""

from __future__ import annotations

BUILTIN_REWARDS: dict[str, str] = {
    "deepscaler": "the last \\boxed{} after the reasoning, against the label: 1 or 0",
    "dapo": "the last \"Answer:\" line (DAPO-Math-17k): score 1 or -1, acc 1 or 0",
    "math": "the last \\boxed{}, else the last \"Answer:\" line: 1 or 0",
}
