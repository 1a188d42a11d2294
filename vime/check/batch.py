"""V4xx: the batch schedule of one rollout."""

from __future__ import annotations

from vime.check.algorithm import GROUP_ESTIMATORS
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


@rule("V403", "rollouts-fill-a-step", enforced_by="megatron")
def rollouts_fill_a_step(spec: Spec):
    """The whole run must produce at least one optimizer step.

    slime sets train_iters = num_rollout × batch_size × n_samples_per_prompt ÷
    global_batch_size; when that is 0, Megatron's OptimizerParamScheduler fails with a bare
    "AssertionError" on lr_decay_steps > 0 after the model has loaded.
    Fix: more rollouts, or a smaller global batch."""
    total = spec.rollout.num_rollout * spec.derived.samples_per_rollout
    if total < spec.train.global_batch_size:
        yield Finding("rollout.num_rollout",
                      f"{spec.rollout.num_rollout} rollouts × {spec.derived.samples_per_rollout} "
                      f"samples = {total} < global_batch_size {spec.train.global_batch_size}: no "
                      "optimizer step would run", help="raise num_rollout",
                      related=("train.global_batch_size",))


@rule("V404", "grpo-needs-groups", severity="warning", enforced_by="vime")
def grpo_needs_groups(spec: Spec):
    """An estimator whose baseline is the prompt's group learns nothing from one sample.

    GRPO's (and GSPO's) advantage is a sample's reward minus the mean reward of its group
    (the samples of the same prompt), RLOO's minus the mean of the group's other samples,
    REINFORCE++-baseline's minus the group mean before whitening; with
    n_samples_per_prompt = 1 every such advantage is 0 and the policy gradient vanishes
    (slime turns std normalisation off and trains on zeros).
    Fix: n_samples_per_prompt ≥ 2 (the seed uses 2; 8 or 16 is common), or
    advantage_estimator = "reinforce_plus_plus", whose baseline is the whole rollout."""
    estimator = spec.algorithm.advantage_estimator
    if estimator in GROUP_ESTIMATORS and spec.rollout.n_samples_per_prompt == 1:
        yield Finding("rollout.n_samples_per_prompt",
                      f"{estimator} with n_samples_per_prompt = 1: every advantage is 0",
                      help="n_samples_per_prompt ≥ 2, or advantage_estimator = "
                      "\"reinforce_plus_plus\"",
                      related=("algorithm.advantage_estimator",))


@rule("V405", "kl-needs-reference", enforced_by="slime")
def kl_needs_reference(spec: Spec):
    """A KL term needs reference weights to compare the policy against.

    With kl_loss_coef > 0 the actor computes reference log-probs from the initial weights
    (model.torch_dist_checkpoint, slime's --ref-load); without them slime fails when it
    builds the reference model ("--ref-load" / "args.ref_load is None"). Megatron backend
    only: the torch backend keeps its initial weights in memory as the reference.
    Fix: set model.torch_dist_checkpoint (made by `vime convert`), or kl_loss_coef = 0."""
    # the torch backend keeps its initial weights in memory as the reference
    if spec.train.backend == "megatron" and spec.algorithm.kl_loss_coef > 0 \
            and not spec.model.torch_dist_checkpoint:
        yield Finding("algorithm.kl_loss_coef",
                      f"kl_loss_coef = {spec.algorithm.kl_loss_coef} but no reference "
                      "checkpoint (model.torch_dist_checkpoint) is set",
                      help="set model.torch_dist_checkpoint, or kl_loss_coef = 0",
                      related=("model.torch_dist_checkpoint",))


@rule("V426", "overlong-buffer-fits-response", enforced_by="vime")
def overlong_buffer_fits_response(spec: Spec):
    """The soft overlong penalty's buffer is longer than the response itself.

    With rollout.overlong = "penalty" a response loses reward once it is longer than
    max_response_len − overlong_buffer_len tokens (DAPO's soft overlong punishment); a
    buffer of max_response_len or more would penalise every response, however short.
    Fix: overlong_buffer_len below max_response_len (DAPO: 4096 of 20480), or leave it out
    (vime derives max_response_len ÷ 5)."""
    roll = spec.rollout
    if roll.overlong == "penalty" and roll.overlong_buffer_len >= roll.max_response_len:
        yield Finding("rollout.overlong_buffer_len",
                      f"overlong_buffer_len {roll.overlong_buffer_len} is not below "
                      f"max_response_len {roll.max_response_len}: every response is penalised",
                      help=f"overlong_buffer_len = {max(roll.max_response_len // 5, 1)}",
                      related=("rollout.max_response_len", "rollout.overlong"))


@rule("V427", "sampling-filter-needs-dynamic-sampling", enforced_by="vime")
def sampling_filter_needs_dynamic_sampling(spec: Spec):
    """A dynamic-sampling filter is set but dynamic sampling is off.

    rollout.dynamic_sampling_filter is called on the groups dynamic sampling keeps; with
    rollout.dynamic_sampling = false no group is filtered and the function is never called.
    Fix: rollout.dynamic_sampling = true, or remove dynamic_sampling_filter."""
    roll = spec.rollout
    if roll.dynamic_sampling_filter and not roll.dynamic_sampling:
        yield Finding("rollout.dynamic_sampling_filter",
                      f"dynamic_sampling_filter = {roll.dynamic_sampling_filter!r} is never "
                      "called: rollout.dynamic_sampling is false",
                      help="rollout.dynamic_sampling = true",
                      related=("rollout.dynamic_sampling",))


@rule("V428", "dynamic-sampling-needs-groups", enforced_by="vime")
def dynamic_sampling_needs_groups(spec: Spec):
    """Dynamic sampling with one sample per prompt drops every group.

    Dynamic sampling keeps the groups whose rewards differ; a group of one sample never
    has two rewards to differ, so every attempt is filtered and every rollout trains on
    filler groups of advantage 0 after dynamic_sampling_max_attempts generations.
    Fix: n_samples_per_prompt ≥ 2, or dynamic_sampling = false."""
    roll = spec.rollout
    if roll.dynamic_sampling and roll.n_samples_per_prompt == 1:
        yield Finding("rollout.dynamic_sampling",
                      "dynamic sampling with n_samples_per_prompt = 1 filters every group",
                      help="n_samples_per_prompt ≥ 2, or dynamic_sampling = false",
                      related=("rollout.n_samples_per_prompt",))


FUNCTION_KEYS = ("max_turns", "max_total_tokens", "function_timeout_s")


@rule("V430", "rollout-function-keys-need-function", severity="warning", enforced_by="vime")
def rollout_function_keys_need_function(spec: Spec):
    """A rollout function's limit is set but no rollout function is.

    rollout.max_turns, rollout.max_total_tokens and rollout.function_timeout_s bound what a
    rollout function (rollout.function, runtime/rl/custom_rollout.py) does with each sample;
    without one every sample is a single response of at most max_response_len tokens, and
    the keys change nothing (the engines' max_model_len stays max_prompt_len +
    max_response_len).
    Fix: set rollout.function = "module:function", or remove the keys."""
    roll = spec.rollout
    if roll.function:
        return
    for key in FUNCTION_KEYS:
        if getattr(roll, key) is not None:
            yield Finding(f"rollout.{key}",
                          f"rollout.{key} = {getattr(roll, key)!r} has no effect: no "
                          "rollout.function is set, so each sample is one response",
                          help='rollout.function = "module:function", or remove '
                          f"rollout.{key}",
                          related=("rollout.function",))
