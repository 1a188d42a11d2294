"""V41x: the algorithm's and the learning-rate schedule's keys (V404, the groups an estimator
needs, is in batch.py with the rest of the rollout's shape)."""

from __future__ import annotations

from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec

# GSPO's ratio is a per-token geometric mean: it moves ~1e-4..1e-3 per step where token ratios
# move ~0.1 (arXiv 2507.18071 §5.1 clips at 3e-4 / 4e-4; slime's GSPO scripts --eps-clip 4e-4).
# A clip range at or above this is a token-level one; below it, a sequence-level one.
SEQUENCE_CLIP_MAX = 0.01

# the runtime's GROUP_ESTIMATORS (runtime/core/algorithm.py): a prompt's group is the baseline
GROUP_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus_baseline", "rloo")


@rule("V410", "clip-range-fits-ratio", severity="warning", enforced_by="vime")
def clip_range_fits_ratio(spec: Spec):
    """The PPO clip range is of the wrong scale for the importance ratio the estimator uses.

    GSPO (advantage_estimator = "gspo") clips a sequence-level ratio, the geometric mean of
    the token ratios, which stays within ~1e-3 of 1: its paper clips at 3e-4 / 4e-4 and
    slime's GSPO runs pass --eps-clip 4e-4. With token-level ranges (0.2 / 0.28) nothing is
    ever clipped and GSPO is plain on-policy REINFORCE. The reverse mistake, a GSPO range with
    a token-level estimator, clips almost every token and stops learning. Nothing fails at run
    time: the reward just does not move.
    Fix: with gspo, eps_clip and eps_clip_high below 0.01 (e.g. 3e-4 and 4e-4; slime sets
    eps_clip_high = eps_clip when it is not given, vime's default is 0.28); with the other
    estimators, ranges like 0.2 / 0.28."""
    algo = spec.algorithm
    gspo = algo.advantage_estimator == "gspo"
    for key in ("eps_clip", "eps_clip_high"):
        value = getattr(algo, key)
        if gspo and value >= SEQUENCE_CLIP_MAX:
            yield Finding(f"algorithm.{key}",
                          f"{key} = {value} with advantage_estimator = \"gspo\": a sequence-level "
                          f"ratio stays within ~1e-3 of 1, so this range never clips",
                          help=f"{key} = {'3e-4' if key == 'eps_clip' else '4e-4'} (GSPO's paper)",
                          related=("algorithm.advantage_estimator",))
        elif not gspo and value < SEQUENCE_CLIP_MAX:
            yield Finding(f"algorithm.{key}",
                          f"{key} = {value} is a sequence-level (GSPO) clip range, but "
                          f"advantage_estimator = \"{algo.advantage_estimator}\" clips token "
                          "ratios: almost every token would be clipped",
                          help="advantage_estimator = \"gspo\", or a token-level range such "
                          "as eps_clip = 0.2, eps_clip_high = 0.28",
                          related=("algorithm.advantage_estimator",))


@rule("V411", "min-lr-above-lr", enforced_by="megatron")
def min_lr_above_lr(spec: Spec):
    """The learning rate would decay up: min_lr is above lr.

    megatron-core's OptimizerParamScheduler refuses it when the actor starts, with a bare
    "AssertionError" on `self.max_lr >= self.min_lr`
    (megatron/core/optimizer_param_scheduler.py); the torch backend would raise the rate.
    Fix: min_lr ≤ lr (0 or lr / 10 are common)."""
    opt = spec.train.optimizer
    if opt.min_lr > opt.lr:
        yield Finding("train.optimizer.min_lr", f"min_lr = {opt.min_lr} is above lr = {opt.lr}",
                      help=f"min_lr ≤ {opt.lr}, e.g. {opt.lr / 10:g}",
                      related=("train.optimizer.lr",))


@rule("V412", "warmup-within-decay", enforced_by="megatron")
def warmup_within_decay(spec: Spec):
    """The learning-rate warmup must end before the decay does.

    megatron-core's OptimizerParamScheduler asserts `lr_warmup_steps < lr_decay_steps` when
    the actor starts, whatever the decay style, with a bare "AssertionError"
    (megatron/core/optimizer_param_scheduler.py). lr_decay_iters defaults to the run's
    optimizer steps (num_rollout × steps_per_rollout), so a warmup as long as a short run
    fails too.
    Fix: fewer lr_warmup_iters, or a larger lr_decay_iters."""
    opt = spec.train.optimizer
    if opt.lr_warmup_iters >= opt.lr_decay_iters:
        derived = spec.origin("train.optimizer.lr_decay_iters").kind == "derived"
        yield Finding(
            "train.optimizer.lr_warmup_iters",
            f"lr_warmup_iters = {opt.lr_warmup_iters} is not below lr_decay_iters = "
            f"{opt.lr_decay_iters}" + (" (the run's optimizer steps)" if derived else ""),
            help=f"lr_warmup_iters < {opt.lr_decay_iters}, or set lr_decay_iters above "
            f"{opt.lr_warmup_iters}",
            related=("train.optimizer.lr_decay_iters",))


@rule("V413", "min-lr-unused", severity="warning", enforced_by="vime")
def min_lr_unused(spec: Spec):
    """min_lr is set but the learning rate never decays.

    With lr_decay_style = "constant" the rate stays at lr after the warmup (Megatron's
    OptimizerParamScheduler returns max_lr before it looks at min_lr), so a min_lr above 0
    has no effect, which usually means the decay style was forgotten.
    Fix: lr_decay_style = "linear" or "cosine", or remove min_lr."""
    opt = spec.train.optimizer
    if opt.lr_decay_style == "constant" and opt.min_lr > 0:
        yield Finding("train.optimizer.min_lr",
                      f"min_lr = {opt.min_lr:g} has no effect: lr_decay_style = \"constant\" "
                      "keeps lr after the warmup",
                      help="lr_decay_style = \"cosine\" (or \"linear\"), or remove min_lr",
                      related=("train.optimizer.lr_decay_style",))


@rule("V414", "greedy-groups-learn-nothing", severity="warning", enforced_by="vime")
def greedy_groups_learn_nothing(spec: Spec):
    """Greedy sampling gives every sample of a prompt the same response.

    At temperature 0 vLLM (and the torch engine) decode greedily: the n_samples_per_prompt
    samples of a prompt are the same tokens and earn the same reward, so an estimator whose
    baseline is the prompt's group (grpo, gspo, rloo, reinforce_plus_plus_baseline) gives
    every sample advantage 0 and the policy gradient vanishes, with no error.
    Fix: rollout.temperature > 0 (1.0 is common for RL), or n_samples_per_prompt = 1 with
    advantage_estimator = "reinforce_plus_plus"."""
    roll, algo = spec.rollout, spec.algorithm
    if roll.temperature == 0 and roll.n_samples_per_prompt > 1 \
            and algo.advantage_estimator in GROUP_ESTIMATORS:
        yield Finding("rollout.temperature",
                      f"temperature 0 with {roll.n_samples_per_prompt} samples per prompt: "
                      f"each group's samples are identical and every {algo.advantage_estimator} "
                      "advantage is 0",
                      help="temperature = 1.0",
                      related=("rollout.n_samples_per_prompt", "algorithm.advantage_estimator"))


@rule("V415", "tis-keys-without-tis", severity="warning", enforced_by="vime")
def tis_keys_without_tis(spec: Spec):
    """A TIS level or mode is set while truncated importance sampling is off.

    algorithm.tis_level (token, sequence, geometric) and algorithm.tis_mode (truncate, mask)
    say how the TIS weight is computed (runtime/core/algorithm.py's tis_weights), and only
    algorithm.tis = true applies it: without it the loss has no TIS weight and these keys
    change nothing, which usually means tis = true was forgotten (slime's MIS example needs
    --use-tis beside --tis-level for the same reason).
    Fix: algorithm.tis = true, or remove tis_level and tis_mode."""
    algo = spec.algorithm
    if algo.tis:
        return
    for key, default in (("tis_level", "token"), ("tis_mode", "truncate")):
        value = getattr(algo, key)
        if value != default:
            yield Finding(f"algorithm.{key}",
                          f"{key} = \"{value}\" has no effect: algorithm.tis is false, so the "
                          "loss has no TIS weight",
                          help="algorithm.tis = true", related=("algorithm.tis",))
