"""The libraries' command-line flags as data: vime/data/<library>-flags-<version>.json.

Written by `python -m vime.flags.generate vllm|megatron` from vLLM's and Megatron-LM's own
parsers (see that module for how and from which versions) and compared with the installed
library by the oracle tests. Read here without importing any library, once, and only when a
rule has flags to judge (a few tens of KB of JSON per version).

An argument is read the way vLLM's FlexibleArgumentParser reads one element of argv:
`--name=value` or `--name`; underscores in the name (up to the first dot) count as dashes;
`--name.key=value` sets one key of a JSON flag; a unique prefix of a flag is taken for it
(argparse's allow_abbrev, on in vLLM's parser), several matching flags are an error.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.+]", version))


@dataclass(frozen=True)
class Catalog:
    library: str
    versions: tuple[str, ...]  # oldest first
    by_version: dict[str, dict[str, dict]]  # version -> option string -> action entry

    def entries(self, option: str) -> dict[str, dict]:
        """version -> the action of `option` in that version (absent where it is no flag)."""
        return {v: opts[option] for v, opts in self.by_version.items() if option in opts}

    @functools.cached_property
    def options(self) -> tuple[str, ...]:
        return tuple(sorted({o for opts in self.by_version.values() for o in opts}))

    def prefix_matches(self, prefix: str) -> dict[str, list[str]]:
        """version -> the option strings that start with prefix (argparse's abbreviations)."""
        return {v: [o for o in opts if o.startswith(prefix)] for v, opts in self.by_version.items()}

    def newest(self, option: str) -> tuple[str, dict] | None:
        found = self.entries(option)
        if not found:
            return None
        version = max(found, key=_version_key)
        return version, found[version]


@functools.cache
def catalog(library: str) -> Catalog:
    by_version: dict[str, dict[str, dict]] = {}
    for path in DATA.glob(f"{library}-flags-*.json"):
        data = json.loads(path.read_text())
        by_version[data["version"]] = {o: a for a in data["actions"] for o in a["options"]}
    versions = tuple(sorted(by_version, key=_version_key))
    return Catalog(library, versions, {v: by_version[v] for v in versions})


@dataclass(frozen=True)
class Arg:
    """One element of extra_args as vLLM's parser reads it."""

    text: str
    name: str  # normalised: underscores -> dashes, without the `.key` part
    key: str | None  # the `.key.path` of a JSON flag, without the dot
    value: str | None  # after `=`; None when there is no `=`

    @property
    def shown(self) -> str:
        return self.name + (f".{self.key}" if self.key else "")


def split(arg: str) -> Arg:
    head, eq, value = arg.partition("=")
    name, dot, key = head.partition(".")
    return Arg(arg, name.replace("_", "-"), key if dot else None, value if eq else None)


@dataclass(frozen=True)
class Resolved:
    option: str | None  # the catalog's option string, None when no version has it
    abbreviation: bool = False
    ambiguous: tuple[str, ...] = ()  # every version that knows a prefix match finds several


def resolve(cat: Catalog, name: str) -> Resolved:
    if cat.entries(name):
        return Resolved(name)
    unique: set[str] = set()
    several: set[str] = set()
    for matches in cat.prefix_matches(name).values():
        if len(matches) == 1:
            unique.add(matches[0])
        elif matches:
            several.update(matches)
    if len(unique) == 1 and not several:
        return Resolved(unique.pop(), abbreviation=True)
    if unique or several:
        return Resolved(None, ambiguous=tuple(sorted(unique | several)))
    return Resolved(None)


def versions_text(versions) -> str:
    versions = list(versions)
    if len(versions) == 1:
        return versions[0]
    return ", ".join(versions[:-1]) + " or " + versions[-1]
