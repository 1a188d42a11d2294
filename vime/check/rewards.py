"""V906-V907, V930: rollout.reward (a built-in verifier, a `module.path:function` or a reward
server's URL) and rollout.function (a `module.path:function`)."""

from __future__ import annotations

import ast
import difflib
import importlib.machinery
import importlib.util
import os
import re
import sys
from pathlib import Path as FsPath
from typing import NamedTuple

from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec
from vime.rewards import BUILTIN_REWARDS


@rule("V906", "reward-is-builtin-or-module", enforced_by="vime")
def reward_is_builtin_or_module(spec: Spec):
    """rollout.reward must be a built-in reward name or "module.path:function".

    The driver looks the reward up when it starts (runtime/rl/rewards.py), after the queue
    wait and after Ray, the actor and the engines are up: a misspelt name fails there with
    "rollout.reward = 'deepscalr' is neither a built-in reward (dapo, deepscaler, math) nor
    'module.path:function'". The built-in names are deepscaler (the last \\boxed{} after the
    reasoning), dapo (DAPO-Math-17k's "Answer:" line, scored ±1) and math (either format);
    vime/rewards.py lists them for the compiler, and a test keeps that list the runtime's.
    Fix: one of the built-in names (the help line gives the closest), or your own function
    written "package.module:function" (a colon between the module and the function)."""
    reward = spec.rollout.reward
    if reward in BUILTIN_REWARDS or ":" in reward:  # a module's function or a server's URL
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


class ModuleLookup(NamedTuple):
    """Where `import module` would find a dotted module's source, or why it would not."""

    file: str | None  # the module's own source file (None: not found, or not a file)
    problem: str | None  # why `import` would not find it
    packages: tuple[str, ...] = ()  # the __init__.py files `import` runs first, outermost first


def _module_file(module: str, search: list[str]) -> ModuleLookup:
    """Where a dotted module name is found, like `import` would on this sys.path but without
    running any package's code (a reward module may import torch)."""
    path: list[str] | None = search
    found = None
    packages: list[str] = []
    parts = module.split(".")
    for depth, part in enumerate(parts):
        found = importlib.machinery.PathFinder.find_spec(part, path)
        if depth == 0 and (found is None or found.origin is None):
            # an editable install maps its packages through a finder of its own, not a path
            # entry, and `import` takes its regular package over a namespace folder of the same
            # name on the path (a tests/runtime folder, say); asking those finders for a
            # top-level name runs no package's code
            found = next((spec for finder in sys.meta_path
                          if finder is not importlib.machinery.PathFinder
                          and hasattr(finder, "find_spec")
                          and (spec := finder.find_spec(part, None)) is not None), None) or found
        if found is None:
            where = ".".join(parts[:depth]) or "the Python path"
            return ModuleLookup(None, f"no module {'.'.join(parts[:depth + 1])!r} in {where}")
        path = found.submodule_search_locations
        if depth < len(parts) - 1:
            if path is None:
                return ModuleLookup(None,
                                    f"{'.'.join(parts[:depth + 1])!r} is a module, not a package")
            if found.has_location and found.origin:
                packages.append(found.origin)
    return ModuleLookup(found.origin if found and found.has_location else None, None,
                        tuple(packages))


def _syntax_error(file: str) -> str | None:
    """"FILE:LINE: MESSAGE" when a Python source file does not compile (what `import` would
    raise as SyntaxError), without running it; None when it compiles or is not Python source."""
    if not file.endswith(".py"):
        return None
    try:
        source = FsPath(file).read_bytes()
    except OSError:
        return None
    try:
        compile(source, file, "exec", dont_inherit=True)
    except SyntaxError as err:  # IndentationError and TabError are SyntaxErrors
        return f"{file}:{err.lineno or 1}: {err.msg}"
    except ValueError as err:  # a NUL byte in the source
        return f"{file}: {err}"
    return None


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


def job_pythonpath(env: dict[str, str], environ) -> list[str]:
    """The PYTHONPATH the job's processes get: [cluster.env]'s when set (job.sbatch exports
    it over the submitting shell's, `$PYTHONPATH` in it standing for that one), else the
    submitting shell's, which sbatch and `--local` pass on; absolute entries only."""
    inherited = str(environ.get("PYTHONPATH", ""))
    own = env.get("PYTHONPATH")
    text = inherited if own is None else re.sub(r"\$\{?PYTHONPATH\}?", inherited, str(own))
    return [p for p in text.split(os.pathsep) if os.path.isabs(p) and "$" not in p]


def reward_search_path(spec: Spec) -> list[str]:
    """Where the driver finds rollout.reward's module, in its order (runtime/rl/rewards.py
    load): the spec's folder, the job's PYTHONPATH, the installed packages. The folder vime
    runs in is not among them: a job on Slurm runs in its experiment folder."""
    cwd = os.getcwd()
    installed = [p for p in sys.path if p and os.path.abspath(p) != cwd]
    return [*([spec.spec_dir] if spec.spec_dir else []),
            *job_pythonpath(spec.cluster.env, os.environ), *installed]


@rule("V907", "custom-reward-importable", severity="warning", enforced_by="vime")
def custom_reward_importable(spec: Spec):
    """A "module:function" reward that the job's driver would not find or could not import.

    The driver imports the reward's module when it starts (runtime/rl/rewards.py), on the
    cluster, after the queue wait: a module it cannot find fails with "rollout.reward =
    '...': cannot import ...", a function the module lacks with "... has no ...". The driver
    looks in the spec's folder first, then the job's PYTHONPATH ([cluster.env]'s, else that of
    the shell vime submit ran in, which sbatch and --local pass on), then the installed
    packages; vime looks in the same places, in that order, without running the module (a
    reward module may import torch), compiles its source and the __init__.py of each package
    above it (a syntax error is named with its file and line: the driver's import would raise
    it), and reads the source for a top-level definition of the function. An evaluation
    dataset's own reward (eval.datasets[].reward) is checked the same way. The folder vime runs in is not searched: a job on Slurm runs in its experiment
    folder, so a module found only there would import on one launcher and not another.
    A warning, not an error: the job's environment may differ from this one (a package
    installed only on the cluster, a PYTHONPATH set by a module system).
    Fix: put the module beside the spec, install its package, or add its folder to
    PYTHONPATH in [cluster.env]; or correct the module or function name, or the syntax error
    (`python -m py_compile FILE` shows it)."""
    rewards = {"rollout.reward": spec.rollout.reward}
    rewards.update((f"eval.datasets[{index}].reward", dataset.reward)
                   for index, dataset in enumerate(spec.eval.datasets)
                   if dataset.reward != spec.rollout.reward)
    for key, reward in rewards.items():
        if not reward.startswith(("http://", "https://")):  # a server: nothing to import here
            yield from _importable(spec, key, reward)


@rule("V930", "rollout-function-importable", severity="warning", enforced_by="vime")
def rollout_function_importable(spec: Spec):
    """A rollout.function that the job's driver would not find.

    The driver imports the rollout function's module when it starts
    (runtime/rl/custom_rollout.py), in the same places and order as rollout.reward's
    (V907): the spec's folder, the job's PYTHONPATH, the installed packages; a module it
    cannot find stops the job after the queue wait with "rollout.function = '...': cannot
    import ...". vime looks there without running the module, compiles its source (a syntax
    error is named with its file and line) and reads it for a top-level definition of the
    function. A warning, not an error: the job's environment
    may differ from this one.
    Fix: put the module beside the spec, install its package, or add its folder to
    PYTHONPATH in [cluster.env]; or correct the module or function name."""
    if spec.rollout.function:
        yield from _importable(spec, "rollout.function", spec.rollout.function)


def _importable(spec: Spec, key: str, value: str):
    """Findings for a "module:function" value of `key` whose module the driver would not
    find, whose source (or a package's __init__.py above it) does not compile, or whose
    source defines no such function at its top level."""
    module, colon, function = value.partition(":")
    if not colon:
        return
    found = _module_file(module, reward_search_path(spec))
    if found.problem:
        beside = os.path.join(spec.spec_dir or ".", *module.split(".")[:-1],
                              module.split(".")[-1] + ".py")
        yield Finding(key,
                      f"{key} = {value!r}: {found.problem}, looked for as the driver will: "
                      "in the spec's folder, the job's PYTHONPATH and the installed packages",
                      help=f"put {module.split('.')[0]} beside the spec ({beside}), install "
                      "it where the job runs, or add its folder to PYTHONPATH in [cluster.env]")
        return
    for source in [*found.packages, *([found.file] if found.file else [])]:
        if (error := _syntax_error(source)) is not None:
            yield Finding(key,
                          f"{key} = {value!r}: {error}; the driver's import of {module} "
                          "would stop the job at start",
                          help=f"correct the syntax there; `python -m py_compile {source}` "
                          "shows the same error")
            return
    if found.file and _defines(found.file, function) is False:
        yield Finding(key,
                      f"{key} = {value!r}: {found.file} defines no {function!r} at its "
                      "top level",
                      help=f"the name of a function of {module}, or define {function} there")
