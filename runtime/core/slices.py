"""Typed slices of the plan: what each component of the runtime receives.

The driver reads plan.json and resolved.toml once (JobConfig.from_job) and hands each
training rank a TrainSlice and each rollout engine an EngineSlice: frozen data holding only
what that component needs. No component sees the whole spec, and nothing is changed at run
time (style.md, "the runtime gets slices").
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from runtime.core import weights
from vime.layout import Layout


@dataclass(frozen=True)
class ModelSlice:
    hf_checkpoint: str  # absolute when it exists (see resolve_path)
    arch: MappingProxyType  # HF config.json keys ([model.arch] of resolved.toml)
    random_init: bool  # build from arch with `seed` instead of loading hf_checkpoint
    seed: int
    # made by `vime convert`: the Megatron backend loads it under its own layout
    torch_dist_checkpoint: str | None = None


@dataclass(frozen=True)
class LossConfig:
    eps_clip: float = 0.2
    eps_clip_high: float = 0.28
    kl_loss_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    tis: bool = False
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    # algorithm.tis_level (token | sequence | geometric) and tis_mode (truncate | mask)
    tis_level: str = "token"
    tis_mode: str = "truncate"
    # algorithm.advantage_estimator: gspo also makes the loss's ratio sequence-level
    advantage_estimator: str = "grpo"
    loss_aggregation: str = "token-mean"
    # rollout.max_response_len: the constant seq-mean-token-sum-norm divides by
    max_response_len: int = 0


@dataclass(frozen=True)
class OptimizerSlice:
    lr: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    clip_grad: float
    # Adam's state and step on the host (megatron-core's HybridDeviceOptimizer)
    cpu_offload: bool = False
    overlap_cpu_optimizer_d2h_h2d: bool = False
    precision_aware: bool = False
    # the learning-rate schedule over optimizer steps (Megatron's --lr-warmup-iters,
    # --lr-decay-style, --lr-decay-iters, --min-lr; runtime/core/lr_schedule.py); the
    # defaults are a constant lr
    lr_warmup_iters: int = 0
    lr_decay_style: str = "constant"
    lr_decay_iters: int = 1
    min_lr: float = 0.0


@dataclass(frozen=True)
class TrainSlice:
    """One training rank: where it runs, its parallel coordinates and what it computes."""

    backend: str
    model: ModelSlice
    rank: int
    world_size: int
    node: int
    gpu: int
    coords: MappingProxyType  # this rank's Layout.coordinates: tp, cp, dp, pp, ep, etp, edp
    parallel: Layout  # the actor's sizes (a mapping of Layout's SIZES becomes one)
    master_addr: str
    master_port: int
    optimizer: OptimizerSlice
    loss: LossConfig
    temperature: float  # log-probs are of logits / temperature, as the rollout sampled
    micro_batch_size: int
    dynamic_batch: bool
    max_tokens_per_gpu: int
    needs_ref: bool  # keep the initial weights as the KL reference
    routing_replay: bool  # replay the rollout's routed experts (R3)
    recompute: str
    cpu_threads: int
    args: tuple[str, ...] = ()  # megatron.args of the job folder, for the Megatron backend
    # the rollout's top-p: below 1, log-probs are of the nucleus the engine sampled from,
    # renormalised (runtime/core/nucleus.py); a default, so slices built by hand
    # (benchmarks) keep the whole vocabulary
    top_p: float = 1.0
    # train.transformer_impl: the actor's layer spec, auto | transformer_engine | local (the
    # Megatron backend decides auto at start); a default for slices built by hand (benchmarks)
    transformer_impl: str = "auto"
    # train.pack_sequences: the Megatron backend runs each micro-batch as one packed row of its
    # samples (THD) where it can (cp = 1); the torch backend pads
    pack_sequences: bool = True
    # train.moe_token_dispatcher (alltoall | flex) and moe_flex_backend (deepep | hybridep):
    # how the Megatron backend's MoE layers move tokens (runtime/megatron/model.py,
    # choose_dispatcher); defaults for slices built by hand (benchmarks)
    moe_token_dispatcher: str = "alltoall"
    moe_flex_backend: str = "deepep"

    def __post_init__(self):
        if not isinstance(self.parallel, Layout):  # a slice built by hand from a mapping
            object.__setattr__(self, "parallel", Layout.from_plan(self.parallel))


@dataclass(frozen=True)
class EngineSlice:
    """One rollout engine: its GPUs, its vLLM layout and the model it serves."""

    backend: str
    engine: int
    gpus: tuple[tuple[int, int], ...]  # (node, gpu) in the plan's order
    tp: int
    dp: int
    ep: int
    model: ModelSlice
    max_model_len: int
    cpu_threads: int
    args: tuple[str, ...] = ()  # vllm.args of the job folder, for the vLLM backend
    # the placement-group bundles of `gpus`, in the same order (vLLM's Ray executor takes them
    # as VLLM_RAY_BUNDLE_INDICES; the engine's actor captures child tasks into the group)
    bundles: tuple[int, ...] = ()
    # the engine shares its GPUs with training ranks (train.colocate): vLLM's weight transfer
    # is then CUDA IPC, else NCCL; its Ray workers take a fraction of each GPU
    colocated: bool = False
    # set on the slice of one vLLM data-parallel rank of an engine (dp > 1, for_dp_rank):
    # gpus and bundles are then that rank's; dp_master is rank 0's address and a free port
    dp_rank: int | None = None
    dp_master: tuple[str, int] | None = None

    def rank_gpus(self, rank: int) -> range:
        """Positions in `gpus` of DP rank `rank`: its TP workers, rank after rank."""
        return range(rank * self.tp, (rank + 1) * self.tp)

    def for_dp_rank(self, rank: int, dp_master: tuple[str, int] | None) -> EngineSlice:
        """The slice of one DP rank of this engine: its GPUs and bundles only."""
        if self.dp_rank is not None or not 0 <= rank < self.dp:
            raise ValueError(f"engine {self.engine}: no DP rank {rank} (dp {self.dp})")
        if len(self.gpus) != self.tp * self.dp:
            raise ValueError(f"engine {self.engine}: {len(self.gpus)} GPUs for tp {self.tp} "
                             f"x dp {self.dp}")
        picked = self.rank_gpus(rank)
        return replace(self, gpus=tuple(self.gpus[i] for i in picked),
                       bundles=tuple(self.bundles[i] for i in picked) if self.bundles else (),
                       dp_rank=rank, dp_master=dp_master)


@dataclass(frozen=True)
class DataConfig:
    prompt_data: Path
    input_key: str
    label_key: str
    apply_chat_template: bool
    shuffle: bool
    max_prompt_len: int
    seed: int
    metadata_keys: tuple[str, ...] = ()  # data.metadata_keys


@dataclass(frozen=True)
class EvalDataset:
    """One [[eval.datasets]] table: its prompts (read like the training data) and sampling."""

    name: str
    data: DataConfig
    samples_per_prompt: int
    max_response_len: int
    temperature: float
    top_p: float
    reward: str


@dataclass(frozen=True)
class EvalConfig:
    datasets: tuple[EvalDataset, ...] = ()
    interval: int | None = None  # evaluate before rollout r when r % interval == 0
    at_start: bool = True
    at_end: bool = True


@dataclass(frozen=True)
class SamplingPolicy:
    """Which samples a rollout trains on: DAPO's dynamic sampling and overlong handling."""

    dynamic_sampling: bool = False
    dynamic_sampling_filter: str | None = None  # "module:function"
    over_sampling_batch_size: int = 0  # prompts per refill attempt
    max_attempts: int = 1
    # rollouts in a row that keep no group before the run stops with NoSignalError; 0: never
    max_empty_rollouts: int = 10
    overlong: str = "keep"  # keep | mask | penalty
    overlong_buffer_len: int = 1
    overlong_penalty_factor: float = 1.0


@dataclass(frozen=True)
class JobConfig:
    """What the driver itself reads: the loop's numbers, the data, the reward, checkpoint and
    logging settings, and the plan's placement. Components get slices made from it."""

    name: str
    seed: int
    num_rollout: int
    prompts_per_rollout: int
    samples_per_prompt: int
    global_batch_size: int
    steps_per_rollout: int
    temperature: float
    top_p: float
    max_response_len: int
    reward: str
    std_normalization: bool
    colocate: bool
    train_backend: str
    rollout_backend: str
    model: ModelSlice
    data: DataConfig
    loss: LossConfig
    optimizer: OptimizerSlice
    train: MappingProxyType  # [train] keys the slices need
    ranks: tuple[MappingProxyType, ...]  # plan.json train.ranks
    parallel: Layout  # plan.json train's sizes
    engines: tuple[MappingProxyType, ...]  # plan.json rollout.engines
    save_interval: int
    save_dir: Path
    load_dir: Path
    tensorboard_dir: Path | None
    wandb_project: str | None
    wandb_group: str | None
    job_dir: Path
    resolved: MappingProxyType = field(repr=False)
    megatron_args: tuple[str, ...] = ()
    vllm_args: tuple[str, ...] = ()
    # bytes per weight bucket, from plan.json's memory headroom (runtime/core/weights.py)
    weight_bucket_bytes: int = weights.BUCKET_FLOOR_BYTES
    reward_timeout_s: float = 300.0  # rollout.reward_timeout_s
    keep_last: int = 0  # checkpoint.keep_last
    async_save: bool = False  # checkpoint.async_save
    on_corrupt: str = "stop"  # checkpoint.on_corrupt
    save_hf_interval: int = 0  # checkpoint.save_hf_interval (0: no HF folders)
    evaluation: EvalConfig = EvalConfig()
    sampling: SamplingPolicy = SamplingPolicy()
    # colocated and both resident (plan.json colocation.mode, from train.offload and the
    # memory plan: vime/plan/colocation.py): no offload, no sleep
    resident: bool = False
    # rollout.function ("module:function", None: single-turn generation) and its limits
    rollout_function: str | None = None
    max_turns: int = 8
    max_total_tokens: int = 0  # 0: max_response_len
    function_timeout_s: float = 600.0
    # rollout.async: "one_step" generates rollout k+1 while the actor trains on rollout k
    # (runtime/rl/asynchrony.py); rollout.max_staleness bounds the versions a sample lags
    async_mode: str = "off"
    max_staleness: int = 1

    @property
    def takes_turns(self) -> bool:
        """Colocated and not resident: the actor offloads and the engines sleep while the other
        side computes."""
        return self.colocate and not self.resident

    @property
    def sample_tokens(self) -> int:
        """The most tokens after the prompt of one sample (every turn and tool output of a
        rollout function together)."""
        if self.rollout_function and self.max_total_tokens:
            return self.max_total_tokens
        return self.max_response_len

    # ------------------------------------------------------------------------------ build

    @staticmethod
    def from_job(plan: dict, resolved_toml: str, job_dir: Path) -> JobConfig:
        spec = tomllib.loads(resolved_toml)
        job_dir = Path(job_dir).resolve()
        spec_dir = _spec_dir(plan, job_dir)
        exp, model, data, rollout = spec["experiment"], spec["model"], spec["data"], spec["rollout"]
        train, algo, inference = spec["train"], spec["algorithm"], spec["inference"]
        logging = spec.get("logging", {})
        experiment_dir = job_dir.parent
        save_dir = _path(model.get("save"), spec_dir) or experiment_dir / "checkpoints"
        load_dir = _path(model.get("load"), spec_dir) or save_dir
        checkpoint = _path(model["hf_checkpoint"], spec_dir)
        model_slice = ModelSlice(
            hf_checkpoint=str(checkpoint if checkpoint.exists() else model["hf_checkpoint"]),
            arch=MappingProxyType(dict(model.get("arch", {}))),
            random_init=bool(model.get("random_init", False)), seed=int(exp["seed"]),
            torch_dist_checkpoint=(str(_path(model["torch_dist_checkpoint"], spec_dir))
                                   if model.get("torch_dist_checkpoint") else None))
        optimizer = train["optimizer"]
        tensorboard = logging.get("tensorboard_dir")
        return JobConfig(
            name=exp["name"], seed=int(exp["seed"]),
            num_rollout=int(rollout["num_rollout"]),
            prompts_per_rollout=int(rollout["batch_size"]),
            samples_per_prompt=int(rollout["n_samples_per_prompt"]),
            global_batch_size=int(train["global_batch_size"]),
            steps_per_rollout=int(train["steps_per_rollout"]),
            temperature=float(rollout["temperature"]), top_p=float(rollout["top_p"]),
            max_response_len=int(rollout["max_response_len"]),
            reward=rollout["reward"],
            std_normalization=bool(algo.get("std_normalization", True)),
            colocate=bool(plan["colocate"]),
            resident=bool(plan["colocate"])
            and (plan.get("colocation") or {}).get("mode") == "resident",
            train_backend=train["backend"], rollout_backend=inference["backend"],
            model=model_slice,
            data=DataConfig(
                prompt_data=_path(data["prompt_data"], spec_dir, must_exist=True),
                input_key=data["input_key"], label_key=data["label_key"],
                apply_chat_template=bool(data["apply_chat_template"]),
                shuffle=bool(data.get("shuffle", True)),
                max_prompt_len=int(rollout["max_prompt_len"]), seed=int(exp["seed"]),
                metadata_keys=tuple(data.get("metadata_keys") or ())),
            loss=LossConfig(
                eps_clip=float(algo["eps_clip"]), eps_clip_high=float(algo["eps_clip_high"]),
                kl_loss_coef=float(algo["kl_loss_coef"]),
                kl_estimator=algo.get("kl_estimator", "k3"),
                entropy_coef=float(algo["entropy_coef"]), tis=bool(algo.get("tis", False)),
                tis_clip=float(algo.get("tis_clip", 2.0)),
                tis_clip_low=float(algo.get("tis_clip_low", 0.0)),
                tis_level=algo.get("tis_level", "token"),
                tis_mode=algo.get("tis_mode", "truncate"),
                # job folders compiled before these keys existed have none: the defaults
                advantage_estimator=algo.get("advantage_estimator", "grpo"),
                loss_aggregation=algo.get("loss_aggregation", "token-mean"),
                max_response_len=int(rollout["max_response_len"])),
            optimizer=OptimizerSlice(
                lr=float(optimizer["lr"]), weight_decay=float(optimizer["weight_decay"]),
                adam_beta1=float(optimizer["adam_beta1"]),
                adam_beta2=float(optimizer["adam_beta2"]),
                clip_grad=float(optimizer.get("clip_grad", 1.0)),
                cpu_offload=bool(optimizer.get("cpu_offload", False)),
                overlap_cpu_optimizer_d2h_h2d=bool(optimizer.get("overlap_cpu_optimizer_d2h_h2d",
                                                                 False)),
                precision_aware=bool(optimizer.get("precision_aware", False)),
                lr_warmup_iters=int(optimizer.get("lr_warmup_iters", 0)),
                lr_decay_style=optimizer.get("lr_decay_style", "constant"),
                lr_decay_iters=int(optimizer.get("lr_decay_iters") or max(
                    int(rollout["num_rollout"]) * int(train["steps_per_rollout"]), 1)),
                min_lr=float(optimizer.get("min_lr", 0.0))),
            train=MappingProxyType({**{k: train[k] for k in (
                "micro_batch_size", "dynamic_batch", "max_tokens_per_gpu", "routing_replay",
                "recompute")},
                # job folders compiled before the key existed have none: the schema's default
                "transformer_impl": train.get("transformer_impl", "auto"),
                "balance_data": bool(train.get("balance_data", False)),
                "pack_sequences": train.get("pack_sequences", True),
                "moe_token_dispatcher": train.get("moe_token_dispatcher", "alltoall"),
                "moe_flex_backend": train.get("moe_flex_backend", "deepep")}),
            ranks=tuple(MappingProxyType(r) for r in plan["train"]["ranks"]),
            parallel=Layout.from_plan(plan["train"]),
            engines=tuple(MappingProxyType(e) for e in plan["rollout"]["engines"]),
            save_interval=int(spec["checkpoint"]["save_interval"]),
            save_dir=save_dir, load_dir=load_dir,
            tensorboard_dir=(_path(tensorboard, job_dir) if tensorboard else None),
            wandb_project=logging.get("wandb_project"), wandb_group=logging.get("wandb_group"),
            job_dir=job_dir, resolved=MappingProxyType(spec),
            megatron_args=_argfile(job_dir / "megatron.args"),
            vllm_args=_argfile(job_dir / "vllm.args"),
            weight_bucket_bytes=(weights.bucket_bytes(plan["memory"]) if plan.get("memory")
                                 else weights.BUCKET_FLOOR_BYTES),
            # job folders compiled before these keys existed have none: the schema's defaults
            reward_timeout_s=float(rollout.get("reward_timeout_s", 300.0)),
            keep_last=int(spec["checkpoint"].get("keep_last", 0)),
            async_save=bool(spec["checkpoint"].get("async_save", False)),
            on_corrupt=spec["checkpoint"].get("on_corrupt", "stop"),
            save_hf_interval=int(spec["checkpoint"].get("save_hf_interval", 0)),
            evaluation=_eval_config(spec, spec_dir),
            sampling=_sampling_policy(rollout),
            rollout_function=rollout.get("function"),
            max_turns=int(rollout.get("max_turns") or 8),
            max_total_tokens=int(rollout.get("max_total_tokens") or 0),
            function_timeout_s=float(rollout.get("function_timeout_s") or 600.0),
            async_mode=rollout.get("async", "off"),
            max_staleness=int(rollout.get("max_staleness", 1)),
        )

    # ----------------------------------------------------------------------------- slices

    @property
    def needs_ref(self) -> bool:
        return self.loss.kl_loss_coef > 0

    def train_slice(self, rank: int, master_addr: str, master_port: int,
                    cpu_threads: int) -> TrainSlice:
        entry = self.ranks[rank]
        return TrainSlice(
            backend=self.train_backend, model=self.model, rank=rank,
            world_size=len(self.ranks), node=entry["node"], gpu=entry["gpu"],
            coords=MappingProxyType(self.parallel.coordinates(rank)), parallel=self.parallel,
            master_addr=master_addr, master_port=master_port, optimizer=self.optimizer,
            loss=self.loss, temperature=self.temperature,
            micro_batch_size=int(self.train["micro_batch_size"]),
            dynamic_batch=bool(self.train["dynamic_batch"]),
            max_tokens_per_gpu=int(self.train["max_tokens_per_gpu"]),
            needs_ref=self.needs_ref, routing_replay=bool(self.train["routing_replay"]),
            recompute=str(self.train["recompute"]), cpu_threads=cpu_threads,
            args=self.megatron_args, top_p=self.top_p,
            transformer_impl=str(self.train["transformer_impl"]),
            pack_sequences=bool(self.train["pack_sequences"]),
            moe_token_dispatcher=str(self.train["moe_token_dispatcher"]),
            moe_flex_backend=str(self.train["moe_flex_backend"]))

    @property
    def max_model_len(self) -> int:
        """The engines' context: the longest prompt plus the longest response of the rollout
        (a rollout function's: max_total_tokens) and of the evaluation datasets
        (vime/resolve/spec.py, Spec.max_model_len)."""
        return self.data.max_prompt_len + max(
            [self.sample_tokens, *(d.max_response_len for d in self.evaluation.datasets)])

    def engine_slice(self, index: int, cpu_threads: int,
                     bundles: tuple[int, ...] = ()) -> EngineSlice:
        entry = self.engines[index]
        return EngineSlice(
            backend=self.rollout_backend, engine=index,
            gpus=tuple((g["node"], g["gpu"]) for g in entry["gpus"]),
            tp=entry["tp"], dp=entry["dp"], ep=entry["ep"], model=self.model,
            max_model_len=self.max_model_len,
            cpu_threads=cpu_threads, args=self.vllm_args, bundles=tuple(bundles),
            colocated=self.colocate)

    def with_overrides(self, **changes: Any) -> JobConfig:
        return replace(self, **changes)


def _eval_config(spec: dict, spec_dir: Path) -> EvalConfig:
    """[eval] of resolved.toml (job folders compiled before it existed have none)."""
    section, data, rollout = spec.get("eval", {}), spec["data"], spec["rollout"]
    datasets = tuple(EvalDataset(
        name=d["name"],
        data=DataConfig(prompt_data=_path(d["prompt_data"], spec_dir, must_exist=True),
                        input_key=d.get("input_key", data["input_key"]),
                        label_key=d.get("label_key", data["label_key"]),
                        apply_chat_template=bool(data["apply_chat_template"]), shuffle=False,
                        max_prompt_len=int(rollout["max_prompt_len"]),
                        seed=int(spec["experiment"]["seed"])),
        samples_per_prompt=int(d.get("n_samples_per_prompt", 1)),
        max_response_len=int(d.get("max_response_len", rollout["max_response_len"])),
        temperature=float(d.get("temperature", rollout["temperature"])),
        top_p=float(d.get("top_p", rollout["top_p"])),
        reward=d.get("reward", rollout["reward"])) for d in section.get("datasets", []))
    interval = section.get("interval")
    return EvalConfig(datasets=datasets, interval=int(interval) if interval else None,
                      at_start=bool(section.get("at_start", True)),
                      at_end=bool(section.get("at_end", True)))


def _sampling_policy(rollout: dict) -> SamplingPolicy:
    """Dynamic sampling and overlong keys of [rollout] (absent in older job folders)."""
    return SamplingPolicy(
        dynamic_sampling=bool(rollout.get("dynamic_sampling", False)),
        dynamic_sampling_filter=rollout.get("dynamic_sampling_filter"),
        over_sampling_batch_size=int(rollout.get("over_sampling_batch_size",
                                                 rollout["batch_size"])),
        max_attempts=int(rollout.get("dynamic_sampling_max_attempts", 1)),
        max_empty_rollouts=int(rollout.get("dynamic_sampling_max_empty_rollouts", 10)),
        overlong=rollout.get("overlong", "keep"),
        overlong_buffer_len=int(rollout.get("overlong_buffer_len",
                                            max(int(rollout["max_response_len"]) // 5, 1))),
        overlong_penalty_factor=float(rollout.get("overlong_penalty_factor", 1.0)))


# ------------------------------------------------------------------------------------ paths

def _spec_dir(plan: dict, job_dir: Path) -> Path:
    """The spec's folder: relative paths in a spec are read from there, as the compiler
    reads model.hf_checkpoint. plan.json names the spec as it was given to `vime submit`,
    relative to the folder it ran in, which is this process's folder on `--local`."""
    name = plan.get("spec")
    if name:
        candidate = Path(name)
        if candidate.is_absolute() and candidate.exists():
            return candidate.parent
        if (Path.cwd() / candidate).exists():
            return (Path.cwd() / candidate).parent
    return Path.cwd()


def _path(value: str | None, base: Path, must_exist: bool = False) -> Path | None:
    """Absolute paths as they are; relative ones from base, else from the working folder."""
    if value is None:
        return None
    path = Path(os.path.expanduser(value))
    if path.is_absolute():
        found = path
    elif (base / path).exists() or not (Path.cwd() / path).exists():
        found = (base / path).resolve()
    else:
        found = (Path.cwd() / path).resolve()
    if must_exist and not found.exists():
        raise FileNotFoundError(f"{value}: no such file (looked in {base} and {Path.cwd()})")
    return found


def compiled(spec_path: Path, sets=()):
    """A spec compiled in this process: the pipeline's result, the spec's text and its plan
    object (plan.json). A spec with errors raises ValueError listing them."""
    from vime import pipeline
    from vime.emit import plan_json
    from vime.parse import Source

    spec_path = Path(spec_path)
    text = spec_path.read_text()
    result = pipeline.run(Source(str(spec_path), text), list(sets), spec_path.parent)
    if not result.ok:
        raise ValueError("the spec has errors:\n  " + "\n  ".join(
            f"{d.code}: {d.message}" for d in result.diagnostics if d.severity == "error"))
    obj = plan_json.plan_object(str(spec_path), result.diagnostics, result.spec, result.plan)
    return result, text, obj


def compile_job(spec_path: Path, sets=()) -> dict[str, str]:
    """A spec compiled in this process into the files `vime submit` puts in a job folder
    (vime/launch/submit.py: plan.json, resolved.toml, the argument files), for runs and tests
    that do not go through `vime submit` (runtime/node/torchrun.py). A spec with errors raises
    ValueError listing them."""
    from vime.emit import build

    result, text, obj = compiled(spec_path, sets)
    return build.files(result.plan, str(spec_path), text, obj, "<job folder>")


def _argfile(path: Path) -> tuple[str, ...]:
    if not path.is_file():
        return ()
    import shlex

    return tuple(shlex.split(path.read_text(), comments=False))  # vime/emit/argfile.py
