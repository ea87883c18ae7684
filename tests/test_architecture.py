"""Architecture checks: no import circle between privaudit's modules."""

from __future__ import annotations

import ast
from pathlib import Path

import privaudit

ROOT = Path(__file__).resolve().parents[1] / "privaudit"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> privaudit modules it imports anywhere in its body (lazy imports included)."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                found = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            else:
                continue
            targets.update(t for t in found if t in modules and t != name)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_on_a_known_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_graph_sees_privaudit_imports():
    graph = import_graph()
    assert "privaudit.defenses.base" in graph["privaudit.protocols.base"]
    assert "privaudit.errors" in graph["privaudit.registry"]
    assert privaudit.__name__ in graph


# The circle between the experiment, the audit and the reports is being cut by the runner and
# results split; until that lands it is the only one tolerated, and only among these modules.
_PENDING_SPLIT = {"privaudit.audit", "privaudit.experiment", "privaudit.reports.figures", "privaudit.reports.render"}


def test_no_import_circle():
    found = [c for c in cycles(import_graph()) if not set(c) <= _PENDING_SPLIT]
    assert found == [], f"import circles: {found}"


def test_layers_point_one_way():
    """Defenses never import protocols or attacks; protocols never import attacks."""
    graph = import_graph()
    bad = []
    for module, targets in graph.items():
        for below, above in (("defenses", ("protocols", "attacks")), ("protocols", ("attacks",))):
            if module.startswith(f"privaudit.{below}"):
                bad += [(module, t) for t in targets if t.startswith(tuple(f"privaudit.{a}" for a in above))]
    assert bad == [], f"imports against the layering: {bad}"
