"""The toy task of specs/tiny_cpu.toml: small additions answered in \\boxed{}, a word-level
tokenizer built from the prompts (runtime/node/driver.py builds it for a random_init model
without one), and a graded reward (the spec's rollout.reward = "runtime.toy:reward").

    python -m runtime.toy write specs/data/tiny_arithmetic.jsonl   # the committed prompts

The reward's grades and what a policy scores: docs/design.md, "The toy task".
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable
from pathlib import Path

from runtime.rl.rewards import answers_match, last_boxed

PAD, EOS, BOS_TURN, UNK = "<pad>", "<|im_end|>", "<|im_start|>", "<unk>"
SPECIAL = (PAD, EOS, BOS_TURN, UNK)
# Always in the vocabulary, so the answer formats of the built-in verifiers can be written.
FORMAT_WORDS = ("\\boxed{", "{", "}", "Answer", ":", "-", ".", "/", "user", "assistant",
                *(str(d) for d in range(10)))
# ChatML, as Qwen's templates; `tokenize=False` then encode gives the same ids.
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")
WORD_PATTERN = r"\\boxed\{|\d|[^\w\s]|\w+"


def words(text: str) -> list[str]:
    """How the tokenizer splits text: whitespace, then \\boxed{, single digits, single
    punctuation marks and runs of letters."""
    return re.findall(WORD_PATTERN, text)


def build_tokenizer(texts: Iterable[str]):
    """A word-level tokenizer whose vocabulary is the special tokens, FORMAT_WORDS and every
    word of texts (sorted, so the same texts give the same ids)."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = sorted({w for text in texts for w in words(text)} | set(FORMAT_WORDS))
    ids = {token: index for index, token in enumerate([*SPECIAL, *vocabulary])}
    core = Tokenizer(models.WordLevel(ids, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Split(Regex(WORD_PATTERN), behavior="isolated"),
    ])
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS,
                                        unk_token=UNK)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def prompt_texts(path: Path, input_key: str, label_key: str) -> list[str]:
    """Every string of a prompt file (prompts, message contents, labels), for the vocabulary."""
    texts = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            raw = row.get(input_key, "")
            texts.extend([raw] if isinstance(raw, str) else [m.get("content", "") for m in raw])
            texts.append(str(row.get(label_key, "")))
    return texts


def arithmetic_rows(max_operand: int = 4) -> list[dict]:
    return [{"prompt": f"What is {a} + {b}? Put the answer in \\boxed{{}}.", "label": str(a + b)}
            for a in range(max_operand + 1) for b in range(max_operand + 1)]


def reward(prompt: str, response: str, label) -> dict:
    text = response.strip()
    opened = "\\boxed{" in text
    digit_next = re.search(r"\\boxed\{\s*\d", text) is not None
    boxed = last_boxed(text)
    whole_number = boxed is not None and re.fullmatch(r"\d+", boxed.replace(" ", "")) is not None
    correct = whole_number and answers_match(boxed, label)
    alone = whole_number and re.fullmatch(r"\\boxed\{[\d ]+\}", text) is not None
    score = 0.1 * opened + 0.1 * digit_next + 0.2 * whole_number + 0.2 * alone + 0.4 * correct
    return {"score": round(score, 6), "acc": 1.0 if correct else 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.toy")
    verbs = parser.add_subparsers(dest="verb", required=True)
    write = verbs.add_parser("write", help="write the arithmetic prompts as JSONL")
    write.add_argument("path")
    write.add_argument("--max-operand", type=int, default=4)
    args = parser.parse_args(argv)
    rows = arithmetic_rows(args.max_operand)
    Path(args.path).write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{len(rows)} prompts written to {args.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
