"""The import graph of privaudit (every import statement, also inside functions and under
TYPE_CHECKING) has no cycle, and the layers import in one direction."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "privaudit"

#: Edges allowed to close a cycle (none: defenses annotate with ChannelContext, not Channel).
#: Edges left out of the cycle check, each with its reason.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = {
    # Transcript.save/load (and transcript.save/load/load_validated) hand over to the file layer
    # at call time (a function-level import); the model never needs it to import, and the file
    # layer builds the model's objects. One component in two modules (model vs I/O).
    ("privaudit.transcript", "privaudit.transcript_io"),
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # "from privaudit import experiment" imports the submodule privaudit.experiment
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t.startswith("privaudit") and t != name and t != "privaudit":
                out.add(t)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, set(modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_sees_the_imports():
    g = import_graph()
    assert "privaudit.runner" in g["privaudit.experiment"] and "privaudit.runner" in g["privaudit.audit"]
    assert "privaudit.results" in g["privaudit.reports.render"]


def test_no_import_cycle():
    g = import_graph()
    pruned = {v: {w for w in ws if (v, w) not in KNOWN_EXCEPTIONS} for v, ws in g.items()}
    assert _cycles(pruned) == []


def test_cycle_detection_works():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layers_import_in_one_direction():
    g = import_graph()
    upper = {"privaudit.cli", "privaudit.cli_audit", "privaudit._cli_common", "privaudit.experiment", "privaudit.audit"}
    upper |= {"privaudit.plan"}
    reports = {m for m in g if m.startswith("privaudit.reports")}
    # runner: below experiment/audit/plan, never the reports
    assert not g["privaudit.runner"] & (upper | reports)
    # plan: resolves names, never runs experiments or renders
    assert not g["privaudit.plan"] & ({"privaudit.cli", "privaudit.experiment", "privaudit.audit"} | reports)
    # reports read results dicts only
    for m in reports:
        assert (
            g[m]
            <= {
                "privaudit.results",
                "privaudit.metrics",
                "privaudit.errors",
                "privaudit._safejson",
                "privaudit._escape",
                "privaudit.report_schema",  # the writers stamp schema_version (a leaf: _safejson, errors)
            }
            | reports
        ), m
    # results (a package) is a leaf (metrics is one too)
    results = {m for m in g if m.split(".")[:2] == ["privaudit", "results"]}
    assert all(g[m] <= results | {"privaudit.metrics"} for m in results)
    assert g["privaudit.metrics"] <= {"privaudit.attack_metrics", "privaudit._metric_inputs"}
    assert g["privaudit.attack_metrics"] <= {"privaudit._metric_inputs"} and g["privaudit._metric_inputs"] == set()
    # protocols, attacks, defenses, transcript, data, models never import the experiment layer
    lower = [
        m
        for m in g
        if m.count(".") and m.split(".")[1] in ("protocols", "attacks", "defenses", "transcript", "data", "models")
    ]
    for m in lower:
        assert not g[m] & (upper | reports | {"privaudit.runner"}), m


def test_layers_point_one_way():
    """Defenses never import protocols or attacks; protocols never import attacks."""
    graph = import_graph()
    bad = []
    for module, targets in graph.items():
        for below, above in (("defenses", ("protocols", "attacks")), ("protocols", ("attacks",))):
            if module.startswith(f"privaudit.{below}"):
                bad += [(module, t) for t in targets if t.startswith(tuple(f"privaudit.{a}" for a in above))]
    assert bad == [], f"imports against the layering: {bad}"
