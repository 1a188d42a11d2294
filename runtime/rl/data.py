"""Prompts: read a JSONL file, render and tokenize each prompt once, and hand out batches in
a seeded order whose position is part of every checkpoint.

Each line is a JSON object; data.input_key holds the prompt, either a string or a list of
chat messages ({"role": ..., "content": ...}, as DAPO-Math-17k stores it), and
data.label_key the answer given to the reward. With data.apply_chat_template the prompt goes
through the tokenizer's chat template (a string becomes one user message) with the
generation prompt added; without it, a string is tokenized as it is. Prompts longer than
rollout.max_prompt_len tokens are dropped, as slime drops them, and counted.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

from runtime.core.slices import DataConfig

# samples of one rollout whose seeds are consecutive integers (rollout r's sample i is
# r * _SPAN + i past the run's base); the samples beyond them (a rollout of more than 100,003
# samples, or an evaluation's indices from 2**40) get a hash of (seed, rollout, sample)
_SPAN = 100_003


def request_seed(seed: int, rollout_id: int, sample: int) -> int:
    """The seed of one generation request: a function of the experiment's seed, the rollout
    and the sample's index in it, so a resumed run draws the same samples, and no two
    requests of one run share a seed (for sample < 100,003 exactly, beyond that with the
    odds of two 62-bit hashes meeting)."""
    if 0 <= sample < _SPAN:
        return ((seed * 1_000_003 + rollout_id) * _SPAN + sample) % (1 << 62)
    digest = hashlib.blake2b(f"{seed}:{rollout_id}:{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (1 << 62)


@dataclass(frozen=True)
class Prompt:
    index: int  # line number in the file (0-based, counting kept and dropped lines)
    text: str  # what the model sees, after the chat template
    token_ids: tuple[int, ...]
    label: object
    metadata: dict | None = None  # the row's data.metadata_keys, for a rollout function


def render(raw, tokenizer, apply_chat_template: bool) -> str:
    if apply_chat_template:
        messages = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw)
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if isinstance(raw, str):
        return raw
    raise ValueError("a prompt given as chat messages needs data.apply_chat_template = true")


def read_prompts(config: DataConfig, tokenizer) -> tuple[list[Prompt], int]:
    """(kept prompts, number dropped for length)."""
    prompts, dropped = [], 0
    with open(config.prompt_data, encoding="utf-8") as lines:
        for number, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{config.prompt_data}:{number + 1}: not JSON: {err}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{config.prompt_data}:{number + 1}: not a JSON object")
            for key in (config.input_key, config.label_key, *config.metadata_keys):
                if key not in row:
                    raise ValueError(f"{config.prompt_data}:{number + 1}: no key {key!r} "
                                     f"(data.input_key / data.label_key / data.metadata_keys); it has "
                                     f"{sorted(row)}")
            text = render(row[config.input_key], tokenizer, config.apply_chat_template)
            ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(ids) > config.max_prompt_len:
                dropped += 1
                continue
            prompts.append(Prompt(number, text, ids, row[config.label_key],
                                  {key: row[key] for key in config.metadata_keys}))
    if not prompts:
        raise ValueError(f"{config.prompt_data}: no prompt of at most rollout.max_prompt_len = "
                         f"{config.max_prompt_len} tokens ({dropped} longer ones dropped)")
    return prompts, dropped


class PromptSampler:
    """Batches of prompts, epoch after epoch; with shuffle, each epoch's order is a seeded
    permutation (seed + epoch), so the order never depends on how the run was interrupted."""

    def __init__(self, prompts: list[Prompt], seed: int, shuffle: bool):
        self.prompts, self.seed, self.shuffle = prompts, seed, shuffle
        self.epoch, self.offset = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_batch(self, size: int) -> list[Prompt]:
        batch = []
        while len(batch) < size:
            if self.offset == len(self._order):
                self.epoch, self.offset = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            batch.append(self.prompts[self._order[self.offset]])
            self.offset += 1
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "num_prompts": len(self.prompts)}

    def load_state_dict(self, state: dict) -> None:
        if state["num_prompts"] != len(self.prompts):
            raise ValueError(f"the checkpoint was taken with {state['num_prompts']} prompts, "
                             f"the data now has {len(self.prompts)}: the position cannot be "
                             "restored (data.prompt_data changed?)")
        self.epoch, self.offset = state["epoch"], state["offset"]
        self._order = self._permutation(self.epoch)
