"""max_position_embeddings is never vime's default in silence: `vime import` takes it from
--max-position-embeddings, the checkpoint's config.json, the preset or --seq-length and says
which, and `vime plan` warns (V104) when nothing gives it."""

from __future__ import annotations

import json
import shlex

from vime import pipeline
from vime.importer import import_argv
from vime.importer.toml_out import render
from vime.parse import Source
from vime.resolve.model import PRESETS

# THUDM/slime scripts/models/qwen3-4B.sh at 624b824a (MODEL_ARGS as written: no
# --max-position-embeddings), with PERF_ARGS' --seq-length of a script of the same tree
QWEN3_4B = shlex.split("""--swiglu --num-layers 36 --hidden-size 2560 --ffn-hidden-size 9728
--num-attention-heads 32 --group-query-attention --num-query-groups 8
--use-rotary-position-embeddings --disable-bias-linear --normalization RMSNorm
--norm-epsilon 1e-6 --rotary-base 1000000 --vocab-size 151936 --kv-channels 128
--qk-layernorm""")
# a Qwen3 of a size no preset has (the 4B's, 28 layers)
OTHER = [w if w != "36" else "28" for w in QWEN3_4B]
RUN = shlex.split("""--hf-checkpoint /nonexistent/Qwen3-4B --prompt-data /nonexistent/p.jsonl
--num-rollout 2 --rollout-batch-size 8 --n-samples-per-prompt 4 --rollout-max-prompt-len 1024
--rollout-max-response-len 3072 --colocate --actor-num-nodes 1 --actor-num-gpus-per-node 8""")


def _notes(result) -> list[str]:
    return [f"{f.code} {f.severity} {f.message}" for f in result.findings
            if "max_position_embeddings" in f.message]


def _plan_codes(result, tmp_path) -> dict[str, str]:
    planned = pipeline.run(Source("imported.toml", render(result, str(tmp_path))), [], tmp_path)
    return {d.code: d.message for d in planned.diagnostics}


def test_seq_length_gives_it_when_nothing_else_does_and_the_plan_is_quiet(tmp_path):
    result = import_argv(OTHER + RUN + ["--seq-length", "4096"])
    assert result.values["model.arch.max_position_embeddings"] == 4096
    assert result.origins["model.arch.max_position_embeddings"].flag == "--seq-length 4096"
    [note] = _notes(result)
    assert note.startswith("V965 note --seq-length 4096: max_position_embeddings = 4096")
    assert "V104" not in _plan_codes(result, tmp_path)


def test_nothing_gives_it_a_warning_at_import_and_v104_at_plan(tmp_path):
    result = import_argv(OTHER + RUN)
    assert "model.arch.max_position_embeddings" not in result.values
    [warning] = _notes(result)
    assert warning.startswith("V963 warning nothing gives max_position_embeddings")
    codes = _plan_codes(result, tmp_path)
    assert "vime's default 2048" in codes["V104"]
    # 1024 + 3072 tokens do not fit 2048: V506 says its limit is that default
    assert "(vime's default: nothing gives it, V104)" in codes["V506"]


def test_the_flag_the_preset_and_config_json_come_first(tmp_path):
    flag = import_argv(OTHER + RUN + ["--max-position-embeddings", "40960", "--seq-length",
                                      "4096"])
    assert flag.values["model.arch.max_position_embeddings"] == 40960
    preset = import_argv(QWEN3_4B + RUN + ["--seq-length", "4096"])
    assert preset.values["model.preset"] == "qwen3-4b"
    assert "model.arch.max_position_embeddings" not in preset.values
    assert _notes(preset) == ["V965 note max_position_embeddings = 40960 from the preset "
                              "qwen3-4b (the model args have no --max-position-embeddings)"]
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({**PRESETS["qwen3-4b"],
                                                        "max_position_embeddings": 32768}))
    run = [str(checkpoint) if w == "/nonexistent/Qwen3-4B" else w for w in RUN]
    read = import_argv(QWEN3_4B + run + ["--seq-length", "4096"])
    assert "model.arch.max_position_embeddings" not in read.values
    assert _notes(read) == ["V965 note max_position_embeddings = 32768 from the checkpoint's "
                            "config.json (the model args have no --max-position-embeddings)"]
