"""The resolved spec: frozen dataclasses, one per TOML section, every value filled in.

Field names are the spec's key names (schema/vime.schema.json); tests/test_schema.py keeps
the two trees identical. `Spec.origins` says where every value came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from vime.diagnostics import Location
from vime.layout import Layout
from vime.resolve.model import Arch
from vime.run_checkpoint import RECORD_FILE


def spec_key(attribute) -> str:
    """The spec's key of a dataclass field: its name, or metadata["key"] where the key is not a
    Python name (rollout.async)."""
    return attribute.metadata.get("key", attribute.name)


@dataclass(frozen=True)
class Origin:
    """Where a value came from: the spec file, a --set, a default, a preset, or a derivation."""

    kind: Literal["spec", "set", "default", "derived", "preset", "config.json", "arch"]
    detail: str = ""
    location: Location | None = None

    def describe(self) -> str:
        if self.location is not None:
            where = f"{self.location.file}:{self.location.line}"
            return f"{self.kind} ({where})" if self.kind != "spec" else where
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


@dataclass(frozen=True)
class Experiment:
    name: str
    output_dir: str
    seed: int


@dataclass(frozen=True)
class Slurm:
    partition: str | None
    account: str | None
    qos: str | None
    constraint: str | None
    reservation: str | None
    time: str
    exclusive: bool
    extra_args: tuple[str, ...]
    cpus_per_task: int | None


@dataclass(frozen=True)
class Ray:
    port: int
    dashboard_host: str
    dashboard_port: int
    startup_timeout_s: int


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu: str
    gpu_memory_gib: float | None
    host_memory_gib: float | None
    slurm: Slurm
    ray: Ray
    env: dict[str, str]

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Model:
    hf_checkpoint: str
    torch_dist_checkpoint: str | None
    load: str | None
    save: str | None
    preset: str | None
    arch: dict  # the [model.arch] overrides as written
    random_init: bool


@dataclass(frozen=True)
class Data:
    prompt_data: str
    input_key: str
    label_key: str
    apply_chat_template: bool
    shuffle: bool
    # keys of each row handed to a rollout function and the reward (None: none)
    metadata_keys: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Rollout:
    num_rollout: int
    batch_size: int
    n_samples_per_prompt: int
    max_prompt_len: int
    max_response_len: int
    temperature: float
    top_p: float
    reward: str
    reward_timeout_s: float
    dynamic_sampling: bool
    dynamic_sampling_filter: str | None
    over_sampling_batch_size: int
    dynamic_sampling_max_attempts: int
    overlong: str  # keep | mask | penalty
    overlong_buffer_len: int
    overlong_penalty_factor: float
    # a rollout function "module:function" and its limits (None: single-turn generation)
    function: str | None = None
    max_turns: int | None = None
    max_total_tokens: int | None = None
    function_timeout_s: float | None = None
    # "off" | "one_step": rollout k+1 generates while the actor trains on rollout k. The spec's
    # key is `async`, a Python keyword (spec_key)
    async_mode: str = field(default="off", metadata={"key": "async"})
    max_staleness: int = 1  # weight versions a trained sample may lag
    # rollouts in a row that keep no group before the run stops (0: never)
    dynamic_sampling_max_empty_rollouts: int = 10

    @property
    def sample_tokens(self) -> int:
        """The most tokens after the prompt of one sample: max_response_len, or with a
        rollout function max_total_tokens (every turn and tool output together)."""
        if self.function and self.max_total_tokens:
            return self.max_total_tokens
        return self.max_response_len


@dataclass(frozen=True)
class EvalDataset:
    name: str
    prompt_data: str
    input_key: str
    label_key: str
    n_samples_per_prompt: int
    max_response_len: int
    temperature: float
    top_p: float
    reward: str


@dataclass(frozen=True)
class Eval:
    interval: int | None
    at_start: bool
    at_end: bool
    datasets: tuple[EvalDataset, ...]


@dataclass(frozen=True)
class Parallel:
    tp: int
    sequence_parallel: bool
    pp: int
    cp: int
    ep: int
    etp: int
    # decoder layers of the first and last pipeline stages where they differ from the rest
    # (--decoder-first/last-pipeline-num-layers); None: layers ÷ pp like the others
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None


@dataclass(frozen=True)
class Optimizer:
    lr: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    clip_grad: float
    distributed: bool
    cpu_offload: bool
    overlap_cpu_optimizer_d2h_h2d: bool
    precision_aware: bool
    lr_warmup_iters: int
    lr_decay_style: str  # constant | linear | cosine (--lr-decay-style)
    lr_decay_iters: int  # derived: the run's optimizer steps
    min_lr: float


@dataclass(frozen=True)
class Train:
    backend: str
    global_batch_size: int
    steps_per_rollout: int
    micro_batch_size: int
    dynamic_batch: bool
    max_tokens_per_gpu: int
    balance_data: bool  # tokens, not samples, split evenly over data-parallel ranks
    colocate: bool
    routing_replay: bool
    num_gpus: int
    recompute: str
    offload: str  # auto | always | never: taking turns on a colocated GPU (vime/plan/colocation.py)
    transformer_impl: str  # auto | transformer_engine | local (--transformer-impl)
    pack_sequences: bool  # Megatron backend, cp = 1: a micro-batch as one packed row (THD)
    moe_token_dispatcher: str  # alltoall | flex (--moe-token-dispatcher-type)
    moe_flex_backend: str  # deepep | hybridep, with flex (--moe-flex-dispatcher-backend)
    routing_imbalance: float
    parallel: Parallel
    optimizer: Optimizer
    extra_args: tuple[str, ...] = ()  # raw Megatron-LM flags, after vime's own (V540-V542)


@dataclass(frozen=True)
class Algorithm:
    name: str
    advantage_estimator: str  # grpo | gspo | reinforce_plus_plus | ..._baseline | rloo
    eps_clip: float
    eps_clip_high: float
    kl_loss_coef: float
    kl_estimator: str
    entropy_coef: float
    std_normalization: bool
    loss_aggregation: str  # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm
    tis: bool
    tis_clip: float
    tis_clip_low: float
    tis_level: str = "token"  # token | sequence | geometric
    tis_mode: str = "truncate"  # truncate | mask


@dataclass(frozen=True)
class Eplb:
    enabled: bool
    num_redundant_experts: int
    window_size: int
    step_interval: int


@dataclass(frozen=True)
class Inference:
    backend: str
    gpus_per_engine: int
    num_gpus: int
    data_parallel_size: int
    expert_parallel: bool
    gpu_memory_utilization: float
    cudagraph_capture_sizes: tuple[int, ...] | None
    moe_backend: str
    extra_args: tuple[str, ...]
    eplb: Eplb
    quantization: str = "none"  # the engines' weights: none (bf16) | fp8 | int4 (V124)


@dataclass(frozen=True)
class Checkpoint:
    save_interval: int
    keep_last: int
    on_corrupt: str
    save_hf_interval: int
    async_save: bool


@dataclass(frozen=True)
class Logging:
    wandb_project: str | None
    wandb_group: str | None
    tensorboard_dir: str | None


@dataclass(frozen=True)
class Derived:
    """Numbers that are not keys but follow from them (resolve computes, check verifies)."""

    world_size: int  # the cluster's GPUs
    layout: Layout  # the actor's: train.num_gpus ranks in train.parallel's sizes
    vllm_tp: int  # gpus_per_engine ÷ data_parallel_size
    vllm_ep: int  # vLLM's EP group = TP × DP when expert_parallel, else 1
    num_engines: int
    samples_per_rollout: int
    gpu_memory_gib: float | None  # from cluster.gpu_memory_gib or the card table

    @property
    def dp(self) -> int:
        """Megatron data parallel, excluding cp."""
        return self.layout.dp

    @property
    def edp(self) -> int:
        """Megatron expert data parallel."""
        return self.layout.edp


@dataclass(frozen=True)
class SavedLayout:
    """The parallel layout a torch_dist checkpoint was saved with, as its vime_layout.json
    says (runtime/megatron/convert.py writes it), read where vime runs."""

    folder: str  # model.torch_dist_checkpoint, relative paths taken from the spec's folder
    sizes: dict[str, int] | None  # tp, pp, ep, etp; None when the layout is unknown
    problem: str | None = None  # why it is unknown


@dataclass(frozen=True)
class ResumeCheckpoint:
    """The checkpoint a submit of this spec would resume from, with the vime_checkpoint.json
    the runtime wrote into it (vime/run_checkpoint.py), read where vime runs."""

    checkpoint: str  # the checkpoint folder a resume loads
    folder_key: str  # the key that names its folder: model.load, model.save or experiment.output_dir
    record: dict | None  # None when it cannot be used (problem says why)
    problem: str | None = None

    @property
    def record_path(self) -> str:
        return f"{self.checkpoint}/{RECORD_FILE}"


@dataclass(frozen=True)
class HfFolder:
    """model.hf_checkpoint on the machine vime runs on, looked for as the runtime does
    (runtime/core/slices.py, _path): a relative path from the spec's folder, else from the
    folder vime runs in."""

    path: str  # absolute: where it was found, or the spec's folder's candidate
    exists: bool
    relative: bool  # written as a relative path (a Hugging Face model id reads as one)
    tokenizer: bool  # holds tokenizer.json or tokenizer_config.json, which the driver loads


@dataclass(frozen=True)
class PromptSample:
    """The first records of a prompt file, read where vime runs when the file is there."""

    path: str
    records: int  # how many were read
    line: int | None = None  # the first line with a problem
    problem: str | None = None  # "not JSON: ...", "not a JSON object"
    keys: tuple[str, ...] = ()  # the keys of the record at `line` (or of the first record)
    missing: tuple[str, ...] = ()  # data.input_key / data.label_key that record lacks
    # the first record whose prompt the driver cannot render: its line and what the prompt is
    # ("null, not a string or a list of chat messages")
    prompt_line: int | None = None
    prompt_problem: str | None = None


@dataclass(frozen=True)
class PromptFile:
    """A prompt file the driver reads (data.prompt_data, each [[eval.datasets]] table's),
    looked for on the machine vime runs on as the runtime looks (runtime/core/slices.py,
    _path): a relative path from the spec's folder, else from the folder vime runs in."""

    key: str  # the key that names it: data.prompt_data, eval.datasets[0].prompt_data
    path: str  # absolute: where it was found, or the spec's folder's candidate
    exists: bool
    relative: bool  # written as a relative path
    sample: PromptSample | None  # None when it is not readable here


@dataclass(frozen=True)
class RunFolders:
    """The folders a run of this spec writes, absolute, as `vime submit` run here makes them
    (vime/launch/submit.py, experiment_dir; vime/launch/paths.py)."""

    experiment: str  # <experiment.output_dir>/<experiment.name>: job folders, logs, the lock
    checkpoints: str  # model.save, else <experiment>/checkpoints
    checkpoints_key: str  # the key that names the checkpoint folder


@dataclass(frozen=True)
class ModelConfig:
    """The model's config.json (or preset) as read, before [model.arch] is applied: what the
    support matrix (V102) and the contradiction rule (V103) read. vLLM serves this file."""

    values: dict
    origin: Origin  # config.json (its path), a preset, or [model.arch] alone (values empty)


@dataclass(frozen=True)
class Spec:
    experiment: Experiment
    cluster: Cluster
    model: Model
    data: Data
    rollout: Rollout
    train: Train
    algorithm: Algorithm
    inference: Inference
    checkpoint: Checkpoint
    logging: Logging
    eval: Eval
    arch: Arch | None  # None when neither config.json, a preset nor [model.arch] says
    derived: Derived
    # (key path, why) when no architecture could be read; check reports it (V101)
    arch_problem: tuple[str, str] | None = None
    # None when no torch_dist checkpoint is set or its folder is not on this machine
    torch_dist_layout: SavedLayout | None = None
    # None when the folder a resume reads holds no checkpoint, or one without a record
    resume_checkpoint: ResumeCheckpoint | None = None
    # None when neither config.json nor a preset was read
    model_config: ModelConfig | None = field(default=None, compare=False)
    # model.hf_checkpoint as found on this machine
    hf_folder: HfFolder | None = field(default=None, compare=False)
    # data.prompt_data, then each [[eval.datasets]] table's prompt_data, as found here
    prompt_files: tuple[PromptFile, ...] = field(default=(), compare=False)
    # the folders a run writes, as `vime submit` run in this folder makes them
    run_folders: RunFolders | None = field(default=None, compare=False)
    # the spec file's folder: relative paths and rollout.reward's module are read from there
    spec_dir: str | None = field(default=None, compare=False)
    # the spec file and its --set arguments as given, for help lines that print a command
    invocation: tuple[str, ...] = field(default=(), compare=False)
    origins: dict[str, Origin] = field(default_factory=dict, compare=False)

    def origin(self, key: str) -> Origin:
        return self.origins.get(key, Origin("default"))

    @property
    def prompt_sample(self) -> PromptSample | None:
        """The first records of data.prompt_data; None when it is not readable here."""
        return self.prompt_files[0].sample if self.prompt_files else None

    @property
    def max_model_len(self) -> int:
        """The engines' context (vLLM --max-model-len): the longest prompt plus the longest
        response of the rollout (with a rollout function, max_total_tokens: every turn and
        tool output) or of any evaluation dataset."""
        return self.rollout.max_prompt_len + max(
            [self.rollout.sample_tokens, *(d.max_response_len for d in self.eval.datasets)])


SECTIONS = {
    "experiment": Experiment, "cluster": Cluster, "model": Model, "data": Data,
    "rollout": Rollout, "train": Train, "algorithm": Algorithm, "inference": Inference,
    "checkpoint": Checkpoint, "logging": Logging, "eval": Eval,
}
