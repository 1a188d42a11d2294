"""V441-V443, V518, V525-V526, V710: settings under which a run starts and goes on, but measures
nothing, keeps nothing to resume from, or serves from weights the push never updates."""

from __future__ import annotations

import ipaddress
import json
from urllib.parse import urlsplit

from vime.check.engine_flags import parse
from vime.check.registry import Finding, rule
from vime.launch.slurm import time_minutes
from vime.plan.colocation import plan_colocation
from vime.plan.forecast import step_forecast
from vime.plan.memory import memory_plan
from vime.resolve.spec import Spec


@rule("V525", "greedy-eval-repeats-one-sample", severity="warning", enforced_by="vime")
def greedy_eval_repeats_one_sample(spec: Spec):
    """An evaluation dataset samples several responses per prompt at temperature 0.

    At temperature 0 vLLM decodes greedily: the n_samples_per_prompt responses to a prompt
    are one response n times, so eval/<name>/pass@k (runtime/rl/evaluation.py, the unbiased
    estimator over the n samples) equals pass@1 for every k, and the engines spend n times
    the evaluation's time to measure nothing more. verl makes greedy validation one
    response for this reason ("if greedy, only 1 response",
    https://github.com/verl-project/verl/pull/553), and NeMo-RL added separate validation
    sampling so that pass@k means something
    (https://github.com/NVIDIA-NeMo/RL/pull/3401).
    Fix: n_samples_per_prompt = 1 for a greedy evaluation, or a temperature above 0 (the
    training rollout's, usually 0.6 to 1.0) when pass@k over several samples is wanted."""
    for index, dataset in enumerate(spec.eval.datasets):
        if dataset.temperature == 0 and dataset.n_samples_per_prompt > 1:
            table = f"eval.datasets[{index}]"
            yield Finding(f"{table}.n_samples_per_prompt",
                          f"{dataset.name}: {dataset.n_samples_per_prompt} samples per prompt "
                          "at temperature 0 are one greedy response repeated: every pass@k "
                          "equals pass@1", related=(f"{table}.temperature",),
                          help="n_samples_per_prompt = 1, or temperature = "
                          f"{spec.rollout.temperature or 1.0} for pass@k over samples")


# a run this long is a training run to resume, not a smoke test or a benchmark
LONG_RUN_ROLLOUTS = 100


@rule("V526", "evaluation-never-runs", severity="warning", enforced_by="vime")
def evaluation_never_runs(spec: Spec):
    """[[eval.datasets]] are set, but no evaluation comes due in the run.

    The loop evaluates before rollout 0 with eval.at_start, after the last rollout with
    eval.at_end, and before every rollout r in between that eval.interval divides
    (runtime/rl/evaluation.py, due). With both flags false and an interval that is absent or
    not below rollout.num_rollout, no r qualifies: the datasets are loaded and tokenized at
    start and no eval/ metric is ever logged. Other trainers' users meet the same silence
    from a validation interval above the run's length
    (https://github.com/weecology/DeepForest/pull/1019, "val-accuracy-interval is greater than
    max epochs"; https://github.com/roboflow/rf-detr/pull/452: "Setting validation_interval
    to a large value ... means we will not run the evaluate() operation").
    Fix: eval.at_end = true (the final weights), or an eval.interval below
    rollout.num_rollout."""
    ev, rollouts = spec.eval, spec.rollout.num_rollout
    if not ev.datasets or ev.at_start or ev.at_end:
        return
    if ev.interval is None or ev.interval >= rollouts:
        every = "no eval.interval" if ev.interval is None else f"eval.interval = {ev.interval}"
        yield Finding("eval.interval" if ev.interval is not None else "eval.at_end",
                      f"{every} in a run of {rollouts} rollouts, with at_start and at_end "
                      "false: no evaluation ever runs", related=("rollout.num_rollout",),
                      help=f"eval.at_end = true, or eval.interval = {max(1, rollouts // 10)}")


@rule("V441", "checkpoint-only-at-the-end", severity="warning", enforced_by="vime")
def checkpoint_only_at_the_end(spec: Spec):
    """checkpoint.save_interval is as long as the run: the only checkpoint is the last rollout's.

    The runtime saves a checkpoint every save_interval rollouts and after the last one
    (runtime/rl/loop.py). An interval of rollout.num_rollout or more comes due only at the
    end, so a job that stops before it (Slurm's time limit, cluster.slurm.time; a node
    failure; a preemption) leaves nothing to resume from, and the resubmitted job starts
    again from the first rollout. Users of the other frameworks meet it as a job killed at
    its time limit with no checkpoint written
    (https://github.com/ecmwf/anemoi-core/issues/114, "Many slurm based systems will kill a
    training job before it can safely complete"; a trainer that saves at a fixed interval
    only, https://github.com/AechPro/rlgym-ppo/pull/30). Runs of fewer than
    LONG_RUN_ROLLOUTS = 100 rollouts (smoke tests, benchmarks, the tiny specs) are not
    checked: they are meant to finish in one go, and their one checkpoint is the point.
    Fix: a save_interval that comes due several times in the run (the help line suggests a
    tenth of it), so a stopped job loses at most that many rollouts."""
    every, rollouts = spec.checkpoint.save_interval, spec.rollout.num_rollout
    if rollouts >= LONG_RUN_ROLLOUTS and every >= rollouts:
        suggested = max(1, rollouts // 10)
        yield Finding("checkpoint.save_interval",
                      f"a checkpoint every {every} rollouts in a run of {rollouts}: the only "
                      f"one is written after the last rollout, and a job stopped before it "
                      f"(cluster.slurm.time = {spec.cluster.slurm.time!r}) resumes from the "
                      "start", help=f"save_interval = {suggested}",
                      related=("rollout.num_rollout", "cluster.slurm.time"))


@rule("V442", "corrupt-checkpoint-has-no-fallback", severity="warning", enforced_by="vime")
def corrupt_checkpoint_has_no_fallback(spec: Spec):
    """checkpoint.on_corrupt = "previous" with checkpoint.keep_last = 1: there is no previous.

    With on_corrupt = "previous" a resume that finds the newest checkpoint corrupt (files
    that do not match their checksums, an unreadable state.json: a node lost mid-write, a
    full file system) resumes from the next older one (runtime/rl/checkpoint.py). keep_last
    = 1 removes every older checkpoint after each save, so the fallback the setting asks for
    never exists and the resume stops as with "stop". Megatron and slime users lose runs
    this way when the one kept checkpoint is the broken one
    (https://github.com/NVIDIA/Megatron-LM/issues/1350, a saved checkpoint that cannot be
    loaded to resume).
    Fix: checkpoint.keep_last = 2 or more (the previous one stays until the next save is
    complete), or on_corrupt = "stop" to say what happens."""
    ckpt = spec.checkpoint
    if ckpt.keep_last == 1 and ckpt.on_corrupt == "previous":
        yield Finding("checkpoint.keep_last",
                      'checkpoint.on_corrupt = "previous" resumes from the checkpoint before a '
                      "corrupt one, and keep_last = 1 keeps none before the newest",
                      help="keep_last = 2", related=("checkpoint.on_corrupt",))


# The share of the forecast's time to the first save that a run is taken to need at least.
# The forecast (vime/plan/forecast.py) takes every response at max_response_len and every
# sample at full length in log-probs and training, an upper bound for those phases: responses
# that stop early shorten them, and a decode step never costs less than its fixed part
# (DECODE_BASE_S, about 40 % of a step of 256 sequences). RL responses on reasoning prompts
# average a third to a half of the limit, so a run faster than a third of the forecast is not
# expected; a quarter leaves room beyond that. The forecast was within about 10 % on an H100
# it was not calibrated on, and slower cards (A100) only make the run longer than it says.
# The start-up (Ray, the actor's load, vLLM's graphs) is not forecast and not counted.
LEAST_SHARE = 0.25
# the suggested interval's first save comes by this share of the limit at the full forecast
SUGGESTED_SHARE = 0.5


@rule("V443", "first-checkpoint-after-time-limit", severity="warning", enforced_by="slurm")
def first_checkpoint_after_time_limit(spec: Spec):
    """The first checkpoint comes after Slurm's time limit: every job saves nothing.

    The runtime saves every checkpoint.save_interval rollouts (and after the last,
    runtime/rl/loop.py). Slurm stops the job at cluster.slurm.time; submitit's USR2 handler
    (sent 120 s before, vime/emit/sbatch.py) requeues it, and the requeued job resumes from
    the newest checkpoint (runtime/node/job.py, SlurmEntry.checkpoint) - which, when the
    first save is due after the limit, does not exist: each of the requeues starts again from
    rollout 0, and the allocation is spent on the same rollouts again and again. The time
    to the first save is min(save_interval, rollout.num_rollout) rollouts at the plan's step
    forecast (`vime plan`'s forecast lines). Warned only when even LEAST_SHARE = 0.25 of
    that time is beyond the limit: the forecast takes every response and sample at full
    length, an upper bound (see LEAST_SHARE's note for the margin); the start-up is not
    counted. Not checked without a forecast (an unknown cluster.gpu, the torch backends).
    NeMo-RL's users meet it as a save that fires "after the allocation is killed — losing
    exactly the work the knob exists to protect" (https://github.com/NVIDIA-NeMo/RL/issues/3596,
    its checkpoint_must_save_by against the Slurm allocation), and other trainers' as a
    checkpoint interval longer than the run, "so no checkpoint was being produced"
    (https://github.com/CliMA/ClimaCoupler.jl/pull/1161).
    Fix: a smaller checkpoint.save_interval - the help names the largest whose first save
    comes by half the limit at the full forecast - or a longer cluster.slurm.time."""
    memory = memory_plan(spec)
    forecast = step_forecast(spec, memory, plan_colocation(spec, memory))
    if forecast is None or forecast.step <= 0:
        return
    step, every = forecast.step, spec.checkpoint.save_interval
    first = min(every, spec.rollout.num_rollout)
    limit = time_minutes(spec.cluster.slurm.time) * 60
    if first * step * LEAST_SHARE <= limit:
        return
    largest = int(limit * SUGGESTED_SHARE // step)
    if largest >= 1:
        fix = f"save_interval = {largest} (its first save at about {_hours(largest * step)} " \
              "by the forecast)"
    else:
        fix = (f"one rollout takes about {_hours(step)} by the forecast: a cluster.slurm.time "
               f"of at least {_hours(4 * step)}, and save_interval = 1")
    yield Finding("checkpoint.save_interval",
                  f"the first checkpoint comes after {first} rollouts, about "
                  f"{_hours(first * step)} at the forecast's {step:.0f} s a rollout (at least "
                  f"{_hours(first * step * LEAST_SHARE)}), beyond cluster.slurm.time = "
                  f"{spec.cluster.slurm.time!r} ({_hours(limit)}): each job is stopped before "
                  "it saves, and every requeue starts again from rollout 0",
                  help=fix, related=("cluster.slurm.time", "rollout.num_rollout"))


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


# --speculative-config methods that propose tokens without a model of their own (vLLM's
# SpeculativeConfig: n-gram lookup in the prompt, suffix trees of earlier outputs)
MODEL_FREE_METHODS = {"ngram", "ngram_gpu", "suffix"}


def _speculative(spec: Spec):
    """(extra_args index, method) of a --speculative-config whose drafts come from weights."""
    for parsed in parse(spec.inference.extra_args):
        if parsed.resolved.option != "--speculative-config" or parsed.arg.value is None:
            continue
        if parsed.arg.key:  # --speculative-config.method=mtp
            if parsed.arg.key == "method" and parsed.arg.value not in MODEL_FREE_METHODS:
                yield parsed.index, parsed.arg.value
            continue
        try:
            config = json.loads(parsed.arg.value)
        except json.JSONDecodeError:
            continue  # not JSON: V512's
        if not isinstance(config, dict):
            continue
        method = str(config.get("method") or ("draft_model" if config.get("model") else ""))
        if method and method not in MODEL_FREE_METHODS:
            yield parsed.index, method


@rule("V518", "speculative-draft-never-updated", severity="warning", enforced_by="vime")
def speculative_draft_never_updated(spec: Spec):
    """Speculative decoding from a draft model (MTP, EAGLE) that the weight push never updates.

    vime's weight push loads the actor's tensors into the engine's target model only
    (runtime/backends/vllm_worker.py, vime_load: model_runner.model.load_weights); vLLM
    keeps the drafter (model_runner.drafter) as a separate module loaded once at start, and
    the Megatron backend does not train MTP layers (num_nextn_predict_layers). As training
    moves the policy, the frozen draft proposes what the policy no longer samples: its
    acceptance falls and the speculative speed-up with it, while each step still pays the
    draft's forward. Reported by the frameworks that tried it: miles' frozen drafts saw the
    accepted length fall from 2.71 to 1.00 (https://github.com/radixark/miles/pull/1926),
    SGLang never updated EAGLE/MTP drafts on the distributed weight path
    (https://github.com/sgl-project/sglang/issues/27718), and vLLM's RFC for RL rollouts
    lists stale MTP weights after updates (https://github.com/vllm-project/vllm/issues/48296).
    Methods without a draft model (ngram, suffix) are not affected.
    Fix: remove --speculative-config, or use method "ngram" (prompt lookup), which has no
    weights to go stale."""
    for index, method in _speculative(spec):
        yield Finding(f"inference.extra_args[{index}]",
                      f"speculative decoding with method {method!r}: the weight push updates "
                      "the target model, never the draft, whose acceptance falls as training "
                      "moves the policy", help='remove it, or use {"method": "ngram", ...}')


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


@rule("V710", "reward-server-on-loopback", severity="warning", enforced_by="vime")
def reward_server_on_loopback(spec: Spec):
    """A reward server's URL names the loopback address in a job that spans several nodes.

    The driver calls the reward server (rollout.reward, an [[eval.datasets]] table's reward,
    when they are http(s) URLs) from the job's head node, the first node of the allocation
    (runtime/rl/reward_server.py), and probes it before Ray starts. localhost, 127.0.0.1 or
    0.0.0.0 there is that compute node, not the login node or workstation where the server
    was started, and the job stops after the queue wait with "reward server ... did not
    answer the probe before the first rollout ...: nothing accepts connections". OpenRLHF's
    remote reward users meet it as "HTTPConnectionPool(host='127.0.0.1', port=5000): Max
    retries exceeded with url: /get_reward ... Connection refused"
    (https://github.com/TideDra/lmm-r1/issues/30), and the server's own default to bind
    every interface is discussed in https://github.com/OpenRLHF/OpenRLHF/issues/1317.
    Fix: the server's host name or address as the compute nodes reach it (`hostname -f` on
    the machine that runs it), with the server listening on that interface."""
    if spec.cluster.nodes <= 1:
        return
    named = [("rollout.reward", spec.rollout.reward)] + [
        (f"eval.datasets[{i}].reward", d.reward) for i, d in enumerate(spec.eval.datasets)]
    for key, url in named:
        if url.startswith(("http://", "https://")) and _loopback(url):
            host = urlsplit(url).hostname
            yield Finding(key, f"{key} = {url!r}: {host} is the job's head node, where the "
                          f"driver runs, not where the server was started; {spec.cluster.nodes} "
                          "nodes of a cluster reach it by its host name",
                          help="the reward server's host name as the nodes see it, e.g. "
                          + url.replace(host, "rewards.cluster.internal", 1))
