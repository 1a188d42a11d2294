"""The package's imports flow one way: no import circle anywhere in vime/ and runtime/, and
each sub-package of runtime/ imports only the layers below it (runtime/README.md has the
picture).

Every import statement counts: at the top of a module, inside a function (the runtime imports
Ray, torch, vLLM and its own heavier modules where it uses them), under TYPE_CHECKING. A
deferred import still makes the two modules depend on each other: in a circle, which of them
loads first decides whether a name is there yet. Names looked up at run time are not followed:
the backend registry's "module:Class" strings (runtime/backends/__init__.py) and the job's
VIME_DRIVER. Read with `ast`, nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("vime", "runtime")

# bottom to top: who may import whom (a layer always may import itself)
MAY_IMPORT = {
    "runtime.core": set(),
    "runtime.megatron": {"runtime.core"},
    "runtime.backends": {"runtime.megatron", "runtime.core"},
    "runtime.workers": {"runtime.backends", "runtime.core"},
    "runtime.rl": {"runtime.core"},
    "runtime.toy": {"runtime.rl", "runtime.core"},
    "runtime.toy_tools": {"runtime.toy", "runtime.rl", "runtime.core"},
    "runtime.node": {"runtime.toy", "runtime.rl", "runtime.workers", "runtime.backends",
                     "runtime.core"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def imported(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` (at `path`) imports, with the packages above them
    (importing a module runs its packages' __init__ first). A package above `name` itself
    counts only where it is named: it is already loading when `name` runs, so reaching it on
    the way to a sibling adds nothing, while `from <package> import <name in its __init__>`
    depends on the __init__ having run."""
    ancestors = {".".join(name.split(".")[:end]) for end in range(1, name.count(".") + 1)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:  # `from runtime import actors` names a module
                full = f"{base}.{alias.name}"
                targets.add(full if full in known else base)
    out = set()
    for target in targets:
        parts = target.split(".")
        for end in range(1, len(parts) + 1):
            prefix = ".".join(parts[:end])
            if prefix in known and prefix != name and (prefix == target or
                                                      prefix not in ancestors):
                out.add(prefix)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(path, name, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import each other in a circle (Tarjan's strongly connected groups),
    as the shortest circle through each of them (each circle once)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.add(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    out = []
    for group in groups:
        seen = set()
        for start in sorted(group):
            circle = _shortest_circle(edges, group, start)
            key = frozenset(circle)
            if key not in seen:
                seen.add(key)
                out.append(circle)
    return sorted(out)


def _shortest_circle(edges: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way back to start
        step = []
        for node in frontier:
            for nxt in sorted(edges[node] & group):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    step.append(nxt)
        frontier = step
    raise AssertionError(f"{start} is in a strongly connected group but on no circle")


def layer(name: str) -> str:
    return next((lay for lay in sorted(MAY_IMPORT, key=len, reverse=True)
                 if name == lay or name.startswith(lay + ".")), name)


def test_no_import_circle_in_the_package():
    found = cycles(graph())
    assert not found, "import circles in vime/ and runtime/:\n" + "\n".join(
        "  " + " -> ".join(c) for c in found)


def test_each_layer_imports_only_the_layers_below_it():
    wrong = []
    for name, targets in sorted(graph().items()):
        if not name.startswith("runtime.") or name == "runtime":
            continue
        lay = layer(name)
        if lay not in MAY_IMPORT:
            wrong.append(f"{name}: in no layer (runtime/README.md says where a module goes)")
            continue
        wrong += [f"{name} imports {t}" for t in sorted(targets)
                  if t.startswith("runtime.") and layer(t) != lay
                  and layer(t) not in MAY_IMPORT[lay]]
    assert not wrong, "imports against the layers (runtime/README.md):\n  " + "\n  ".join(wrong)


def test_the_cycle_finder_names_a_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(edges) == [["a", "b", "c", "a"]]


def test_a_package_above_a_module_counts_only_where_it_is_named(tmp_path):
    """`from vime.plan.groups import Layout` inside vime/plan/memory.py loads vime.plan on the
    way, which is already loading; `from vime.plan import Plan` there needs vime/plan/__init__."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg.a import A\n")
    (package / "a.py").write_text("from pkg.b import B\nA = B\n")
    (package / "b.py").write_text("B = 1\n")
    known = {"pkg": package / "__init__.py", "pkg.a": package / "a.py",
             "pkg.b": package / "b.py"}
    edges = {name: imported(path, name, known) for name, path in known.items()}
    assert edges == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": set()}
    assert cycles(edges) == []
    (package / "b.py").write_text("from pkg import A\nB = 1\n")
    edges["pkg.b"] = imported(package / "b.py", "pkg.b", known)
    assert cycles(edges) == [["pkg", "pkg.a", "pkg.b", "pkg"]]
