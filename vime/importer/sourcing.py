"""Where a launch script's `source FILE` is on this machine (shell.py's Reader calls it).

A script names its models file as it is on the cluster: beside the script
(`${SCRIPT_DIR}/models/qwen3-4B.sh`), in another folder of the checkout
(`${SCRIPT_DIR}/../../scripts/models/qwen3-4B.sh`) or at the checkout's absolute path there
(`source /root/slime/scripts/models/qwen3-4B.sh`). The file is the one named when it exists;
otherwise the same tail of its path under the checkout: the folder `vime import --repo-root`
names, or without it the folders above the script up to the one that holds `.git` (a script
in no git checkout finds nothing there).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple


class Sourced(NamedTuple):
    path: Path
    checkout: Path | None  # the checkout the path's tail was found under; None: as named


def find_sourced(target: str, script_dir: Path, outermost: Path | None,
                 repo_root: Path | None) -> Sourced | None:
    """The file `source TARGET` reads, read from `script_dir` (the folder of the file that
    sources it); `outermost` is the imported script (whose folders are searched for the
    checkout when `repo_root` is None). None when no candidate is a file."""
    given = Path(target)
    candidates = [given] if given.is_absolute() else [script_dir / given, given]
    # a models file named from another checkout: scripts/models/X.sh next to this script
    parts = given.parts
    if "models" in parts:
        candidates.append(script_dir.joinpath(*parts[parts.index("models"):]))
    candidates.append(script_dir / "models" / given.name)
    for candidate in candidates:
        if _is_file(candidate):
            return Sourced(candidate, None)
    tail = _tail(given)
    roots = [repo_root] if repo_root is not None else _checkout_folders(outermost or script_dir)
    for root in roots:
        for start in range(len(tail) - 1):  # a folder and the file at least
            candidate = root.joinpath(*tail[start:])
            if _is_file(candidate):
                return Sourced(candidate, root)
    return None


def _tail(given: Path) -> tuple[str, ...]:
    """The path's parts after its root and after its last `..`."""
    parts = [part for part in given.parts if part not in (given.anchor, ".")]
    if ".." in parts:
        parts = parts[len(parts) - parts[::-1].index(".."):]
    return tuple(parts)


def _checkout_folders(start: Path) -> list[Path]:
    """`start`'s folder and those above it, nearest first, up to the one holding .git; none
    when no folder above holds one (the checkout is unknown: --repo-root names it)."""
    try:
        folder = start.resolve()
    except (OSError, RuntimeError):
        folder = start.absolute()
    if not folder.is_dir():
        folder = folder.parent
    found = []
    for candidate in (folder, *folder.parents):
        found.append(candidate)
        if (candidate / ".git").exists():
            return found
    return []


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long, or with a NUL
        return False
