"""The one table from upstream vime's and slime's train.py flags to spec keys.

`vime import` maps a script's flags through FLAGS (vime/importer/__init__.py,
vime/importer/mapping.py), docs/import.md is generated from the same rows
(`python -m vime.importer.docs`), and `vime explain` reads its codes. What each kind of row
says and how a flag without a row is judged: docs/design.md, "The import table".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # option strings; the first is shown
    kind: str  # key | arch | cluster | joint | derived | not_yet | none
    key: str = ""  # key / arch / cluster / joint: the spec key; not_yet: the key it will be
    value: str = "str"  # str int float true false ints choice reward reward_name function json
    # layer_freq pairs save_hf, set:VALUE (a switch that sets the key to VALUE)
    severity: str = "error"  # derived/not_yet/none: the diagnostic's severity
    why: str = ""  # the report's explanation and the docs' text
    expect: tuple[str, ...] = ()  # derived: the values vime uses
    choices: dict | None = None  # value == "choice": upstream value -> spec value
    # whose parser has it: slime (and upstream vime), vime, megatron, vllm, sglang, or
    # slime-mis (a key of slime's MIS example, MIS_EXAMPLE_OPTIONS)
    source: str = "slime"
    beyond: str = ""  # choice / derived: the key being added for the other values (V964)
    mismatch: str = "error"  # derived: the severity of a value other than expect's (V963)
    # the [model.arch] key the flag sets in a DeepSeek-V3 or GLM-4.5 model, and how its words
    # read: KEY:int, KEY:float, KEY:str, KEY:true, KEY:VALUE (a switch), n_shared_experts:shared
    # (the shared experts' width ÷ each expert's); vime/importer/family.py
    family: str = ""

    @property
    def name(self) -> str:
        return self.names[0]


def key(names, spec_key, value="str", source="slime", why="", choices=None, beyond="") -> Flag:
    names = (names,) if isinstance(names, str) else names
    return Flag(names, "key", spec_key, value, why=why, choices=choices, source=source,
                beyond=beyond)


def arch(names, spec_key, value="int", why="") -> Flag:
    names = (names,) if isinstance(names, str) else names
    return Flag(names, "arch", spec_key, value, why=why, source="megatron")


def derived(names, why, expect=(), source="megatron", value="str", beyond="",
            mismatch="error", family="") -> Flag:
    names = (names,) if isinstance(names, str) else names
    return Flag(names, "derived", value=value, severity="note", why=why, expect=tuple(expect),
                source=source, beyond=beyond, mismatch=mismatch, family=family)


def not_yet(names, planned, why, severity="error", source="slime") -> Flag:
    names = (names,) if isinstance(names, str) else names
    return Flag(names, "not_yet", planned, severity=severity, why=why, source=source)


def none(names, why, severity="error", source="slime", family="") -> Flag:
    names = (names,) if isinstance(names, str) else names
    return Flag(names, "none", severity=severity, why=why, source=source, family=family)


QWEN3 = "vime builds Qwen3 / Qwen3-MoE layers this way from the architecture"
FAMILY = ("a setting of the DeepSeek-V3 and GLM-4.5 families, written to [model.arch] when the "
          "model args show one (V975 when they show a family vime does not build)")

# The keys of slime's MIS example (THUDM/slime examples/train_infer_mismatch_helper/mis.yaml
# at 624b824a, read by its compute_mis_weights_with_cp through --custom-config-path and
# --custom-tis-function-path), which its README.md and users' scripts write as flags; slime's
# train.py parser has none of them.
MIS_EXAMPLE_OPTIONS = ("--tis-level", "--tis-mode", "--tis-lower-bound", "--tis-upper-bound",
                       "--tis-batch-normalize", "--use-rs", "--rs-level", "--rs-lower-bound",
                       "--rs-upper-bound", "--rs-veto-threshold")
# slime's MIS example's functions (mis.py), named as a dotted path or as path.py:function
MIS_FUNCTIONS = tuple(
    f"{module}{function}"
    for module in ("examples.train_infer_mismatch_helper.mis.",
                   "examples/train_infer_mismatch_helper/mis.py:")
    for function in ("compute_mis_weights_with_cp", "compute_mis_weights"))

FLAGS: tuple[Flag, ...] = (
    # cluster and placement (vime/importer/__init__.py's _cluster combines them)
    Flag(("--actor-num-nodes",), "cluster", "cluster.nodes", "int",
         why="with --colocate the cluster's nodes; without, the actor's nodes (train.num_gpus)"),
    Flag(("--actor-num-gpus-per-node",), "cluster", "cluster.gpus_per_node", "int"),
    Flag(("--rollout-num-gpus",), "cluster", "inference.num_gpus", "int",
         why="ignored with --colocate (the engines share every actor GPU)"),
    Flag(("--colocate",), "cluster", "train.colocate", "true"),
    Flag(("--num-gpus-per-node",), "cluster", "cluster.gpus_per_node", "int",
         why="the rollout's GPUs per node; vime has one cluster.gpus_per_node"),
    key("--rollout-num-gpus-per-engine", "inference.gpus_per_engine", "int"),
    # model and checkpoints
    key("--hf-checkpoint", "model.hf_checkpoint"),
    key("--ref-load", "model.torch_dist_checkpoint",
        why="the reference and initial weights (torch_dist)"),
    key("--load", "model.load", source="megatron"),
    key("--save", "model.save", source="megatron"),
    key("--save-interval", "checkpoint.save_interval", "int", source="megatron"),
    key("--train-backend", "train.backend", "choice", choices={"megatron": "megatron"}),
    key("--seed", "experiment.seed", "int", source="megatron"),
    # data and rollout
    key("--prompt-data", "data.prompt_data"),
    key("--input-key", "data.input_key"),
    key("--label-key", "data.label_key"),
    key("--apply-chat-template", "data.apply_chat_template", "true"),
    key("--rollout-shuffle", "data.shuffle", "true"),
    key("--num-rollout", "rollout.num_rollout", "int"),
    key("--rollout-batch-size", "rollout.batch_size", "int"),
    key("--n-samples-per-prompt", "rollout.n_samples_per_prompt", "int"),
    key("--rollout-max-prompt-len", "rollout.max_prompt_len", "int"),
    key("--rollout-max-response-len", "rollout.max_response_len", "int"),
    key("--rollout-temperature", "rollout.temperature", "float"),
    key("--rollout-top-p", "rollout.top_p", "float"),
    key("--rm-type", "rollout.reward", "reward_name",
        why="a built-in reward of vime (vime/rewards.py); another name is V963"),
    key("--custom-rm-path", "rollout.reward", "reward",
        why="module.path.function becomes module.path:function"),
    # the actor's batch
    key("--global-batch-size", "train.global_batch_size", "int", source="megatron"),
    key("--micro-batch-size", "train.micro_batch_size", "int", source="megatron"),
    key("--num-steps-per-rollout", "train.steps_per_rollout", "int"),
    key("--use-dynamic-batch-size", "train.dynamic_batch", "true"),
    key("--max-tokens-per-gpu", "train.max_tokens_per_gpu", "int"),
    key("--balance-data", "train.balance_data", "true"),
    key("--use-rollout-routing-replay", "train.routing_replay", "true",
        why="R3: the rollout's routed experts replayed in training"),
    key("--recompute-granularity", "train.recompute", "choice", source="megatron",
        choices={"full": "full", "selective": "selective"}),
    key("--transformer-impl", "train.transformer_impl", "choice", source="megatron",
        choices={"transformer_engine": "transformer_engine", "local": "local"}),
    # the actor's layout
    key("--tensor-model-parallel-size", "train.parallel.tp", "int", source="megatron"),
    key("--pipeline-model-parallel-size", "train.parallel.pp", "int", source="megatron"),
    key("--context-parallel-size", "train.parallel.cp", "int", source="megatron"),
    key("--expert-model-parallel-size", "train.parallel.ep", "int", source="megatron"),
    key("--expert-tensor-parallel-size", "train.parallel.etp", "int", source="megatron"),
    key("--sequence-parallel", "train.parallel.sequence_parallel", "true", source="megatron"),
    key("--decoder-first-pipeline-num-layers", "train.parallel.first_stage_layers", "int",
        source="megatron"),
    key("--decoder-last-pipeline-num-layers", "train.parallel.last_stage_layers", "int",
        source="megatron"),
    # optimizer
    key("--lr", "train.optimizer.lr", "float", source="megatron"),
    key("--weight-decay", "train.optimizer.weight_decay", "float", source="megatron"),
    key("--adam-beta1", "train.optimizer.adam_beta1", "float", source="megatron"),
    key("--adam-beta2", "train.optimizer.adam_beta2", "float", source="megatron"),
    key("--clip-grad", "train.optimizer.clip_grad", "float", source="megatron"),
    key("--use-distributed-optimizer", "train.optimizer.distributed", "true", source="megatron"),
    key("--optimizer-cpu-offload", "train.optimizer.cpu_offload", "true", source="megatron"),
    key("--overlap-cpu-optimizer-d2h-h2d", "train.optimizer.overlap_cpu_optimizer_d2h_h2d",
        "true", source="megatron"),
    key("--use-precision-aware-optimizer", "train.optimizer.precision_aware", "true",
        source="megatron"),
    derived("--optimizer", "vime's actor uses Adam (AdamW with weight decay)", ("adam",)),
    key("--lr-decay-style", "train.optimizer.lr_decay_style", "choice", source="megatron",
        choices={"constant": "constant", "linear": "linear", "cosine": "cosine"},
        why="inverse-square-root and WSD have no equivalent"),
    key("--lr-warmup-iters", "train.optimizer.lr_warmup_iters", "int", source="megatron"),
    key("--min-lr", "train.optimizer.min_lr", "float", source="megatron"),
    key("--lr-decay-iters", "train.optimizer.lr_decay_iters", "int", source="megatron"),
    derived("--lr-warmup-init", "vime's warmup starts from a learning rate of 0", ("0", "0.0")),
    none(("--lr-warmup-fraction", "--lr-warmup-samples", "--lr-decay-samples"),
         "vime counts the schedule in optimizer steps: set train.optimizer.lr_warmup_iters and "
         "lr_decay_iters (a fraction of the run: that fraction of rollout.num_rollout × "
         "train.steps_per_rollout)", source="megatron"),
    # algorithm
    key("--advantage-estimator", "algorithm.advantage_estimator", "choice",
        choices={name: name for name in ("grpo", "gspo", "reinforce_plus_plus",
                                         "reinforce_plus_plus_baseline", "rloo")},
        why="ppo (a critic) and cispo have no equivalent"),
    key("--eps-clip", "algorithm.eps_clip", "float"),
    key("--eps-clip-high", "algorithm.eps_clip_high", "float"),
    key("--kl-loss-coef", "algorithm.kl_loss_coef", "float",
        why="only with --use-kl-loss; without it the coefficient is 0"),
    key("--kl-loss-type", "algorithm.kl_estimator", "choice",
        choices={"k1": "k1", "k2": "k2", "k3": "k3", "low_var_kl": "k3"},
        why="low_var_kl is the k3 estimator"),
    derived("--use-kl-loss", "a KL loss is on when algorithm.kl_loss_coef > 0", source="slime"),
    derived("--kl-coef", "the KL penalty in the reward, which 0 turns off; vime has no KL in "
            "the reward (its KL is the loss's: --use-kl-loss, algorithm.kl_loss_coef)", ("0",),
            source="slime"),
    key("--entropy-coef", "algorithm.entropy_coef", "float"),
    key("--disable-grpo-std-normalization", "algorithm.std_normalization", "false"),
    key("--use-tis", "algorithm.tis", "true",
        why="slime's vanilla TIS: each token's ratio truncated to [--tis-clip-low, "
        "--tis-clip] (0 and 2 without them, as vime's defaults), the token level"),
    key("--tis-clip", "algorithm.tis_clip", "float"),
    key("--tis-clip-low", "algorithm.tis_clip_low", "float"),
    derived("--custom-tis-function-path", "slime's MIS example (examples/"
            "train_infer_mismatch_helper/mis.py) is vime's TIS with algorithm.tis_level and "
            "tis_mode (--tis-level, --tis-mode, --tis-lower-bound, --tis-upper-bound); its "
            "rejection sampling (--use-rs) and batch normalisation have no key. Another "
            "function has no equivalent: vime's TIS is token, sequence or geometric weights, "
            "truncated or masked (slime's icepop_function is tis_mode = \"mask\")",
            MIS_FUNCTIONS, source="slime"),
    key("--tis-level", "algorithm.tis_level", "choice", source="slime-mis",
        choices={"token": "token", "sequence": "sequence", "geometric": "geometric"},
        why="the ratio of the TIS weight: each token's, the product of a sample's "
        "(sequence) or their geometric mean (geometric)"),
    key("--tis-mode", "algorithm.tis_mode", "choice", source="slime-mis",
        choices={"truncate": "truncate", "clip": "truncate", "mask": "mask"},
        why="truncate and clip truncate to [tis_clip_low, tis_clip]; mask gives a weight "
        "outside them 0. slime's clip and mask take 1 / --tis-upper-bound as the lower bound "
        "when --tis-lower-bound is not given and its truncate takes 0: vime's tis_clip_low is "
        "what --tis-lower-bound says, 0 without it"),
    key("--tis-upper-bound", "algorithm.tis_clip", "float", source="slime-mis"),
    key("--tis-lower-bound", "algorithm.tis_clip_low", "float", source="slime-mis"),
    none(("--tis-batch-normalize", "--use-rs", "--rs-level", "--rs-lower-bound",
          "--rs-upper-bound", "--rs-veto-threshold"), "batch normalisation and rejection "
         "sampling of slime's MIS example, which only its TIS function reads "
         "(--custom-tis-function-path): vime's TIS has neither (tis_mode = \"mask\" rejects "
         "by the TIS weight's own level and bounds)", severity="warning",
         source="slime-mis"),
    derived("--loss-type", "vime trains with the policy-gradient loss; SFT and custom losses "
            "have no equivalent", ("policy_loss",), source="slime"),
    key("--calculate-per-token-loss", "algorithm.loss_aggregation", "set:token-mean",
        source="megatron",
        why="the mean over the step's response tokens; without the flag train.py takes each "
            "sample's token mean, then the mean over samples (seq-mean-token-mean)"),
    # dynamic sampling (vime/importer/__init__.py's _dynamic_sampling reads the filter)
    key("--dynamic-sampling-filter-path", "rollout.dynamic_sampling_filter", "function",
        why="slime's or upstream vime's check_reward_nonzero_std is rollout.dynamic_sampling = "
        "true alone (check_reward_nonzero_std_with_fallback: and dynamic_sampling_max_attempts "
        "= 1); another filter becomes dynamic_sampling_filter, which upstream calls as "
        "filter(args, samples) and vime as filter(rewards=, responses=, prompt=, label=) "
        "(runtime/rl/sampling.py): V963 until it is wrapped"),
    key("--over-sampling-batch-size", "rollout.over_sampling_batch_size", "int",
        why="prompts per attempt of dynamic sampling; without it vime generates batch_size "
        "prompts a rollout (upstream generates this many and trains on batch_size of them)"),
    # offload of a colocated run (vime/importer/__init__.py's _offload combines them)
    Flag(("--offload",), "joint", "train.offload", "true",
         why="--offload-train and --offload-rollout: with --colocate, train.offload = \"always\""),
    Flag(("--offload-train", "--no-offload-train"), "joint", "train.offload", "true",
         why="upstream offloads the actor and the engines of a colocated run unless told "
         "otherwise; vime's modes move both or neither: both asked for is \"always\", both "
         "refused is \"never\", no flag leaves vime's \"auto\" (resident when `vime plan` "
         "finds they fit on a GPU together)"),
    Flag(("--offload-rollout", "--no-offload-rollout"), "joint", "train.offload", "true",
         why="see --offload-train"),
    # evaluation (vime/importer/__init__.py's _eval builds [eval] and [[eval.datasets]])
    key("--eval-prompt-data", "eval.datasets", "pairs",
        why="NAME PATH [NAME PATH ...]: one [[eval.datasets]] table (name, prompt_data) per "
        "pair; a PATH alone is named aime, as upstream names it"),
    key("--eval-interval", "eval.interval", "int", source="megatron",
        why="upstream evaluates after rollout r − 1 for every r divisible by the interval: the "
        "weights vime's rollout r generates with; without it upstream never evaluates "
        "(eval.at_start and eval.at_end false), and the final weights only when it divides "
        "--num-rollout (eval.at_end)"),
    key("--skip-eval-before-train", "eval.at_start", "false",
        why="without it upstream evaluates the initial weights when --eval-interval is set"),
    key("--n-samples-per-eval-prompt", "eval.datasets.n_samples_per_prompt", "int",
        why="every dataset's"),
    key("--eval-max-response-len", "eval.datasets.max_response_len", "int",
        why="every dataset's"),
    key("--eval-temperature", "eval.datasets.temperature", "float", why="every dataset's"),
    key("--eval-top-p", "eval.datasets.top_p", "float", why="every dataset's"),
    key("--eval-input-key", "eval.datasets.input_key", why="every dataset's"),
    key("--eval-label-key", "eval.datasets.label_key", why="every dataset's"),
    none("--eval-config", "vime reads no evaluation config file: write one [[eval.datasets]] "
         "table per dataset of the file (name, prompt_data and its settings)",
         severity="warning"),
    none("--eval-max-prompt-len", "vime drops evaluation prompts longer than "
         "rollout.max_prompt_len, as it drops training prompts", severity="warning"),
    none("--eval-max-context-len", "vime's engines hold rollout.max_prompt_len plus the longest "
         "max_response_len of the rollout and the evaluation datasets", severity="warning"),
    none(("--eval-top-k", "--eval-min-new-tokens"), "vime samples evaluations with "
         "temperature and top-p only", severity="warning"),
    none("--eval-function-path", "vime generates evaluations on its rollout engines, as it "
         "generates rollouts", severity="warning"),
    none("--eval-reward-key", "the evaluation's --reward-key: vime has no key that picks one "
         "value of a reward's result", severity="warning"),
    none("--eval-tool-key", "vime's prompts carry no tool definitions", severity="warning"),
    # logging
    key("--wandb-project", "logging.wandb_project"),
    key("--wandb-group", "logging.wandb_group"),
    derived("--use-wandb", "vime logs to Weights & Biases when logging.wandb_project is set",
            source="slime"),
    none(("--wandb-key",), "a secret does not belong in a spec: export WANDB_API_KEY where "
         "vime runs, or set it in [cluster.env] from your environment", severity="warning"),
    none(("--wandb-team", "--wandb-host", "--wandb-mode", "--wandb-dir", "--wandb-run-id",
          "--disable-wandb-random-suffix", "--wandb-always-use-train-step"),
         "vime sets only logging.wandb_project and logging.wandb_group; the rest comes from "
         "WANDB_* environment variables", severity="warning"),
    none(("--use-tensorboard", "--tb-project-name", "--tb-experiment-name"),
         "vime writes TensorBoard logs to logging.tensorboard_dir: set it", severity="warning"),
    # the rollout engines (vLLM, upstream vime's --vllm-* flags)
    key("--vllm-gpu-memory-utilization", "inference.gpu_memory_utilization", "float",
        source="vime"),
    key("--vllm-cudagraph-capture-sizes", "inference.cudagraph_capture_sizes", "ints",
        source="vime"),
    key("--vllm-data-parallel-size", "inference.data_parallel_size", "int", source="vime"),
    key("--vllm-enable-expert-parallel", "inference.expert_parallel", "true", source="vime"),
    key("--vllm-enable-eplb", "inference.eplb.enabled", "true", source="vime"),
    key("--vllm-eplb-config", "inference.eplb", "json", source="vime",
        why="num_redundant_experts, window_size and step_interval"),
    key("--vllm-moe-backend", "inference.moe_backend", source="vime"),
    none("--vllm-pipeline-parallel-size", "vime's engines are TP × DP (× EP) without pipeline "
         "stages", source="vime"),
    # SGLang (slime): vime's engines are vLLM; these have a vLLM equivalent
    Flag(("--sglang-mem-fraction-static",), "key", "inference.gpu_memory_utilization", "float",
         why="SGLang's static memory fraction becomes vLLM's gpu_memory_utilization (V967)",
         source="sglang"),
    Flag(("--sglang-cuda-graph-bs",), "key", "inference.cudagraph_capture_sizes", "ints",
         why="SGLang's CUDA-graph batch sizes become vLLM's capture sizes (V967)",
         source="sglang"),
    Flag(("--sglang-enable-ep-moe",), "key", "inference.expert_parallel", "true",
         why="SGLang's expert parallelism becomes vLLM's (V967)", source="sglang"),
    Flag(("--sglang-dp-size",), "key", "inference.data_parallel_size", "int",
         why="SGLang's data parallelism becomes vLLM's data_parallel_size (V967)",
         source="sglang"),
    Flag(("--sglang-ep-size", "--sglang-expert-parallel-size"), "key",
         "inference.expert_parallel", "ep_size",
         why="SGLang's expert parallelism over N > 1 GPUs becomes vLLM's (true; 1 is false), "
         "whose experts are spread over each engine's TP × DP GPUs (V967)", source="sglang"),
    derived(("--sglang-enable-dp-attention",),
            "vLLM's data_parallel_size is attention data parallelism", source="sglang"),
    # derived from the architecture or fixed by vime's model builder
    arch("--num-layers", "num_hidden_layers"),
    arch("--hidden-size", "hidden_size"),
    arch("--ffn-hidden-size", "intermediate_size"),
    arch("--num-attention-heads", "num_attention_heads"),
    arch("--num-query-groups", "num_key_value_heads"),
    arch("--kv-channels", "head_dim"),
    arch("--vocab-size", "vocab_size"),
    arch("--num-experts", "num_experts"),
    arch("--moe-router-topk", "num_experts_per_tok"),
    arch("--moe-ffn-hidden-size", "moe_intermediate_size"),
    arch("--max-position-embeddings", "max_position_embeddings"),
    arch("--rotary-base", "rope_theta", "float"),
    arch("--norm-epsilon", "rms_norm_eps", "float"),
    arch("--untie-embeddings-and-output-weights", "tie_word_embeddings", "false"),
    arch("--moe-layer-freq", "mlp_only_layers", "layer_freq",
         why="1 or [1, 1, ...]: the MoE layers (0 marks a dense one)"),
    derived("--swiglu", QWEN3),
    derived("--disable-bias-linear", QWEN3),
    derived("--qk-layernorm", QWEN3, family="use_qk_norm:true"),
    derived("--group-query-attention", QWEN3),
    derived("--use-rotary-position-embeddings", QWEN3),
    derived("--normalization", QWEN3, ("RMSNorm",)),
    derived("--position-embedding-type", QWEN3, ("rope",)),
    derived("--rotary-percent", QWEN3, ("1.0", "1"), family="partial_rotary_factor:float"),
    derived("--moe-router-score-function", QWEN3, ("softmax",), family="scoring_func:str"),
    derived("--moe-router-dtype", QWEN3, ("fp32",)),
    arch("--moe-router-pre-softmax", "norm_topk_prob", "false",
         why="softmax over every expert before the top-k, whose weights then do not sum to 1: "
         "HF's norm_topk_prob = false; without the flag the softmax is over the top-k "
         "(norm_topk_prob = true), which the imported spec writes for a Qwen3-MoE. Sigmoid "
         "scores (DeepSeek-V3, GLM-4.5) are renormalised either way"),
    # scaled rotary embeddings: vime reads them from config.json or a preset's rope_scaling
    derived("--rope-type", "vime builds the rotary embedding as RoPE", ("rope",),
            beyond="[model.arch] rope_scaling, from config.json or the preset"),
    not_yet(("--rotary-scaling-factor", "--mscale", "--mscale-all-dim", "--yarn-beta-fast",
             "--yarn-beta-slow", "--yarn-original-max-position-embeddings",
             "--yarn-correction-range-round-to-int", "--use-rope-scaling",
             "--rope-scaling-factor", "--rotary-seq-len-interpolation-factor"),
            "model.arch.rope_scaling", "a scaled rotary embedding (YaRN for DeepSeek-V3, R1, "
            "Kimi-K2; Llama-3's rope scaling; position interpolation): vime takes YaRN from the "
            "checkpoint's config.json or the preset's rope_scaling. Where the other model args "
            "match a preset, these flags are checked against its rope_scaling (a note when "
            "equal, V968 when not); with no preset the import writes no rope_scaling from them, "
            "and a spec without it would train another function than the checkpoint's",
            source="megatron"),
    # multi-head latent attention and the DeepSeek-V3 / GLM-4.5 router (vime/importer/family.py)
    derived("--multi-latent-attention", FAMILY),
    derived("--q-lora-rank", FAMILY, family="q_lora_rank:int"),
    derived("--kv-lora-rank", FAMILY, family="kv_lora_rank:int"),
    derived("--qk-head-dim", FAMILY, family="qk_nope_head_dim:int"),
    derived("--qk-pos-emb-head-dim", FAMILY, family="qk_rope_head_dim:int"),
    derived("--v-head-dim", FAMILY, family="v_head_dim:int"),
    derived("--moe-shared-expert-intermediate-size", FAMILY, family="n_shared_experts:shared"),
    derived("--moe-router-enable-expert-bias", FAMILY, family="topk_method:noaux_tc"),
    derived("--moe-router-num-groups", FAMILY, family="n_group:int"),
    derived("--moe-router-group-topk", FAMILY, family="topk_group:int"),
    derived("--moe-router-topk-scaling-factor", FAMILY, family="routed_scaling_factor:float"),
    derived("--moe-aux-loss-coeff", "vime trains without the auxiliary load-balancing loss",
            ("0", "0.0")),
    derived("--moe-router-load-balancing-type", "vime trains without a load-balancing loss "
            "(runtime/megatron/model.py); its weight is --moe-aux-loss-coeff, which vime "
            "takes as 0"),
    derived("--moe-router-bias-update-rate", "vime keeps the checkpoint's expert bias as "
            "trained, with no update during training (runtime/megatron/model.py)", ("0",)),
    # the MoE token dispatcher (mapping.py's _dispatcher reads the pair)
    key("--moe-token-dispatcher-type", "train.moe_token_dispatcher", "choice", source="megatron",
        choices={"alltoall": "alltoall", "flex": "flex", "allgather": "alltoall"},
        why="allgather becomes alltoall: the same tokens reach the same experts, and "
        "megatron-core refuses allgather with the variable sequence lengths vime and slime "
        "train with"),
    key("--moe-enable-deepep", "train.moe_flex_backend", "set:deepep", source="megatron",
        why="DeepEP's kernels for --moe-token-dispatcher-type flex, which it needs (Megatron: "
        "\"DeepEP backend is only supported with flex token dispatcher.\")"),
    key("--moe-flex-dispatcher-backend", "train.moe_flex_backend", "choice", source="megatron",
        choices={"deepep": "deepep", "hybridep": "hybridep"},
        why="ncclep (NCCL's expert parallelism through Transformer Engine) has no equivalent; "
        "read only with --moe-token-dispatcher-type flex"),
    none(("--moe-flex-dispatcher-num-sms", "--moe-deepep-num-sms", "--moe-hybridep-num-sms"),
         "the SMs the flex dispatcher's kernels take: vime leaves the backend's own number "
         "(DeepEP's 20)", severity="warning", source="megatron"),
    derived("--moe-token-drop-policy", "vime drops no tokens (no capacity factor)", ("probs",)),
    derived("--moe-grouped-gemm", "vime's experts run as one grouped GEMM"),
    derived("--moe-permute-fusion", "a kernel choice vime makes itself"),
    derived(("--no-rope-fusion", "--no-masked-softmax-fusion", "--no-gradient-accumulation-fusion",
             "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-persist-layer-norm",
             "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "--moe-router-fusion"),
            "a fused kernel or its absence: vime's layer spec (train.transformer_impl) chooses "
            "its kernels, which compute the same layers"),
    derived("--make-vocab-size-divisible-by", "vime builds the embedding and output layer with "
            "the checkpoint's vocabulary (config.json's vocab_size), unpadded"),
    derived(("--attention-dropout", "--hidden-dropout"), "vime trains without dropout",
            ("0", "0.0")),
    derived("--accumulate-allreduce-grads-in-fp32", "vime's megatron.args always has it"),
    derived("--attention-softmax-in-fp32", "vime's megatron.args always has it"),
    derived("--attention-backend", "the attention kernel comes with train.transformer_impl",
            ("flash", "auto")),
    derived("--bf16", "vime trains in bf16"),
    derived("--seq-length", "derived from rollout.max_prompt_len + rollout.max_response_len"),
    derived(("--recompute-method",), "vime recomputes uniformly, one layer per chunk",
            ("uniform",)),
    derived(("--recompute-num-layers",), "vime recomputes uniformly, one layer per chunk",
            ("1",)),
    derived("--model-name", "vime reads the model type from config.json", source="slime"),
    derived("--qkv-format", "vime packs sequences (thd)", ("thd",), source="vime"),
    derived("--megatron-to-hf-mode", "vime converts weights itself (raw)", ("raw",),
            source="vime"),
    derived("--rollout-seed", "vime derives the rollout's seeds from experiment.seed",
            source="slime"),
    none("--add-qkv-bias", "QKV bias: vime builds it in the GLM-4.5 family and in no Qwen3 "
         "(V975 names the family the flags show)", source="megatron",
         family="attention_bias:true"),
    none("--fp16", "vime trains in bf16", source="megatron"),
    none("--use-routing-replay", "vime replays the rollout's routing (R3: "
         "--use-rollout-routing-replay, train.routing_replay), not the actor's own"),
    none("--num-epoch", "set rollout.num_rollout: the number of rollouts the run makes"),
    none("--update-weight-buffer-size", "the bytes of each bucket of the weight push to the "
         "engines: vime sizes its buckets from the plan's free memory (runtime/core/"
         "weights.py, bucket_bytes), so the flag has no effect in vime", severity="warning"),
    none("--vllm-server-concurrency", "the most requests upstream's client keeps in flight "
         "to each engine (512 by default): vime hands each engine its share of a rollout at "
         "once and vLLM's scheduler runs up to --max-num-seqs of them together "
         "(inference.extra_args), so the flag has no effect in vime", severity="warning",
         source="vime"),
    none("--train-memory-margin-bytes", "vime's memory plan (`vime plan`) checks the actor's "
         "room before the run", severity="warning", source="vime"),
    key("--save-hf", "checkpoint.save_hf_interval", "save_hf",
        why="HF folders at every checkpoint (--save-interval), as train.py writes them, in "
            "<save folder>/hf/rollout_XXXXXX/ rather than the flag's path"),
)

# What a flag's absence means upstream, where vime's default differs (written to the spec so it
# means what the script meant). key -> (the upstream default, the flag whose absence it is,
# whose default it is).
UPSTREAM_DEFAULTS: dict[str, tuple[object, str, str]] = {
    "data.shuffle": (False, "--rollout-shuffle", "train.py's"),
    "algorithm.loss_aggregation": ("seq-mean-token-mean", "--calculate-per-token-loss",
                                   "train.py's per-sample mean"),
    "train.dynamic_batch": (False, "--use-dynamic-batch-size", "train.py's"),
    "train.optimizer.adam_beta2": (0.999, "--adam-beta2", "Megatron's"),
    "train.optimizer.weight_decay": (0.01, "--weight-decay", "Megatron's"),
    "inference.gpu_memory_utilization": (0.9, "--vllm-gpu-memory-utilization", "vLLM's"),
}

# The codes of vime import's report: code -> (name, severity, explanation).
CODES: dict[str, tuple[str, str, str]] = {
    "V960": ("shell-not-followed", "warning", """A construct of the script the reader does not follow.

        vime import reads the script without running it: assignments, arrays, `source`,
        `${VAR:-default}`, `if` on known values, `$(seq ...)` and `$((...))`. A loop, a
        function, a command substitution or a condition on something only a run knows is
        skipped, and what it would have set is unknown rather than guessed.
        Fix: pass the values it decides with --env NAME=VALUE, or import the flag list
        train.py received with --argv."""),
    "V961": ("command-not-run", "note", """A command of the script that vime import does not run.

        `pkill`, `ray start`, `echo`, `sleep` and the like prepare a machine for the script;
        vime submit does that work itself (it starts and stops Ray on every node).
        Fix: nothing to do, unless the command set something the flags read."""),
    "V962": ("value-unknown", "error", """A flag's value depends on something the reader cannot know.

        The value comes from a command's output, an unset variable or a branch the reader
        could not decide; the key is left out of the spec rather than guessed.
        Fix: pass the variable with --env NAME=VALUE (the message names it), or write the
        key in the spec."""),
    "V963": ("no-equivalent", "error", """A flag vime has no key for.

        vime builds Megatron's and vLLM's arguments from the spec's keys; a flag with no key
        is not passed on. The message says why and what to do: some are settings vime
        makes itself, some belong elsewhere (a secret in the environment), some change the
        run and vime cannot express them yet. A warning is a flag whose loss does not change
        what is trained.
        Fix: follow the help line; if the flag matters to the run, the spec is not complete."""),
    "V964": ("not-yet-in-vime", "error", """A flag whose key is being added to vime.

        The key it will map to is named; until it exists the run behaves as vime's default
        does (a constant learning rate, no evaluation, token-mean loss, no dynamic sampling).
        Fix: import again with a newer vime, or accept vime's default for this run."""),
    "V965": ("derived-by-vime", "note", """A flag vime sets itself from the spec.

        Model-structure flags (--swiglu, --qk-layernorm, ...), numerics (--bf16, fp32
        softmax and gradient accumulation) and kernel choices follow from the architecture
        in config.json and from train.transformer_impl; vime's megatron.args shows them.
        Fix: nothing to do; a value other than the one vime uses is reported as V963."""),
    "V966": ("unknown-flag", "error", """A flag no parser vime knows has: not upstream vime's or slime's train.py, not Megatron's, not vLLM's.

        It is most often a typo or a flag of another version; vime suggests the closest
        known flag.
        Fix: correct the flag in the script and import again, or write the key it meant."""),
    "V967": ("sglang-flag", "warning", """An SGLang flag: vime's rollout engines are vLLM.

        A flag with a vLLM equivalent (memory fraction, CUDA-graph sizes, DP, EP) is
        translated and reported as a warning, because the engines differ in what the
        numbers cover; any other SGLang flag is an error.
        Fix: review the translated keys; for the rest, find vLLM's flag and add it to
        inference.extra_args."""),
    "V968": ("model-mismatch", "error", """A model flag that contradicts the checkpoint's config.json.

        The script's model args (--num-layers, --hidden-size, ...) must describe the
        checkpoint in --hf-checkpoint; vime reads the architecture from its config.json.
        Fix: check that the models file sourced is the one for this checkpoint."""),
    "V969": ("cluster-unknown", "error", """The script does not say how many nodes or GPUs it runs on.

        The cluster comes from --actor-num-nodes, --actor-num-gpus-per-node,
        --rollout-num-gpus and --colocate (or ACTOR_NUM_NODES / ACTOR_NUM_GPUS_PER_NODE).
        Fix: pass --env ACTOR_NUM_NODES=N (or the variable the script reads), or set
        cluster.nodes and cluster.gpus_per_node in the spec."""),
    "V970": ("to-extra-args", "note", """A vLLM flag passed through to inference.extra_args.

        Upstream vime's `--vllm-X` flags are vLLM's `--X`; one without its own spec key goes
        to inference.extra_args, which vime checks against vLLM's flags (V511 and after).
        Fix: nothing to do."""),
    "V971": ("flag-twice", "warning", """A flag given twice: the last value is taken, as argparse does.

        Fix: remove the first one from the script."""),
    "V972": ("key-missing", "error", """A key the spec needs that the script did not give.

        The experiment needs the model checkpoint, the prompt data, the rollout count and
        batch, and the cluster; the script had no flag for it.
        Fix: write the key in the spec (the message names it)."""),
    "V973": ("no-train-command", "error", """The script runs no train.py: no flags to import.

        vime import takes the flags after `train.py` (or `train_async.py`) on the command
        that runs it, usually `ray job submit ... -- python3 train.py ...`.
        Fix: import the flag list with --argv, e.g. `vime import --argv -- --actor-num-nodes
        1 ...`."""),
    "V974": ("source-not-found", "error", """A file the script sources cannot be read.

        `source`/`.` is followed for a file next to the script (models/X.sh is also looked
        for in a models folder beside it); its MODEL_ARGS are usually what is missing.
        Fix: put the models file beside the script as the path says, or pass the model with
        the spec's model.hf_checkpoint (config.json)."""),
    "V975": ("model-family", "error", """Model args that show a family other than Qwen3.

        Multi-head latent attention (--multi-latent-attention, --q-lora-rank, ...) is the
        DeepSeek-V3 family and GLM's set (--add-qkv-bias, --rotary-percent 0.5, sigmoid
        routing with the expert bias, shared experts) the GLM-4.5 family: the importer
        writes their [model.arch]. Flags that show another family, such as --add-qkv-bias
        without --qk-layernorm (Qwen2) or latent attention with QKV bias, are named here
        rather than planned as a Qwen3 of the same size; so is a checkpoint whose
        config.json names another model_type than the flags show.
        Fix: train a family vime does not build with upstream, or check that the models
        file sourced is the checkpoint's."""),
}

TABLE_BY_NAME: dict[str, Flag] = {name: row for row in FLAGS for name in row.names}


def explain(code: str) -> str | None:
    """`vime explain` text of an import code."""
    import inspect

    found = CODES.get(code.upper())
    if found is None:
        return None
    name, severity, text = found
    return f"{code.upper()} {name} ({severity}; reported by vime import)\n\n{inspect.cleandoc(text)}\n"
