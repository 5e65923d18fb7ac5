"""The import map (docs/design.md, "Code map"): no circles, counting every import (lazy ones
inside functions and those under TYPE_CHECKING too), and the readers of a run never reach
into the engine. Plus the answer path's shape: its stages, in order, one module each."""

from __future__ import annotations

import ast
from pathlib import Path

import specgen
from specgen.engine.answer import pipeline

SRC = Path(specgen.__file__).parent
READERS = ("specgen.export", "specgen.report", "specgen.verify", "specgen.merge",
           "specgen.queries", "specgen.exclusions", "specgen.liveness", "specgen.stats")


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _target(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """{module: the specgen modules it imports}; importing a.b.c imports a.b's package too."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = _target(module, is_package, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    named.add(sub if sub in modules else base)
            elif isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
        reached = set()
        for name in named:
            parts = name.split(".")
            reached.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
        graph[module] = {m for m in reached if m in modules and m != module
                         and not module.startswith(m + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_finder_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    graph = import_graph()
    assert "specgen.engine.scheduler" in graph and graph["specgen.engine.scheduler"]
    found = circles(graph)
    detail = [" -> ".join(c) for c in found]
    assert not found, f"import circles: {detail}"


def test_readers_never_import_the_engine():
    graph = import_graph()
    wrong = sorted((m, t) for m, targets in graph.items()
                   if any(m == r or m.startswith(r + ".") for r in READERS)
                   for t in targets if t == "specgen.engine" or t.startswith("specgen.engine."))
    assert not wrong, f"readers importing the engine: {wrong}"


def test_the_answer_path_is_its_stage_modules_in_order():
    names = [f"{stage.__module__.rsplit('.', 1)[1]}.{stage.__name__}" for stage in pipeline.STAGES]
    assert names == ["secret.check", "usage.check", "accept.check", "size.check", "normalise.check",
                     "witness.check", "repeats.check", "quality.check", "repetition.check",
                     "record.check"]
    for stage in pipeline.STAGES:  # one module per decision, each with its one entry point
        assert stage.__module__.startswith("specgen.engine.answer.")
