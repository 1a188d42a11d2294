"""megatron.args: the Megatron-LM arguments of the actor, derived from the plan.

Only flags that Megatron-LM's own `parse_args` knows are emitted (the oracle tests parse
them with megatron.training.arguments); vime's RL-level knobs travel in plan.json.
Model flags follow the HF -> Megatron mapping of shared/reference/megatron.md §5.
"""

from __future__ import annotations

from vime.plan import Plan


def _num(value: float) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _family_args(arch) -> list[list[str]]:
    """What a DeepSeek-V3 or GLM-4.5 layer has beyond Qwen3's, as the Megatron backend builds
    it (runtime/megatron/model.py's _family_args): MLA's widths, QKV bias, shared experts,
    the expert bias kept as trained, group-limited routing and scaled routing weights; none
    for a Qwen3 / Qwen3-MoE."""
    args: list[list[str]] = []
    if arch.is_mla:
        args.append(["--multi-latent-attention"])
        if arch.q_lora_rank:
            args.append(["--q-lora-rank", str(arch.q_lora_rank)])
        args += [["--kv-lora-rank", str(arch.kv_lora_rank)],
                 ["--qk-head-dim", str(arch.qk_nope_head_dim)],
                 ["--qk-pos-emb-head-dim", str(arch.qk_rope_head_dim)],
                 ["--v-head-dim", str(arch.v_head_dim)]]
        # MLATransformerConfig's rope_type is "yarn" unless told (transformer_config.py)
        yarn = arch.rope_scaling
        if yarn is None:
            args.append(["--rope-type", "rope"])
        else:
            # Megatron-LM's CLI reaches MLATransformerConfig's rope_type, rotary_scaling_factor,
            # mscale and mscale_all_dim by name; its --yarn-* flags feed the non-MLA YaRN
            # (argument_utils.py), so MLA keeps beta_fast 32, beta_slow 1 and 4096 original
            # positions from this argv: the Megatron backend builds all seven from the Arch
            args += [["--rope-type", "yarn"], ["--rotary-scaling-factor", _num(yarn.factor)],
                     ["--mscale", _num(yarn.mscale)],
                     ["--mscale-all-dim", _num(yarn.mscale_all_dim)],
                     ["--yarn-beta-fast", _num(yarn.beta_fast)],
                     ["--yarn-beta-slow", _num(yarn.beta_slow)],
                     ["--yarn-original-max-position-embeddings",
                      str(yarn.original_max_position_embeddings)]]
    if arch.qkv_bias:
        args.append(["--add-qkv-bias"])
    if not arch.is_moe:
        return args
    if arch.shared_expert_ffn_hidden_size:
        args.append(["--moe-shared-expert-intermediate-size",
                     str(arch.shared_expert_ffn_hidden_size)])
    if arch.expert_bias:
        args += [["--moe-router-enable-expert-bias"], ["--moe-router-bias-update-rate", "0.0"]]
    if arch.num_groups > 1:
        args += [["--moe-router-num-groups", str(arch.num_groups)],
                 ["--moe-router-group-topk", str(arch.group_topk)]]
    if arch.routed_scaling_factor != 1.0:
        args.append(["--moe-router-topk-scaling-factor", _num(arch.routed_scaling_factor)])
    return args


def megatron_args(plan: Plan) -> list[list[str]]:
    """One inner list per flag with its values; flattened, it is the argv."""
    spec, arch = plan.spec, plan.spec.arch
    par, opt, train = spec.train.parallel, spec.train.optimizer, spec.train
    args: list[list[str]] = [
        ["--tensor-model-parallel-size", str(par.tp)],
        ["--pipeline-model-parallel-size", str(par.pp)],
        ["--context-parallel-size", str(par.cp)],
        ["--expert-model-parallel-size", str(par.ep)],
        ["--expert-tensor-parallel-size", str(par.etp)],
    ]
    if par.sequence_parallel and par.tp > 1:
        args.append(["--sequence-parallel"])
    if par.first_stage_layers is not None:
        args.append(["--decoder-first-pipeline-num-layers", str(par.first_stage_layers)])
    if par.last_stage_layers is not None:
        args.append(["--decoder-last-pipeline-num-layers", str(par.last_stage_layers)])
    args += [
        ["--num-layers", str(arch.num_layers)],
        ["--hidden-size", str(arch.hidden_size)],
        ["--ffn-hidden-size", str(arch.ffn_hidden_size)],
        ["--num-attention-heads", str(arch.num_attention_heads)],
    ]
    if not arch.is_mla:  # Megatron refuses GQA beside MLA ("mutually exclusive")
        args += [["--group-query-attention"], ["--num-query-groups", str(arch.num_kv_heads)]]
    args += [
        ["--kv-channels", str(arch.head_dim)],
        ["--vocab-size", str(arch.vocab_size)],
        ["--max-position-embeddings", str(arch.max_position_embeddings)],
        ["--seq-length", str(spec.rollout.max_prompt_len + spec.rollout.sample_tokens)],
        ["--normalization", "RMSNorm"],
        ["--norm-epsilon", _num(arch.rms_norm_eps)],
        ["--position-embedding-type", "rope"],
        ["--rotary-base", str(int(arch.rope_theta))],
        ["--rotary-percent", _num(float(arch.partial_rotary_factor))],
        ["--swiglu"],
        ["--disable-bias-linear"],
    ]
    if arch.qk_norm or arch.is_mla:  # MLA's query and key-value latent norms are its qk norms
        args.append(["--qk-layernorm"])
    args += _family_args(arch)
    if not arch.tie_word_embeddings:
        args.append(["--untie-embeddings-and-output-weights"])
    if arch.is_moe:
        all_moe = all(arch.moe_layers)
        freq = "1" if all_moe else "[" + ",".join("1" if m else "0" for m in arch.moe_layers) + "]"
        args += [
            ["--num-experts", str(arch.num_experts)],
            ["--moe-ffn-hidden-size", str(arch.moe_ffn_hidden_size)],
            ["--moe-router-topk", str(arch.topk)],
            ["--moe-layer-freq", freq],
            ["--moe-router-score-function", arch.score_function],
            ["--moe-token-dispatcher-type", train.moe_token_dispatcher],
            ["--moe-router-dtype", "fp32"],
            ["--moe-aux-loss-coeff", "0"],
            ["--moe-grouped-gemm"],
        ]
        if train.moe_token_dispatcher == "flex":
            args.append(["--moe-flex-dispatcher-backend", train.moe_flex_backend])
        if not arch.norm_topk_prob:
            args.append(["--moe-router-pre-softmax"])
        if train.routing_replay:
            args.append(["--moe-enable-routing-replay"])
    args += [
        ["--micro-batch-size", str(1 if train.dynamic_batch else train.micro_batch_size)],
        ["--global-batch-size", str(train.global_batch_size)],
        ["--train-iters", str(spec.rollout.num_rollout * train.steps_per_rollout)],
        ["--optimizer", "adam"],
        ["--lr", _num(opt.lr)],
        ["--weight-decay", _num(opt.weight_decay)],
        ["--adam-beta1", _num(opt.adam_beta1)],
        ["--adam-beta2", _num(opt.adam_beta2)],
        # Megatron-LM's own default style is linear: the spec's is written out
        ["--lr-decay-style", opt.lr_decay_style],
        ["--bf16"],
        ["--accumulate-allreduce-grads-in-fp32"],
        ["--attention-softmax-in-fp32"],
        ["--seed", str(spec.experiment.seed)],
    ]
    if opt.lr_warmup_iters:
        args.append(["--lr-warmup-iters", str(opt.lr_warmup_iters)])
    if opt.lr_decay_style != "constant":
        args += [["--lr-decay-iters", str(opt.lr_decay_iters)], ["--min-lr", _num(opt.min_lr)]]
    if opt.distributed:
        args.append(["--use-distributed-optimizer"])
    if opt.precision_aware:
        args.append(["--use-precision-aware-optimizer"])
    if opt.cpu_offload:
        args.append(["--optimizer-cpu-offload"])
        if opt.overlap_cpu_optimizer_d2h_h2d:
            args.append(["--overlap-cpu-optimizer-d2h-h2d"])
    if train.recompute == "full":
        args += [["--recompute-granularity", "full"], ["--recompute-method", "uniform"],
                 ["--recompute-num-layers", "1"]]
    elif train.recompute == "selective":
        args.append(["--recompute-granularity", "selective"])
    # auto is decided on the training nodes at start (TE where it imports), so megatron.args
    # says nothing: Megatron-LM would take its own default, transformer_engine
    if train.transformer_impl != "auto":
        args.append(["--transformer-impl", train.transformer_impl])
    load = spec.model.load or spec.model.torch_dist_checkpoint
    if load:
        args.append(["--load", load])
    if spec.model.save:
        args += [["--save", spec.model.save],
                 ["--save-interval", str(spec.checkpoint.save_interval)]]
    # the user's raw flags last (V540-V542 check them): a flag with the values after it
    for extra in train.extra_args:
        if extra.startswith("--") or not args:
            args.append([extra])
        else:
            args[-1].append(extra)
    return args
