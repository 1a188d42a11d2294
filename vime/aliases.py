"""Names that slime, Megatron-LM and vLLM give to what a vime key sets, for V002's help line.

A user moving a slime or Megatron script to a spec writes the flag's name as a key
(`tensor_model_parallel_size = 4`, `rm_type = "deepscaler"`); edit distance sends such a name
to an unrelated key (inference.data_parallel_size, model.arch.model_type). This table is
looked up first; tests/test_aliases.py keeps every target a key of the schema.
"""

from __future__ import annotations

# flag name (dashes as underscores, no leading --) -> (the tool that uses it, the vime key)
ALIASES: dict[str, tuple[str, str]] = {
    # Megatron-LM's parallel layout
    "tensor_model_parallel_size": ("Megatron-LM", "train.parallel.tp"),
    "pipeline_model_parallel_size": ("Megatron-LM", "train.parallel.pp"),
    "context_parallel_size": ("Megatron-LM", "train.parallel.cp"),
    "expert_model_parallel_size": ("Megatron-LM", "train.parallel.ep"),
    "expert_tensor_parallel_size": ("Megatron-LM", "train.parallel.etp"),
    "decoder_first_pipeline_num_layers": ("Megatron-LM", "train.parallel.first_stage_layers"),
    "decoder_last_pipeline_num_layers": ("Megatron-LM", "train.parallel.last_stage_layers"),
    # Megatron-LM's optimizer and memory
    "use_distributed_optimizer": ("Megatron-LM", "train.optimizer.distributed"),
    "optimizer_cpu_offload": ("Megatron-LM", "train.optimizer.cpu_offload"),
    "use_precision_aware_optimizer": ("Megatron-LM", "train.optimizer.precision_aware"),
    "recompute_granularity": ("Megatron-LM", "train.recompute"),
    "recompute_method": ("Megatron-LM", "train.recompute"),
    # Megatron-LM's model flags (vime reads them from config.json, or [model.arch])
    "num_layers": ("Megatron-LM", "model.arch.num_hidden_layers"),
    "ffn_hidden_size": ("Megatron-LM", "model.arch.intermediate_size"),
    "moe_ffn_hidden_size": ("Megatron-LM", "model.arch.moe_intermediate_size"),
    "moe_router_topk": ("Megatron-LM", "model.arch.num_experts_per_tok"),
    "num_query_groups": ("Megatron-LM", "model.arch.num_key_value_heads"),
    "kv_channels": ("Megatron-LM", "model.arch.head_dim"),
    "rotary_base": ("Megatron-LM", "model.arch.rope_theta"),
    "norm_epsilon": ("Megatron-LM", "model.arch.rms_norm_eps"),
    "ref_load": ("slime", "model.torch_dist_checkpoint"),
    # slime's rollout and reward
    "rm_type": ("slime", "rollout.reward"),
    "custom_rm_path": ("slime", "rollout.reward"),
    "rollout_batch_size": ("slime", "rollout.batch_size"),
    "rollout_max_response_len": ("slime", "rollout.max_response_len"),
    "rollout_max_prompt_len": ("slime", "rollout.max_prompt_len"),
    "rollout_temperature": ("slime", "rollout.temperature"),
    "rollout_top_p": ("slime", "rollout.top_p"),
    "rollout_shuffle": ("slime", "data.shuffle"),
    "num_steps_per_rollout": ("slime", "train.steps_per_rollout"),
    "use_dynamic_batch_size": ("slime", "train.dynamic_batch"),
    "use_rollout_routing_replay": ("slime", "train.routing_replay"),
    "use_routing_replay": ("slime", "train.routing_replay"),
    "advantage_estimator": ("slime", "algorithm.name"),
    "kl_loss_type": ("slime", "algorithm.kl_estimator"),
    "use_tis": ("slime", "algorithm.tis"),
    "use_wandb": ("slime", "logging.wandb_project"),
    "wandb_team": ("slime", "logging.wandb_project"),
    # slime's placement
    "actor_num_nodes": ("slime", "cluster.nodes"),
    "actor_num_gpus_per_node": ("slime", "cluster.gpus_per_node"),
    "rollout_num_gpus": ("slime", "inference.num_gpus"),
    "rollout_num_gpus_per_engine": ("slime", "inference.gpus_per_engine"),
    "sglang_mem_fraction_static": ("slime", "inference.gpu_memory_utilization"),
    # vLLM's engine arguments
    "tensor_parallel_size": ("vLLM", "inference.gpus_per_engine"),
    "enable_expert_parallel": ("vLLM", "inference.expert_parallel"),
    "enable_eplb": ("vLLM", "inference.eplb.enabled"),
}


def alias(key: str) -> tuple[str, str] | None:
    """(tool, vime key) for a flag name written as a key, `--tensor-model-parallel-size` and
    `tensor_model_parallel_size` alike; None when the name is no known flag."""
    return ALIASES.get(key.lstrip("-").replace("-", "_").lower())
