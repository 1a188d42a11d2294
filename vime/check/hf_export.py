"""V44x: HF model folders written during training (checkpoint.save_hf_interval)."""

from __future__ import annotations

from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec


@rule("V440", "hf-interval-beyond-run", severity="warning", enforced_by="vime")
def hf_interval_beyond_run(spec: Spec):
    """checkpoint.save_hf_interval is longer than the run: only the last rollout is written.

    The runtime writes an HF model folder (<save folder>/hf/rollout_XXXXXX/) every
    save_hf_interval rollouts and after the last one (runtime/rl/checkpoint.py, hf_due). An
    interval above rollout.num_rollout therefore never comes due before the end: a run that
    stops early leaves no HF folder at all, which is rarely what an interval was set for.
    Fix: an interval of at most rollout.num_rollout (the same as checkpoint.save_interval is
    common), or leave it as it is when only the final weights are wanted."""
    every, rollouts = spec.checkpoint.save_hf_interval, spec.rollout.num_rollout
    if every > rollouts:
        yield Finding("checkpoint.save_hf_interval",
                      f"an HF folder every {every} rollouts in a run of {rollouts}: only the "
                      "last rollout's is written",
                      help=f"save_hf_interval = {min(spec.checkpoint.save_interval, rollouts)}",
                      related=("rollout.num_rollout",))
