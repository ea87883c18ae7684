"""Architecture checks: no import circle between privaudit's modules."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

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
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
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


def test_no_import_circle():
    found = cycles(import_graph())
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


# ------------------------------------------------------------------------------- seams


def test_defense_capabilities_are_declared_or_derived_from_hooks():
    from privaudit import registry
    from privaudit.defenses.base import AGGREGATION, CLIENT_DATA, LOCAL_TRAINING, UPLOAD, Defense

    caps = {name: cls.capabilities for name, cls in registry.available("defense").items()}
    assert caps["sampling"] == {CLIENT_DATA}
    assert caps["dp-sgd"] == {LOCAL_TRAINING}
    assert caps["paillier"] == caps["secagg"] == {UPLOAD, AGGREGATION}
    assert caps["laplace"] == {UPLOAD}

    class Echo(Defense):
        def on_download(self, payload, channel):
            return payload

    assert Echo.capabilities == {"download"}
    try:
        type("Bad", (Defense,), {"capabilities": frozenset({"teleport"})})
    except TypeError as exc:
        assert "unknown capabilities ['teleport']" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("an unknown capability must be refused")


def test_protocols_ask_defenses_by_capability():
    from privaudit import registry
    from privaudit.protocols.fedrec import HF_DEFAULTS, hf_settings
    from privaudit.protocols.privmvmf import privmvmf_defenses

    sampling, paillier, laplace = (registry.get("defense", n) for n in ("sampling", "paillier", "laplace"))
    # FedRec reads the clients' filling rule from the client-data defense, defaults filled in
    assert hf_settings([laplace(scale=0.1)]) == (None, 0, 0)
    assert hf_settings([sampling(filling="hf", t_local=3)]) == ("hf", HF_DEFAULTS["t_predict"], 3)
    # DP-SGD's clients' optimizer
    lt = registry.get("defense", "dp-sgd")(noise_multiplier=0.7, max_grad_norm=2.0).local_training()
    assert (lt.noise_multiplier, lt.clip) == (0.7, 2.0)
    # PrivMVMF: default sampling (with the protocol's w) first, encryption last, given order kept
    key = paillier(key_length=512, insecure_test_key=True)
    out = privmvmf_defenses([key, laplace(scale=0.1)], w=0.3)
    assert [d.name for d in out] == ["sampling", "laplace", "paillier"] and out[-1] is key
    assert out[0].weight == 0.3
    own = sampling(rho=2.0)
    out = privmvmf_defenses([own], w=0.3)
    assert [d.name for d in out] == ["sampling", "paillier"] and out[0].config["w"] == 0.3 and own.config["w"] is None


def test_run_template_opens_transcript_with_private_messages_and_channel(dummy_registry):
    from tests.dummies import DummyProtocol, tiny_dataset

    result = DummyProtocol().run(
        tiny_dataset(6), {"p": "3"}, [dummy_registry[("defense", "dummy-noise")](scale=0.0)], 5
    )
    t = result.transcript
    assert t.seed == 5 and t.config["p"] == 3 and t.config["defenses"] == [{"name": "dummy-noise", "scale": 0.0}]
    assert [m.sender for m in t.select("private")] == [f"client:{u}" for u in range(6)]
    np.testing.assert_array_equal(t.private("client:2")["bits"], result.model[2])
    again = DummyProtocol().run(tiny_dataset(6), {"p": 3}, [], 5)
    np.testing.assert_array_equal(again.model, result.model)  # same seed, same run
