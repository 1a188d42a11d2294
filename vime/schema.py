"""schema/vime.schema.json: the single source of which keys exist, their types and defaults."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path as FsPath

from vime.parse import Path


@functools.cache
def load() -> dict:
    # A checkout keeps it in schema/; an installed wheel carries a copy in vime/data/.
    checkout = FsPath(__file__).resolve().parent.parent / "schema" / "vime.schema.json"
    if checkout.is_file():
        return json.loads(checkout.read_text())
    return json.loads(resources.files("vime").joinpath("data/vime.schema.json").read_text())


def node(path: Path) -> dict | None:
    """The schema of one key path (None when the path does not exist)."""
    current = load()
    for part in path:
        if current.get("type") == "array" and isinstance(part, int):
            current = current.get("items", {})
            continue
        props = current.get("properties")
        if props is None or part not in props:
            extra = current.get("additionalProperties")
            if isinstance(extra, dict) and isinstance(part, str):
                current = extra
                continue
            return None
        current = props[part]
    return current


def leaves(schema: dict | None = None, prefix: Path = ()) -> Iterator[tuple[Path, dict]]:
    """Every declared key path that is not a table, with its schema."""
    schema = load() if schema is None else schema
    for name, sub in schema.get("properties", {}).items():
        path = (*prefix, name)
        if sub.get("type") == "object" and "properties" in sub and sub["properties"]:
            yield from leaves(sub, path)
        else:
            yield path, sub


def tables(schema: dict | None = None, prefix: Path = ()) -> Iterator[Path]:
    schema = load() if schema is None else schema
    for name, sub in schema.get("properties", {}).items():
        if sub.get("type") == "object":
            yield (*prefix, name)
            yield from tables(sub, (*prefix, name))
