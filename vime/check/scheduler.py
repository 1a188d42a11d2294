"""V926: vLLM scheduler settings in inference.extra_args that vLLM refuses in combination.

Each flag's own value is V512's; this is what vLLM's SchedulerConfig (config/scheduler.py,
verify_max_model_len, 0.26 to 0.33) refuses about several of them together, with the
max_model_len vime passes (rollout.max_prompt_len + rollout.max_response_len)."""

from __future__ import annotations

import re

from vime.check.engine_flags import Parsed, parse
from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec

_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def human_int(value: str | None) -> int | None:
    """vLLM's human_readable_int (vllm/utils/argparse_utils.py): "1k" 1000, "1K" 1024."""
    if value is None:
        return None
    value = value.strip()
    found = _HUMAN.fullmatch(value)
    if found:
        number, suffix = found.groups()
        power = "kmgt".index(suffix.lower()) + 1
        if suffix.islower():
            return int(float(number) * 10 ** (3 * power))
        return int(float(number)) * 2 ** (10 * power) if number.isdigit() else None
    try:
        return int(value)
    except ValueError:
        return None


def _settings(spec: Spec) -> dict[str, tuple[Parsed, int | bool]]:
    """dest -> (the last flag that set it, its value) for the scheduler's fields."""
    found: dict[str, tuple[Parsed, int | bool]] = {}
    for p in parse(spec.inference.extra_args):
        if p.dest == "enable_chunked_prefill":
            found[p.dest] = (p, not p.is_false and p.arg.value not in ("false", "False", "0"))
        elif p.dest in ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold",
                        "max_num_active_seqs"):
            number = human_int(p.arg.value)
            if number is not None:
                found[p.dest] = (p, number)
    return found


def _where(p: Parsed) -> str:
    return f"inference.extra_args[{p.index}]"


@rule("V926", "vllm-scheduler-limits", enforced_by="vllm")
def vllm_scheduler_limits(spec: Spec):
    """Scheduler flags in inference.extra_args that vLLM refuses together.

    vLLM's SchedulerConfig checks its limits against each other and against max_model_len
    when an engine starts (config/scheduler.py, verify_max_model_len), after the queue wait
    and the model's load:
    - with chunked prefill off (--no-enable-chunked-prefill), --max-num-batched-tokens below
      max_model_len: "max_num_batched_tokens (N) is smaller than max_model_len (M). This
      effectively limits the maximum sequence length ...";
    - --max-num-batched-tokens below --max-num-seqs: "max_num_batched_tokens (N) must be
      greater than or equal to max_num_seqs (S).";
    - --long-prefill-token-threshold above max_model_len, and --max-num-active-seqs above
      --max-num-seqs.
    vime passes --max-model-len = rollout.max_prompt_len + rollout.max_response_len.
    Fix: raise --max-num-batched-tokens (to max_model_len or more, or turn chunked prefill
    back on), or lower the other flag as the help line says."""
    if not spec.inference.extra_args or spec.inference.backend != "vllm":
        return
    found = _settings(spec)
    model_len = spec.max_model_len
    batched = found.get("max_num_batched_tokens")
    chunked = found.get("enable_chunked_prefill")
    seqs = found.get("max_num_seqs")
    related = ("rollout.max_prompt_len", "rollout.max_response_len")
    if batched and chunked and chunked[1] is False and batched[1] < model_len:
        yield Finding(_where(batched[0]),
                      f"max_num_batched_tokens ({batched[1]}) is smaller than max_model_len "
                      f"({model_len}) with chunked prefill off ({chunked[0].arg.name}): vLLM "
                      "refuses to start the engine", related=related,
                      help=f"--max-num-batched-tokens={model_len} or more, or remove "
                      f"{chunked[0].arg.name}")
    if batched and seqs and batched[1] < seqs[1]:
        yield Finding(_where(batched[0]),
                      f"max_num_batched_tokens ({batched[1]}) must be greater than or equal "
                      f"to max_num_seqs ({seqs[1]}), vLLM says, and stops",
                      help=f"--max-num-batched-tokens={seqs[1]} or more, or "
                      f"--max-num-seqs={batched[1]}")
    threshold = found.get("long_prefill_token_threshold")
    if threshold and threshold[1] > model_len:
        yield Finding(_where(threshold[0]),
                      f"long_prefill_token_threshold ({threshold[1]}) cannot be greater than "
                      f"the max_model_len ({model_len}), vLLM says, and stops", related=related,
                      help=f"--long-prefill-token-threshold={model_len} or less")
    active = found.get("max_num_active_seqs")
    if active and seqs and active[1] > seqs[1]:
        yield Finding(_where(active[0]),
                      f"max_num_active_seqs ({active[1]}) cannot be greater than max_num_seqs "
                      f"({seqs[1]}), vLLM says, and stops",
                      help=f"--max-num-active-seqs={seqs[1]} or less")
