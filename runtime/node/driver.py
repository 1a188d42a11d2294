"""The job's driver: `runtime.node.driver:run`, called by runtime/node/job.py on the head node once
Ray is up (docs/runtime.md).

    run(plan, resolved_toml, job_dir, resume)

reads the plan and resolved spec into slices (runtime/core/slices.py), connects to the job's Ray
cluster, builds the placement group and the actors, restores the last checkpoint when there
is one, and runs the GRPO loop (runtime/rl/loop.py). Whatever it prints goes to the head
node's log (logs/node-0.log); the per-rollout metrics also go to metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from runtime import backends
from runtime.core.slices import JobConfig
from runtime.core.startup import Startup
from runtime.node.preflight import spec_dir_of
from runtime.node.ray_bootstrap import own_signal_handlers
from runtime.rl import rewards
from runtime.rl.checkpoint import Checkpoints
from runtime.rl.data import PromptSampler, read_prompts


def log(message: str, **kwargs) -> None:
    print(message, flush=True, **kwargs)


def load_tokenizer(config: JobConfig):
    """The checkpoint's tokenizer; with model.random_init and a checkpoint folder that has
    none, a word-level tokenizer built from the prompts (runtime/toy.py), saved in the job
    folder so the run can be read back."""
    folder = Path(config.model.hf_checkpoint)
    if (folder / "tokenizer.json").exists() or (folder / "tokenizer_config.json").exists():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
        source = str(folder)
    elif config.model.random_init:
        from runtime import toy

        tokenizer = toy.build_tokenizer(toy.prompt_texts(
            config.data.prompt_data, config.data.input_key, config.data.label_key))
        saved = config.job_dir / "tokenizer"
        tokenizer.save_pretrained(saved)
        source = f"built from {config.data.prompt_data} (word level), saved in {saved}"
    else:
        raise FileNotFoundError(f"model.hf_checkpoint = {config.model.hf_checkpoint!r} has no "
                                "tokenizer (tokenizer.json)")
    vocab = config.model.arch.get("vocab_size")
    if vocab is not None and len(tokenizer) > vocab:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size "
                         f"is {vocab}; set model.arch.vocab_size = {len(tokenizer)} or more")
    log(f"vime: tokenizer of {len(tokenizer)} tokens: {source}")
    return tokenizer


def job_loop(config: JobConfig, train, rollout, metrics, log=log):
    """Build the GRPO loop of a job on given training and rollout groups: its tokenizer,
    prompts, reward and checkpoint folders (runtime/node/torchrun.py, the in-process loop of
    the tests).

    Raises:
        FileNotFoundError: the model has no tokenizer and is not randomly initialised.
        ValueError: the tokenizer is larger than the model's vocabulary, or rollout.function
            cannot be imported.
    """
    from runtime.rl.asynchrony import loop_class

    tokenizer = load_tokenizer(config)
    prompts, _dropped = read_prompts(config.data, tokenizer)
    load_reward = reward_loader(config)
    return loop_class(config)(config, train, rollout,
                    PromptSampler(prompts, config.seed, config.data.shuffle), tokenizer,
                    load_reward(config.reward), metrics, checkpoints_of(config, log), log=log,
                    rollout_fn=rollout_function(config), load_reward=load_reward)


def reward_loader(config: JobConfig):
    """rewards.load that looks for a module first in the spec's folder, as V907 and the
    preflight do (job.json's spec_dir)."""
    spec_dir = spec_dir_of(config.job_dir)
    return lambda name: rewards.load(name, spec_dir)


def probe_rewards(config: JobConfig, reward_fn, load_reward, log=log) -> None:
    """Load every [[eval.datasets]] reward and ask each reward server (rollout.reward's, the
    eval datasets') for an answer once (runtime/rl/rewards.py, ServerCaller.probe), before
    Ray and the models start.

    Raises:
        RewardError: a server refuses, cannot be reached or does not answer in time.
        ValueError: an eval dataset's reward cannot be imported.
    """
    named = {config.reward: reward_fn}
    for dataset in config.evaluation.datasets:
        if dataset.reward not in named:
            named[dataset.reward] = load_reward(dataset.reward)
    for loaded in named.values():
        rewards.caller(loaded, config.reward_timeout_s, log).probe()


def rollout_function(config: JobConfig):
    """rollout.function's function, or None for single-turn generation.

    Raises:
        ValueError: it cannot be imported or is not an async function.
    """
    if not config.rollout_function:
        return None
    from runtime.rl import custom_rollout

    return custom_rollout.load(config.rollout_function, spec_dir_of(config.job_dir))


def checkpoints_of(config: JobConfig, log=log) -> Checkpoints:
    """The job's checkpoint folders, the save folder (and its HF folders' folder, when the
    run writes HF folders) checked writable and with room for a save as large as the newest
    one there, before anything starts.

    Raises:
        CheckpointError: the save folder or HF folders' folder cannot be written, or its file
            system is too full.
    """
    checkpoints = Checkpoints(config.save_dir, config.load_dir, keep_last=config.keep_last,
                              log=log)
    checkpoints.check_writable()
    if config.save_hf_interval > 0:
        checkpoints.check_hf_writable()
    checkpoints.check_space()
    return checkpoints


def cpu_threads_per_actor(config: JobConfig) -> int:
    """CPU threads for each backend's torch: the node's cores shared by the actors that
    compute at the same time (colocated: the ranks, or the engines; disaggregated: all)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_node = {}
    for rank in config.ranks:
        per_node[rank["node"]] = per_node.get(rank["node"], 0) + 1
    if not config.colocate:
        for engine in config.engines:
            node = engine["gpus"][0]["node"]
            per_node[node] = per_node.get(node, 0) + 1
    return max(1, (cores or 1) // max(per_node.values()))


def _connect_ray() -> None:
    """The job's Ray cluster (RAY_ADDRESS, set by runtime/node/job.py), or the one this process
    already joined (tests)."""
    import ray

    if ray.is_initialized():
        return
    if not os.environ.get("RAY_ADDRESS"):
        raise RuntimeError("no Ray cluster: the driver runs inside a job (`vime submit`, "
                           "`vime submit --local`), which sets RAY_ADDRESS")
    with own_signal_handlers():  # a scancel still reaches the node's teardown
        ray.init(address=os.environ["RAY_ADDRESS"], logging_level="WARNING", log_to_driver=True)


def run(plan: dict, resolved_toml: str, job_dir: Path, resume: bool) -> None:
    """Run a job on the Ray cluster of RAY_ADDRESS: place the plan's GPUs, start the training
    ranks and the supervised engines, resume from the newest checkpoint when there is one,
    run the GRPO loop, then stop the actors and remove the placement group.

    Raises:
        RewardError: a reward server does not answer its probe (probe_rewards), before Ray.
        RuntimeError: RAY_ADDRESS is not set (the driver runs inside a job).
        FileNotFoundError, ValueError: as job_loop, for the tokenizer and rollout.function;
            a reward that cannot be imported.
        And whatever GRPOLoop.run raises; the actors are stopped first.
    """
    from runtime.node import placement
    from runtime.rl.asynchrony import loop_class
    from runtime.rl.loop import GRPOLoop
    from runtime.rl.metrics import MetricsLogger
    from runtime.workers import build, supervisor

    startup = Startup(log)
    started = startup.began
    config = JobConfig.from_job(plan, resolved_toml, job_dir)
    checkpoints = checkpoints_of(config)
    for kind, name in (("training", config.train_backend), ("rollout", config.rollout_backend)):
        backends.reference(kind, name)  # an unknown backend fails here, before any model loads
    load_reward = reward_loader(config)
    reward_fn = load_reward(config.reward)
    probe_rewards(config, reward_fn, load_reward)  # a dead server stops the job before Ray
    rollout_fn = rollout_function(config)
    tokenizer = load_tokenizer(config)
    prompts, dropped = read_prompts(config.data, tokenizer)
    log(f"vime: {len(prompts)} prompts from {config.data.prompt_data}"
        + (f" ({dropped} longer than rollout.max_prompt_len dropped)" if dropped else ""))
    sampler = PromptSampler(prompts, config.seed, config.data.shuffle)
    startup.mark("prepare")

    _connect_ray()
    group = placement.create(plan)
    log("vime: " + group.describe())
    startup.mark("ray")
    threads = cpu_threads_per_actor(config)
    train, rollout = build.ray_groups(config, group, threads, startup)
    loop: GRPOLoop | None = None  # built below, once the engines are supervised

    def restore_weights(engines) -> None:
        # a replaced engine gets the version the others serve (none before the first push)
        if loop is not None and loop.version:
            train.push_weights(engines, loop.version, config.weight_bucket_bytes)

    rollout = supervisor.supervise(rollout, config, group, threads, log=log,
                                   restore_weights=restore_weights)
    where = {"train": train.where(), "rollout": rollout.where(),
             "bundles": {f"{n},{g}": b for (n, g), b in group.by_gpu.items()},
             "colocate": config.colocate, "cpu_threads": threads}
    (config.job_dir / "placement.json").write_text(json.dumps(where, indent=1) + "\n")
    log(f"vime: {train.size} training rank(s) ({config.train_backend}) and {rollout.size} "
        f"engine(s) ({config.rollout_backend}), "
        f"{'colocated' if config.colocate else 'disaggregated'}, ready in "
        f"{time.perf_counter() - started:.1f} s")

    metrics = MetricsLogger(config.job_dir, config.job_dir.name, config.tensorboard_dir,
                            config.wandb_project, config.wandb_group,
                            config=dict(config.resolved), print_fn=log)
    loop = loop_class(config)(config, train, rollout, sampler, tokenizer, reward_fn, metrics,
                              checkpoints, log=log, rollout_fn=rollout_fn,
                              load_reward=load_reward, rewards_probed=True)
    restored = loop.restore()
    if resume and not restored:
        log(f"vime: asked to resume, but {config.load_dir} holds no checkpoint: starting fresh")
    startup.mark("loop_and_restore")
    metrics.attach(startup.numbers)  # the first record's, after the first push's mark
    try:
        loop.run()
    finally:
        for group_ in (train, rollout):
            try:
                group_.stop()
            except Exception as err:  # the job is ending anyway; say so, do not mask
                log(f"vime: stopping actors: {type(err).__name__}: {err}", file=sys.stderr)
        placement.remove(group)
    log(f"vime: done in {time.perf_counter() - started:.1f} s; checkpoints in {config.save_dir}")
