"""The toy task with a calculator tool, over two turns (specs/tiny_cpu_tools.toml): the rollout
function of rollout.function, an example of runtime/rl/custom_rollout.py.

    turn 1   the policy writes; when its turn holds the word "calc", the calculator answers
    tool     "calc : 7" (the sum of the row's operands, data.metadata_keys = ["operands"]),
             or "calc : ?" when it was not called; context, never trained
    turn 2   the policy answers; runtime.toy's graded reward scores this turn alone, plus 0.1
             for having called the calculator

A random policy rarely calls the calculator or boxes a digit; the reward rises as it learns
the box format and to copy the calculator's answer into it.

    python -m runtime.toy_tools write specs/data/tiny_arithmetic_tools.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from runtime import toy

CALL = "calc"


def calculator(operands) -> str:
    """The tool's answer: the sum of the operands."""
    return str(sum(int(x) for x in operands))


async def rollout(ctx) -> dict:
    first = await ctx.generate()
    called = CALL in toy.words(first.text)
    ctx.append(text=f" {CALL} : {calculator(ctx.metadata['operands']) if called else '?'} ")
    final = await ctx.generate()
    graded = toy.reward(ctx.prompt, final.text, ctx.label)
    return {"score": graded["score"] + 0.1 * called, "acc": graded["acc"],
            "tool_called": float(called)}


def rows(max_operand: int = 4) -> list[dict]:
    return [{"prompt": f"What is {a} + {b}? Ask {CALL}, then put the answer in \\boxed{{}}.",
             "label": str(a + b), "operands": [a, b]}
            for a in range(max_operand + 1) for b in range(max_operand + 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.toy_tools")
    verbs = parser.add_subparsers(dest="verb", required=True)
    write = verbs.add_parser("write", help="write the arithmetic prompts with their operands")
    write.add_argument("path")
    args = parser.parse_args(argv)
    data = rows()
    Path(args.path).write_text("".join(json.dumps(row) + "\n" for row in data))
    print(f"{len(data)} prompts written to {args.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
