"""docs/import.md, generated from the table `vime import` maps flags with (a test keeps it
current): `python -m vime.importer.docs > docs/import.md`."""

from __future__ import annotations

import inspect

from vime.importer import table

KIND_TEXT = {
    "key": "{key}",
    "arch": "`[model.arch]` {key} (checked against config.json; a preset when they match)",
    "cluster": "{key}",
    "joint": "{key}",
    "derived": "set by vime (V965){expect}",
    "not_yet": "not yet in vime (V964): {key}",
    "none": "no equivalent (V963)",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(row: table.Flag) -> str:
    expect = f": {' or '.join(row.expect)}" if row.expect else ""
    shown = f"`{row.key}`" if row.kind != "arch" else row.key
    if row.value == "pairs":
        shown = f"`[[{row.key}]]` name and prompt_data"
    elif row.key.startswith("eval.datasets."):  # a key of each [[eval.datasets]] table
        shown = f"`[[eval.datasets]]` {row.key.removeprefix('eval.datasets.')}"
    what = KIND_TEXT[row.kind].format(key=shown, expect=expect)
    if row.kind == "key" and row.value in ("true", "false"):
        what += f" = {row.value}"
    elif row.kind == "key" and row.value.startswith("set:"):
        what += f" = \"{row.value.removeprefix('set:')}\""
    if row.choices:
        what += " (" + ", ".join(f"{k} → {v}" for k, v in row.choices.items()) + ")"
    if row.beyond:
        what += f"; other values: not yet in vime (V964): {row.beyond}"
    if row.family:
        what += f"; DeepSeek-V3 / GLM-4.5: `[model.arch]` {row.family.split(':')[0]}"
    severity = "" if row.kind in ("key", "arch", "cluster", "joint") else row.severity
    names = "<br>".join(f"`{name}`" for name in row.names)
    return f"| {names} | {_cell(what)} | {severity} | {_cell(row.why)} |"


def markdown() -> str:
    lines = [
        "# Coming from upstream vime or slime: `vime import`",
        "",
        "Generated from vime/importer/table.py, the table `vime import` maps flags with "
        "(`python -m vime.importer.docs > docs/import.md`).",
        "",
        "```",
        "vime import scripts/run-qwen3-30B-A3B.sh -o qwen3.toml [--env ACTOR_NUM_NODES=2 ...]",
        "vime plan qwen3.toml",
        "vime import --argv flags.txt -o qwen3.toml   # the flags train.py received, one "
        "shell-quoted list",
        "```",
        "",
        "The script is read, never run: assignments, arrays and `+=`, `source` of a models "
        "file (`VAR=value source FILE` too; a path that is the cluster's, such as "
        "`/root/slime/scripts/models/X.sh`, is read from the same path's tail in the checkout: "
        "`--repo-root DIR`, or the folders above the script up to its `.git`), "
        "`${VAR:-default}`, `${A[@]+\"${A[@]}\"}`, `export`, `if [[ ... ]]` on known values, "
        "`for ((i=0; i<N; i++))` loops on known integers, `printf -v VAR FORMAT ...`, "
        "`$(seq a b c)`, `$(cd -- DIR && pwd)`, `$(dirname -- PATH)`, `$([IFS=X;] echo ...)`, "
        "`$((...))`, `read` of a here-string of known text (`IFS=, read -r -a A <<< \"$LIST\"`) "
        "and line continuations; "
        "`\"${DIR}/train.py\"` is train.py whatever DIR is. Anything else is reported with its "
        "line (V960, V961) and what it would set is unknown, never guessed; `--env NAME=VALUE` "
        "sets what the script reads from its environment. The flags after `train.py` on the "
        "command that runs it are mapped below; each key of the written spec has a comment "
        "naming the flag and line it came from, and the report lists every flag that did not "
        "become a key. Exit status: 0 the spec is complete, 1 it is written but a flag did "
        "not map (an error in the report), 2 usage (an `-o` file that exists without "
        "`--force`, an unreadable script, a `--repo-root` that is no folder).",
        "",
        "Flags not in the table: `--vllm-X` is vLLM's `--X` and goes to "
        "`inference.extra_args` (V970) when vLLM has it (vime/data/vllm-flags-*.json); a "
        "Megatron flag (vime/data/megatron-flags-*.json) or another train.py flag "
        "(vime/data/upstream-flags.json) is V963; `--sglang-*` is V967; anything else is V966.",
        "",
        "## Flag → key",
        "",
        "| flag | key or verdict | severity | notes |",
        "|---|---|---|---|",
    ]
    lines += [_row(row) for row in table.FLAGS]
    lines += [
        "",
        "## Defaults that differ",
        "",
        "A flag's absence means train.py's default, which vime's default does not always "
        "equal; the imported spec writes train.py's.",
        "",
        "| key | without the flag | flag | whose default |",
        "|---|---|---|---|",
    ]
    for key, (value, flag, whose) in table.UPSTREAM_DEFAULTS.items():
        shown = str(value).lower() if isinstance(value, bool) else repr(value)
        owner = whose.removesuffix("'s")
        lines.append(f"| `{key}` | {shown} | `{flag}` | {owner} |")
    lines += [
        "| `algorithm.eps_clip_high` | the `--eps-clip` value | `--eps-clip-high` | train.py |",
        "| `algorithm.kl_estimator` | k1 (with `--use-kl-loss`) | `--kl-loss-type` | train.py |",
        "| `algorithm.kl_loss_coef` | 0 | `--use-kl-loss` | train.py |",
        "| `train.colocate` | false | `--colocate` | train.py |",
        "| `eval.at_start`, `eval.at_end` | false: no evaluation | `--eval-interval` | train.py |",
        "",
        "## Codes",
        "",
    ]
    for code, (name, severity, text) in sorted(table.CODES.items()):
        lines += [f"### {code} {name} ({severity})", "", inspect.cleandoc(text), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
