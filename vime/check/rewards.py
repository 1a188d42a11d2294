"""V906-V907: rollout.reward, a built-in verifier or a `module.path:function`."""

from __future__ import annotations

import ast
import difflib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path as FsPath

from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec
from vime.rewards import BUILTIN_REWARDS


@rule("V906", "reward-is-builtin-or-module", enforced_by="vime")
def reward_is_builtin_or_module(spec: Spec):
    """rollout.reward must be a built-in reward name or "module.path:function".

    The driver looks the reward up when it starts (runtime/rewards.py), after the queue
    wait and after Ray, the actor and the engines are up: a misspelt name fails there with
    "rollout.reward = 'deepscalr' is neither a built-in reward (dapo, deepscaler, math) nor
    'module.path:function'". The built-in names are deepscaler (the last \\boxed{} after the
    reasoning), dapo (DAPO-Math-17k's "Answer:" line, scored ±1) and math (either format);
    vime/rewards.py lists them for the compiler, and a test keeps that list the runtime's.
    Fix: one of the built-in names (the help line gives the closest), or your own function
    written "package.module:function" (a colon between the module and the function)."""
    reward = spec.rollout.reward
    if reward in BUILTIN_REWARDS or ":" in reward:
        return
    close = difflib.get_close_matches(reward, list(BUILTIN_REWARDS), n=1, cutoff=0.6)
    names = ", ".join(sorted(BUILTIN_REWARDS))
    if close:
        fix = f'did you mean rollout.reward = "{close[0]}"? the built-in rewards are {names}'
    elif "." in reward:
        module, _, function = reward.rpartition(".")
        fix = (f'a custom reward is written "module:function": rollout.reward = '
               f'"{module}:{function}"')
    else:
        fix = f'the built-in rewards are {names}; a custom one is "package.module:function"'
    yield Finding("rollout.reward",
                  f"rollout.reward = {reward!r} is neither a built-in reward nor "
                  "\"module.path:function\": the driver would stop at start",
                  help=fix)


def _module_file(module: str, search: list[str]) -> tuple[str | None, str | None]:
    """(file, problem) for a dotted module name, found like `import` would on this sys.path
    but without running any package's code (a reward module may import torch)."""
    path: list[str] | None = search
    found = None
    parts = module.split(".")
    for depth, part in enumerate(parts):
        found = importlib.machinery.PathFinder.find_spec(part, path)
        if found is None and depth == 0:
            # an editable install maps its packages through a finder of its own, not a path
            # entry; asking the import system for a top-level name runs no package's code
            found = importlib.util.find_spec(part)
        if found is None:
            where = ".".join(parts[:depth]) or "the Python path"
            return None, f"no module {'.'.join(parts[:depth + 1])!r} in {where}"
        path = found.submodule_search_locations
        if depth < len(parts) - 1 and path is None:
            return None, f"{'.'.join(parts[:depth + 1])!r} is a module, not a package"
    return (found.origin if found and found.has_location else None), None


def _top_level_names(body: list[ast.stmt]) -> tuple[set[str], bool]:
    """Names bound by a module's top-level statements (inside if / try / with too), and
    whether the module may bind others vime cannot see (`import *`, a module __getattr__)."""
    names: set[str] = set()
    opaque = False
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                opaque |= alias.name == "*"
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
            nested = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                      *(s for h in getattr(node, "handlers", []) for s in h.body)]
            more, more_opaque = _top_level_names(nested)
            names |= more
            opaque |= more_opaque
    return names, opaque or "__getattr__" in names


def _defines(file: str, name: str) -> bool | None:
    """Whether a Python source file binds `name` at its top level; None when that cannot be
    told without running it (not Python source, unreadable, `import *`)."""
    if not file.endswith(".py"):
        return None
    try:
        tree = ast.parse(FsPath(file).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    names, opaque = _top_level_names(tree.body)
    return True if name in names else (None if opaque else False)


@rule("V907", "custom-reward-importable", severity="warning", enforced_by="vime")
def custom_reward_importable(spec: Spec):
    """A "module:function" reward that cannot be found where vime runs.

    The driver imports the reward's module when it starts (runtime/rewards.py), on the
    cluster, after the queue wait: a module that is not installed there fails with
    "rollout.reward = '...': cannot import ...", a function the module lacks with "... has
    no ...". vime looks for the module on its own Python path and the
    PYTHONPATH of [cluster.env], without running it (a reward module may import torch),
    and reads the source for a top-level definition of the function.
    A warning, not an error: the job's environment may differ from this one (a package
    installed only on the cluster, a PYTHONPATH set by a module system).
    Fix: install the package (or add its folder to PYTHONPATH in [cluster.env]) on the
    cluster and here, or correct the module or function name."""
    reward = spec.rollout.reward
    module, colon, function = reward.partition(":")
    if not colon:
        return
    pythonpath = str(spec.cluster.env.get("PYTHONPATH", ""))
    search = [p or os.getcwd() for p in sys.path]
    search += [p for p in pythonpath.split(os.pathsep) if os.path.isabs(p) and "$" not in p]
    file, problem = _module_file(module, search)
    if problem:
        yield Finding("rollout.reward",
                      f"rollout.reward = {reward!r}: {problem} here; the driver imports it at "
                      "start and would stop if the job cannot either",
                      help=f"install {module.split('.')[0]} where the job runs (and here), or "
                      "add its folder to PYTHONPATH in [cluster.env]")
        return
    if file and _defines(file, function) is False:
        yield Finding("rollout.reward",
                      f"rollout.reward = {reward!r}: {file} defines no {function!r} at its "
                      "top level",
                      help=f"the name of a function of {module}, or define {function} there")
