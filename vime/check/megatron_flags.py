"""V540-V542: train.extra_args, raw Megatron-LM flags, against Megatron-LM's own flag catalog
(vime/data/megatron-flags-*.json, from megatron.training.arguments' parser: `python -m
vime.flags.generate megatron`) and against the flags vime sets from the spec.

train.extra_args is argv as Megatron's argparse reads it: `--flag`, `--flag=value`, or
`--flag` followed by its values as further elements (`--recompute-modules core_attn mlp`).
Megatron's parser takes no abbreviations (allow_abbrev=False) and no underscores for dashes.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass

from vime import flags
from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec

# The flags vime/emit/megatron.py derives from the spec, by Megatron's dest (so --no-x and
# --x are one), each with the spec key to set instead.
VIME_MEGATRON_DESTS: dict[str, str] = {
    "tensor_model_parallel_size": "train.parallel.tp",
    "pipeline_model_parallel_size": "train.parallel.pp",
    "context_parallel_size": "train.parallel.cp",
    "expert_model_parallel_size": "train.parallel.ep",
    "expert_tensor_parallel_size": "train.parallel.etp",
    "sequence_parallel": "train.parallel.sequence_parallel",
    "decoder_first_pipeline_num_layers": "train.parallel.first_stage_layers",
    "decoder_last_pipeline_num_layers": "train.parallel.last_stage_layers",
    "micro_batch_size": "train.micro_batch_size",
    "global_batch_size": "train.global_batch_size",
    "train_iters": "rollout.num_rollout and train.steps_per_rollout",
    "seq_length": "rollout.max_prompt_len and max_response_len",
    "lr": "train.optimizer.lr", "min_lr": "train.optimizer.min_lr",
    "weight_decay": "train.optimizer.weight_decay",
    "adam_beta1": "train.optimizer.adam_beta1", "adam_beta2": "train.optimizer.adam_beta2",
    "lr_decay_style": "train.optimizer.lr_decay_style",
    "lr_warmup_iters": "train.optimizer.lr_warmup_iters",
    "lr_decay_iters": "train.optimizer.lr_decay_iters",
    "use_distributed_optimizer": "train.optimizer.distributed",
    "use_precision_aware_optimizer": "train.optimizer.precision_aware",
    "optimizer_cpu_offload": "train.optimizer.cpu_offload",
    "overlap_cpu_optimizer_d2h_h2d": "train.optimizer.overlap_cpu_optimizer_d2h_h2d",
    "optimizer": "[train.optimizer] (vime trains with Adam)",
    "recompute_granularity": "train.recompute", "recompute_method": "train.recompute",
    "recompute_num_layers": "train.recompute",
    "transformer_impl": "train.transformer_impl",
    "moe_token_dispatcher_type": "train.moe_token_dispatcher",
    "moe_flex_dispatcher_backend": "train.moe_flex_backend",
    "moe_enable_routing_replay": "train.routing_replay",
    "seed": "experiment.seed",
    "load": "model.load or model.torch_dist_checkpoint", "save": "model.save",
    "save_interval": "checkpoint.save_interval",
    "bf16": "nothing (the actor trains in bf16)", "fp16": "nothing (the actor trains in bf16)",
}
# the model's own flags: [model.arch] (or the config.json it reads) says them
for _dest in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
              "group_query_attention", "num_query_groups", "kv_channels", "padded_vocab_size",
              "vocab_size", "max_position_embeddings", "normalization", "norm_epsilon",
              "position_embedding_type", "rotary_base", "rotary_percent", "swiglu",
              "add_bias_linear", "qk_layernorm", "untie_embeddings_and_output_weights",
              "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
              "qk_pos_emb_head_dim", "v_head_dim", "add_qkv_bias", "num_experts",
              "moe_ffn_hidden_size", "moe_router_topk", "moe_layer_freq",
              "moe_router_score_function", "moe_shared_expert_intermediate_size",
              "moe_router_enable_expert_bias", "moe_router_bias_update_rate",
              "moe_router_num_groups", "moe_router_group_topk", "moe_router_topk_scaling_factor",
              "moe_router_pre_softmax", "rope_type", "rotary_scaling_factor", "mscale",
              "mscale_all_dim", "yarn_beta_fast", "yarn_beta_slow",
              "yarn_original_max_position_embeddings"):
    VIME_MEGATRON_DESTS[_dest] = "[model.arch] (or model.hf_checkpoint's config.json)"


@dataclass(frozen=True)
class MegatronArg:
    """One flag of train.extra_args with the values that follow it."""

    index: int  # of the flag's element in train.extra_args
    option: str  # as written, before any `=`
    values: tuple[str, ...]
    entry: dict | None  # the catalog's action (the newest version that has the flag)


def parse(extra_args: tuple[str, ...]) -> tuple[tuple[MegatronArg, ...], tuple[int, ...]]:
    """The flags of extra_args with their values, and the indices of values that follow no
    flag (a first element that is not a flag). The catalog is read only for flags to judge:
    a plan without train.extra_args never loads it."""
    if not extra_args:
        return (), ()
    cat = flags.catalog("megatron")
    parsed: list[MegatronArg] = []
    stray: list[int] = []
    for index, text in enumerate(extra_args):
        if text.startswith("--"):
            option, eq, value = text.partition("=")
            newest = cat.newest(option)
            parsed.append(MegatronArg(index, option, (value,) if eq else (),
                                      newest[1] if newest else None))
        elif parsed:
            last = parsed[-1]
            parsed[-1] = MegatronArg(last.index, last.option, (*last.values, text), last.entry)
        else:
            stray.append(index)
    return tuple(parsed), tuple(stray)


@functools.cache
def _options() -> tuple[str, ...]:
    return flags.catalog("megatron").options


def _where(spec: Spec, index: int) -> str:
    return f"train.extra_args[{index}]"


@rule("V540", "megatron-flag-exists", enforced_by="megatron")
def megatron_flag_exists(spec: Spec):
    """A train.extra_args flag that Megatron-LM's parser does not have.

    Megatron-LM's parse_args (megatron/training/arguments.py, allow_abbrev=False) exits every
    training rank at start, after the queue wait: "pretrain_gpt.py: error: unrecognized
    arguments: --lr-decay-sytle". An element that follows no flag is refused the same way.
    Fix: the flag as Megatron spells it (the help line gives the closest, with dashes, not
    underscores), or remove it."""
    parsed, stray = parse(spec.train.extra_args)
    for index in stray:
        yield Finding(_where(spec, index), f"train.extra_args[{index}] = "
                      f"{spec.train.extra_args[index]!r} follows no flag: Megatron-LM's parser "
                      "refuses it (\"unrecognized arguments\")",
                      help="start train.extra_args with a flag (\"--name\" or \"--name=value\")")
    for arg in parsed:
        if arg.entry is not None:
            continue
        close = difflib.get_close_matches(arg.option.replace("_", "-"), _options(), n=1,
                                          cutoff=0.6)
        yield Finding(_where(spec, arg.index),
                      f"{arg.option} is not a flag of Megatron-LM "
                      f"{', '.join(flags.catalog('megatron').versions)}: its parser stops "
                      "every training rank at start (\"unrecognized arguments\")",
                      help=f"did you mean {close[0]}?" if close else
                      "remove it (vime/data/megatron-flags-*.json lists Megatron's flags)")


@rule("V541", "megatron-flag-vime-sets", enforced_by="vime")
def megatron_flag_vime_sets(spec: Spec):
    """A train.extra_args flag that vime already sets from a spec key.

    vime derives these flags from the spec (vime/emit/megatron.py): the layout, the batch,
    the optimizer, the model's architecture. train.extra_args come after vime's own flags,
    so Megatron would take the extra one while vime planned the layout, memory and the
    engines by the key, and the runtime builds the model from the key: the plan and the run
    disagree.
    Fix: remove the flag and set the spec key the help line names."""
    parsed, _ = parse(spec.train.extra_args)
    for arg in parsed:
        if arg.entry is None or arg.entry["dest"] not in VIME_MEGATRON_DESTS:
            continue
        key = VIME_MEGATRON_DESTS[arg.entry["dest"]]
        yield Finding(_where(spec, arg.index),
                      f"{arg.option} is set by vime from {key}: a second value in "
                      "train.extra_args would make Megatron train another setting than vime "
                      "planned", help=f"remove {arg.option} and set {key}")


def _value_problem(arg: MegatronArg) -> str | None:
    entry = arg.entry
    takes_value = "type" in entry or "choices" in entry
    nargs = entry.get("nargs")
    if not takes_value:
        return f"{arg.option} is a switch and takes no value" if arg.values else None
    if not arg.values:
        return f"{arg.option} needs a value"
    if len(arg.values) > 1 and nargs not in ("+", "*"):
        return f"{arg.option} takes one value, given {len(arg.values)}"
    choices = entry.get("choices")
    kind = entry.get("type")
    for value in arg.values:
        if choices and value not in choices and not any(str(c).endswith("." + value)
                                                        for c in choices):
            return f"{arg.option} = {value!r} is not one of {', '.join(map(str, choices))}"
        try:
            if kind == "int":
                int(value)
            elif kind == "float":
                float(value)
        except ValueError:
            return f"{arg.option} = {value!r} is not {'an integer' if kind == 'int' else 'a number'}"
    return None


@rule("V542", "megatron-flag-value", enforced_by="megatron")
def megatron_flag_value(spec: Spec):
    """A train.extra_args flag given a value Megatron-LM's parser refuses: a switch given a
    value, a flag without one, several values where it takes one, a value outside its
    choices or not of its type (int, float).

    Megatron's argparse exits every training rank at start: "argument --lr: invalid float
    value: 'fast'", "expected one argument", "invalid choice".
    Fix: the value the flag takes (the message names its choices or type)."""
    parsed, _ = parse(spec.train.extra_args)
    for arg in parsed:
        if arg.entry is None:
            continue
        problem = _value_problem(arg)
        if problem:
            yield Finding(_where(spec, arg.index), f"{problem}: Megatron-LM's parser stops "
                          "every training rank at start",
                          help="`--flag=value` or `--flag` followed by its values")
