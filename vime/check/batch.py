"""V4xx: the batch schedule of one rollout."""

from __future__ import annotations

from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec


@rule("V401", "global-batch-matches-rollout", enforced_by="slime")
def global_batch_matches_rollout(spec: Spec):
    """Every sample of a rollout must be trained on, in steps_per_rollout equal steps.

    One rollout produces batch_size × n_samples_per_prompt samples; the actor trains on them
    in steps_per_rollout optimizer steps of global_batch_size samples. slime's trainer
    fails mid-run with "Not enough samples X for global_batch_size Y" when the numbers do
    not agree (the seed's troubleshooting list names it), and a remainder would silently
    drop samples from GRPO groups.
    Fix: global_batch_size = batch_size × n_samples_per_prompt ÷ steps_per_rollout, or
    leave global_batch_size out and let vime derive it."""
    roll, train = spec.rollout, spec.train
    samples = spec.derived.samples_per_rollout
    if samples % train.steps_per_rollout:
        yield Finding("train.steps_per_rollout",
                      f"{roll.batch_size} × {roll.n_samples_per_prompt} = {samples} samples per "
                      f"rollout do not split into {train.steps_per_rollout} equal steps",
                      help="choose steps_per_rollout dividing " + str(samples),
                      related=("rollout.batch_size", "rollout.n_samples_per_prompt"))
    elif train.global_batch_size * train.steps_per_rollout != samples:
        yield Finding(
            "train.global_batch_size",
            f"global_batch_size × steps_per_rollout = {train.global_batch_size} × "
            f"{train.steps_per_rollout} = {train.global_batch_size * train.steps_per_rollout}, "
            f"but a rollout has batch_size × n_samples_per_prompt = {roll.batch_size} × "
            f"{roll.n_samples_per_prompt} = {samples} samples",
            help=f"global_batch_size = {samples // train.steps_per_rollout}, or remove it "
            "(vime derives it)",
            related=("rollout.batch_size", "rollout.n_samples_per_prompt",
                     "train.steps_per_rollout"))


@rule("V402", "global-batch-divides-dp", enforced_by="megatron")
def global_batch_divides_dp(spec: Spec):
    """The global batch must divide into micro-batches on every data-parallel rank.

    megatron/core/num_microbatches_calculator.py raises "global batch size (G) is not
    divisible by micro batch size (M) times data parallel size (D)" when the actor starts
    (slime calls init_num_microbatches_calculator inside each actor). Data parallel here
    excludes cp: cp ranks share the same micro-batch. With dynamic_batch = true the actor
    packs samples by max_tokens_per_gpu and passes micro batch 1, so the global batch must
    still split evenly over the dp ranks.
    Fix: a rollout batch whose global batch is a multiple of micro_batch_size × dp, or
    another layout (dp = actor GPUs ÷ (tp × cp × pp))."""
    train, dp = spec.train, spec.derived.dp
    micro = 1 if train.dynamic_batch else train.micro_batch_size
    unit = micro * dp
    if dp > 0 and train.global_batch_size % unit:
        what = (f"dp = {dp}" if train.dynamic_batch
                else f"micro_batch_size × dp = {micro} × {dp} = {unit}")
        yield Finding(
            "train.global_batch_size",
            f"global_batch_size {train.global_batch_size} is not divisible by {what}",
            help=f"a global batch that is a multiple of {unit} (rollout.batch_size × "
            "n_samples_per_prompt ÷ steps_per_rollout), or a layout with another dp",
            related=("rollout.batch_size", "train.parallel.tp", "train.micro_batch_size"))
