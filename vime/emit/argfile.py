"""An argument list as text: one flag per line, every token shell-quoted, so that
`shlex.split(text)` gives back exactly the list the runtime passes."""

from __future__ import annotations

import shlex


def render(groups: list[list[str]]) -> str:
    return "".join(" ".join(shlex.quote(token) for token in group) + "\n" for group in groups)


def parse(text: str) -> list[str]:
    return shlex.split(text, comments=False)
