"""docs/rules.md, generated from the registry (`make docs`; a test keeps it current)."""

from __future__ import annotations

import inspect

from vime.check import RULES, STAGE_CODES


def markdown() -> str:
    lines = [
        "# vime diagnostic codes",
        "",
        "Generated from the rule registry by `make docs`; `vime explain CODE` prints the long text.",
        "",
        "| code | name | severity | fails at run time in | what it protects |",
        "|---|---|---|---|---|",
    ]
    for code, (name, text) in sorted(STAGE_CODES.items()):
        lines.append(f"| {code} | {name} | error | vime (before any rule) | "
                     f"{inspect.cleandoc(text).splitlines()[0]} |")
    for code, rule in sorted(RULES.items()):
        lines.append(f"| {code} | {rule.name} | {rule.severity} | {rule.enforced_by} | "
                     f"{rule.summary} |")
    lines += ["", "## Explanations", ""]
    for code in sorted({*RULES, *STAGE_CODES}):
        if code in RULES:
            name, text = RULES[code].name, RULES[code].explanation
        else:
            name, text = STAGE_CODES[code][0], inspect.cleandoc(STAGE_CODES[code][1])
        lines += [f"### {code} {name}", "", text, ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
