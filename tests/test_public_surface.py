"""The public surface users and scripts depend on: the CLI verbs and their options, the spec's
top-level sections and their keys, and `vime plan --json`'s top-level keys.

A rename or a removal fails here on purpose (docs/spec.md: add keys, never rename). An
addition fails too, so that it is deliberate: add the new verb, option or key to the lists
below in the same change.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vime.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]

# verb -> (positional arguments, option strings)
CLI = {
    "plan": (["spec"], ["--format", "--json", "--set", "--strict"]),
    "compile": (["spec"], ["--format", "--output", "--set", "--strict", "-o"]),
    "explain": (["code"], []),
    "submit": (["spec"], ["--as-job", "--detach", "--dry-run", "--format", "--fresh",
                          "--local", "--quiet", "--ray-address", "--set", "--strict"]),
    "status": (["job"], []),
    "logs": (["job"], ["--follow", "--node", "--quiet", "--raw", "-f"]),
    "cancel": (["job"], []),
    "convert": (["spec"], ["--dry-run", "--format", "--output", "--set", "--single-gpu",
                           "--strict", "--to", "-o"]),
    "import": (["script"], ["--argv", "--env", "--force", "--output", "--repo-root", "-o"]),
    "report": (["job"], ["--output", "-o"]),
    "doctor": (["spec"], ["--no-import", "--set"]),
}

SPEC = {
    "algorithm": ["advantage_estimator", "entropy_coef", "eps_clip", "eps_clip_high",
                  "kl_estimator", "kl_loss_coef", "loss_aggregation", "name",
                  "std_normalization", "tis", "tis_clip", "tis_clip_low", "tis_level",
                  "tis_mode"],
    "checkpoint": ["async_save", "keep_last", "on_corrupt", "save_hf_interval", "save_interval"],
    "cluster": ["env", "gpu", "gpu_memory_gib", "gpus_per_node", "host_memory_gib", "nodes",
                "ray", "slurm"],
    "data": ["apply_chat_template", "input_key", "label_key", "metadata_keys", "prompt_data",
             "shuffle"],
    "eval": ["at_end", "at_start", "datasets", "interval"],
    "experiment": ["name", "output_dir", "seed"],
    "inference": ["backend", "cudagraph_capture_sizes", "data_parallel_size", "eplb",
                  "expert_parallel", "extra_args", "gpu_memory_utilization", "gpus_per_engine",
                  "moe_backend", "num_gpus", "quantization"],
    "logging": ["tensorboard_dir", "wandb_group", "wandb_project"],
    "model": ["arch", "hf_checkpoint", "load", "preset", "random_init", "save",
              "torch_dist_checkpoint"],
    "rollout": ["async", "batch_size", "dynamic_sampling", "dynamic_sampling_filter",
                "dynamic_sampling_max_attempts", "dynamic_sampling_max_empty_rollouts",
                "function", "function_timeout_s",
                "max_prompt_len", "max_response_len", "max_staleness", "max_total_tokens",
                "max_turns",
                "n_samples_per_prompt", "num_rollout", "over_sampling_batch_size", "overlong",
                "overlong_buffer_len", "overlong_penalty_factor", "reward", "reward_timeout_s",
                "temperature", "top_p"],
    "train": ["backend", "balance_data", "colocate", "dynamic_batch", "extra_args",
              "global_batch_size",
              "max_tokens_per_gpu", "micro_batch_size", "moe_flex_backend", "moe_token_dispatcher",
              "num_gpus", "offload", "optimizer",
              "pack_sequences", "parallel", "recompute",
              "routing_imbalance", "routing_replay", "steps_per_rollout", "transformer_impl"],
}

PLAN_JSON = ["batch", "cluster", "colocate", "colocation", "diagnostics", "forecast", "memory",
             "model", "ok", "origins", "rollout", "spec", "train"]


def test_the_cli_verbs_and_their_options():
    parser = build_parser()
    [verbs] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found = {}
    for verb, sub in verbs.choices.items():
        positional = [a.dest for a in sub._actions if not a.option_strings]
        options = sorted(o for a in sub._actions for o in a.option_strings
                         if o not in ("-h", "--help"))
        found[verb] = (positional, options)
    assert found == CLI


def test_the_spec_sections_and_their_keys():
    schema = json.loads((ROOT / "schema" / "vime.schema.json").read_text())
    found = {name: sorted(section.get("properties", {}))
             for name, section in schema["properties"].items()}
    assert found == SPEC


def test_the_top_level_keys_of_plan_json(capsys):
    assert main(["plan", str(ROOT / "specs" / "qwen3_30b.toml"), "--json"]) == 0
    assert sorted(json.loads(capsys.readouterr().out)) == PLAN_JSON
