"""The audit's threat axis: malicious attacks run on protocol runs with their plan set, each cell
and verdict names its threat model, ``--threat`` selects them (dummy protocol; fast)."""

from __future__ import annotations

import ast
import inspect
import json
import re

import numpy as np
import pytest

from privaudit import audit as au
from privaudit import registry
from privaudit.attacks.base import Reconstruction
from privaudit.cli import main
from privaudit.errors import PrivauditError
from privaudit.params import Param
from privaudit.reports import audit as report
from privaudit.results import MetricSpec
from tests.dummies import DummyAttack, DummyProtocol, tiny_dataset
from tests.test_audit import strip_timings


class PeekProtocol(DummyProtocol):
    """The dummy protocol with a malicious server plan: ``server=peek`` lets the target's
    (client:0's) uploads through every defense (as a crafted model would make them readable)."""

    parameters = DummyProtocol.parameters + (
        Param(
            "server", "honest", "honest or peek (client:0's uploads bypass the defenses)", choices=("honest", "peek")
        ),
    )

    def simulate(self, setup):
        if setup.config["server"] == "honest":
            return super().simulate(setup)
        result = super().simulate(setup)
        clear = {"values": 2 * result.model[0] - 1.0}  # the target's upload as it was before the defenses
        for r in range(setup.config["rounds"]):
            result.transcript.add(r, "client:0", "server", "upload", clear, {"peeked": True})
        return result


class PeekAttack(DummyAttack):
    """Reads the target's peeked uploads (threat malicious)."""

    description = "test attack: reads the peeked target"
    protocols = ("dummy-threat",)
    threat = "malicious"
    plan = {"server": "peek"}
    deviations = ("inconsistent-models",)
    metric_specs = {
        **DummyAttack.metric_specs,
        "rounds_used": MetricSpec(True, False, "count", "deviation rounds read"),
        "sybils": MetricSpec(False, False, "count", "sybils used"),
    }

    def applicable(self, view):
        if view.config.get("server") != "peek":
            return False, "the server followed the protocol"
        return True, ""

    def run(self, view, knowledge, rng):
        (m,) = [m for m in view.select("upload") if m.meta.get("peeked") and m.round == 0]
        values = np.asarray(m.payload["values"])
        return Reconstruction(self.name, self.party, {"client:0": {"bits": (values > 0).astype(float)}})

    def score(self, recon, transcript):
        return {**super().score(recon, transcript), "rounds_used": 1.0, "sybils": 0.0}


class HonestAttack(DummyAttack):
    protocols = ("dummy-threat",)


REG = {
    ("protocol", "dummy-threat"): PeekProtocol,
    ("attack", "dummy-peek"): PeekAttack,
    ("attack", "dummy-sign"): HonestAttack,
}


@pytest.fixture
def threat_registry(dummy_registry):
    for (kind, name), cls in REG.items():
        registry._register(kind, name)(cls)
    try:
        yield
    finally:
        for kind, name in REG:
            registry.unregister(kind, name)


@pytest.fixture
def ds():
    return tiny_dataset(30, n_items=12)


def _audit(ds, threat="both", seeds=2):
    spec = au.Audit("dummy-threat", seeds=seeds, defenses=["dummy-noise"], jobs=1, sets={"p": 16}, threat=threat)
    return au.run_audit(spec, dataset=ds)


def _strip(runs):
    return strip_timings([{k: v for k, v in r.items() if not re.search("seconds|traceback", k)} for r in runs])


def test_malicious_attacks_run_on_their_plan_and_the_honest_runs_are_unchanged(threat_registry, ds):
    both = _audit(ds)
    honest = [r for r in both["runs"] if r["threat"] == "honest-but-curious"]
    malicious = [r for r in both["runs"] if r["threat"] == "malicious"]
    grid = len(registry.get("defense", "dummy-noise").default_grid)
    assert len(honest) == 2 * (1 + grid) and all(set(r["attacks"]) == {"dummy-sign"} for r in honest)
    # undefended and the strongest dummy-noise value, at least 10 seeds (one target per run; the
    # fewest victims a verdict is decided from)
    assert [(r["defense"], r["value"], r["seed"]) for r in malicious] == [(None, None, s) for s in range(10)] + [
        ("dummy-noise", 10.0, s) for s in range(10)
    ]
    assert all(r["plan"] == {"server": "peek"} and set(r["attacks"]) == {"dummy-peek"} for r in malicious)
    hbc = _audit(ds, threat="honest-but-curious")
    assert _strip(hbc["runs"]) == _strip(honest)  # the honest runs do not depend on the threat axis
    only = _audit(ds, threat="malicious")
    assert {r["threat"] for r in only["runs"]} == {"malicious"} and [a["name"] for a in only["attacks"]] == [
        "dummy-peek"
    ]


def test_cells_and_verdicts_name_the_threat_model(threat_registry, ds):
    a = _audit(ds)
    info = {x["name"]: x for x in a["attacks"]}
    assert info["dummy-peek"]["threat"] == "malicious" and info["dummy-peek"]["plan"] == {"server": "peek"}
    assert info["dummy-peek"]["deviation"] == "model inconsistency" and info["dummy-sign"]["threat"] == (
        "honest-but-curious"
    )
    cell = {(c["attack"], c["defense"]): c for c in a["matrix"]}
    assert cell[("dummy-peek", "dummy-noise")]["threat"] == "malicious"
    assert cell[("dummy-peek", "dummy-noise")]["verdict"] == "leaks"
    assert cell[("dummy-peek", "dummy-noise")]["advantage"] == pytest.approx(0.5)  # 1.0 against the prior 0.5
    # Laplace noise of scale 10 on +-1 uploads of 16 bits x 30 clients still leaks the signs
    assert cell[("dummy-sign", "dummy-noise")]["verdict"] == "leaks"
    (none, noise) = a["threat_verdicts"]
    assert noise["sentence"] == (
        "dummy-noise (scale = 10): leaks to an honest-but-curious server (dummy-sign); leaks to a malicious "
        "server (dummy-peek, 1 round of model inconsistency, 0 sybils; Holm over 1 test of 1 attack)."
    )
    assert none["honest-but-curious"] == "leaks to an honest-but-curious server (dummy-sign)"
    # the wording of the other verdicts (a defense that hides the uploads: the attack does not apply)
    for verdict, text in [
        ("not applicable", "protected against an honest-but-curious server (no attack applies under it)"),
        ("protected", "protected against an honest-but-curious server"),
        ("inconclusive", "not shown to leak to an honest-but-curious server (dummy-sign: inconclusive)"),
    ]:
        cell[("dummy-sign", "dummy-noise")]["verdict"] = verdict
        assert au.threat_verdicts(a)[1]["honest-but-curious"] == text
    # an attack the defense stops is named beside the ones that still leak
    sign = next(x for x in a["attacks"] if x["name"] == "dummy-sign")
    a["attacks"].append({**sign, "name": "dummy-sign-2"})
    a["matrix"].append({**cell[("dummy-sign", "dummy-noise")], "attack": "dummy-sign-2", "verdict": "leaks"})
    cell[("dummy-sign", "dummy-noise")]["verdict"] = "not applicable"
    assert au.threat_verdicts(a)[1]["honest-but-curious"] == (
        "leaks to an honest-but-curious server (dummy-sign-2); stopped: dummy-sign (not applicable)"
    )
    peek = next(v for v in a["verdicts"] if v["attack"] == "dummy-peek")
    assert peek["threat"] == "malicious" and peek["sentence"].startswith("Malicious server (server=peek): dummy-peek")
    text = report.format_matrix(a)
    assert (
        "threat: dummy-noise (scale = 10): leaks to an honest-but-curious" in text and "dummy-peek [malicious]" in text
    )


def test_audit_html_renders_the_threat_axis_escaped(threat_registry, ds, tmp_path):
    a = _audit(ds)
    a["threat_verdicts"][0]["malicious"] = "<script>x</script>"
    out = au.write_audit(a, tmp_path / "audit")
    html = (out / "audit.html").read_text()
    assert "Threat models" in html and "&lt;script&gt;x&lt;/script&gt;" in html and "<script>x" not in html
    assert "leaks to a malicious server (dummy-peek, 1 round of model inconsistency, 0 sybils; Holm" in html
    assert "malicious server (server=peek; model inconsistency)" in html
    data = json.loads((out / "audit.json").read_text())
    assert {c["threat"] for c in data["matrix"]} == {"honest-but-curious", "malicious"}
    tree = ast.parse(inspect.getsource(report.render_html))
    (fn,) = tree.body
    assert fn.end_lineno - fn.lineno + 1 <= 80


def test_threat_selection_errors_and_cli(threat_registry, ds, tmp_path, capsys):
    with pytest.raises(PrivauditError, match="threat must be one of"):
        _audit(ds, threat="evil")
    with pytest.raises(PrivauditError, match="no selected malicious attack"):
        au.run_audit(au.Audit("dummy-proto", seeds=2, jobs=1, threat="malicious"), dataset=ds)
    csv = tmp_path / "d.csv"
    csv.write_text("user,item,rating\n" + "".join(f"{u},{i},{1 + (u + i) % 5}\n" for u in range(20) for i in range(6)))
    out = tmp_path / "rep"
    code = main(
        ["audit", "--protocol", "dummy-threat", "--data", str(csv), "--defense", "dummy-noise", "--seeds", "2"]
        + ["--jobs", "1", "--threat", "malicious", "-o", str(out)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "threat: no defense: leaks to a malicious server (dummy-peek, 1 round of model inconsistency" in printed
    assert '"threat" = "malicious"' in (out / "plan.toml").read_text()
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--protocol", "dummy-threat", "--threat", "evil"])
    assert exc.value.code == 2


def test_a_defense_without_grid_is_one_cell_when_named(threat_registry, ds, tmp_path):
    """dummy-encrypt hides every upload from an honest server; the peeking server still reads the target."""
    spec = au.Audit("dummy-threat", seeds=2, defenses=["dummy-encrypt"], jobs=1, sets={"p": 16})
    a = au.run_audit(spec, dataset=ds)
    assert a["defenses"][0]["strength"] is None and a["defenses"][0]["grid"] == [None]
    honest = [r for r in a["runs"] if r["defense"] == "dummy-encrypt" and r["threat"] == "honest-but-curious"]
    assert len(honest) == 2 and all(r["attacks"]["dummy-sign"]["supported"] is False for r in honest)
    assert a["threat_verdicts"][1]["sentence"] == (
        "dummy-encrypt: protected against an honest-but-curious server (no attack applies under it); leaks to a "
        "malicious server (dummy-peek, 1 round of model inconsistency, 0 sybils; Holm over 1 test of 1 attack)."
    )
    out = au.write_audit(a, tmp_path / "audit")
    assert "dummy-encrypt.None" not in (out / "audit.html").read_text()
    assert "dummy-encrypt.None" not in report.format_matrix(a)
    # unnamed, it is skipped as before
    assert dict(au.applicable_defenses("dummy-threat")[1])["dummy-encrypt"] == "no strength grid to sweep"


def test_every_deviation_has_the_noun_a_verdict_names_it_by():
    """The audit's nouns (in priority order) and the attacks' deviations are one vocabulary."""
    from privaudit.attacks.ncf.malicious import DEVIATIONS
    from privaudit.audit import DEVIATION_NOUNS

    assert set(DEVIATION_NOUNS) == set(DEVIATIONS)


def _family_audit(tests_by_attack: dict, undefended: dict) -> dict:
    """An audit dict with two malicious attacks and one gridless defense, for the family verdict."""
    attacks = [
        {"name": n, "threat": "malicious", "applies": True, "deviation": "sybil cohorts"} for n in tests_by_attack
    ]
    matrix = [{"attack": n, "defense": "guard", "verdict": "inconclusive"} for n in tests_by_attack]
    return {
        "attacks": attacks,
        "defenses": [{"name": "guard", "strength": None, "grid": [None]}],
        "matrix": matrix,
        "runs": [],
        "_tests": {"guard": tests_by_attack, None: undefended},
    }


def _test(advantage: float, se: float, threshold: float = 0.05) -> dict:
    from statistics import NormalDist

    p = 1 - NormalDist().cdf(advantage / se)
    return {"advantage": advantage, "se": se, "threshold": threshold, "p": p, "n": 50}  # 50 victims


def test_malicious_column_is_protected_only_when_every_adaptive_attack_fails(monkeypatch):
    """Holm over the whole adaptive family: one attack that leaks names the column's craft; all
    under the margin (with the family leaking undefended) reads protected; otherwise not shown."""

    def series(out, attack, defense):
        return [{"tests": {"f1": dict(out["_tests"][defense][attack])}}]

    monkeypatch.setattr(au.rs, "audit_series", series)
    leak = {"a": _test(0.5, 0.05), "b": _test(0.5, 0.05)}
    # b leaks at p ~ 1e-7 alone; a is under the margin: the column names b only
    a = _family_audit({"a": _test(0.0, 0.01), "b": _test(0.3, 0.05)}, leak)
    assert au.threat_verdicts(a)[1]["malicious"] == (
        "leaks to a malicious server (b, ? rounds of sybil cohorts, ? sybils; Holm over 2 tests of 2 attacks)"
    )
    # a p-value of 0.03 rejects alone (0.05) but not at Holm's first level over 2 tests (0.025)
    a = _family_audit({"a": _test(0.0, 0.01), "b": _test(0.0376, 0.02)}, leak)
    assert au.malicious_family(a, "guard", a["attacks"])["leaking"] == []
    assert au.threat_verdicts(a)[1]["malicious"].startswith("not shown to leak to a malicious server")
    a = _family_audit({"a": _test(0.0, 0.01), "b": _test(0.001, 0.01)}, leak)
    assert au.threat_verdicts(a)[1]["malicious"] == (
        "protected against a malicious server (every adaptive attack fails: 2 tests, Holm)"
    )
    # every attack of the family stopped (not applicable): protected, naming the family
    for c in a["matrix"]:
        c["verdict"] = "not applicable"
    assert au.threat_verdicts(a)[1]["malicious"] == (
        "protected against a malicious server (no attack of the family applies under it: a, b)"
    )
    for c in a["matrix"]:
        c["verdict"] = "inconclusive"
    # no control (the family does not leak undefended): not protection
    a = _family_audit({"a": _test(0.0, 0.01), "b": _test(0.001, 0.01)}, {"a": _test(0.0, 0.01), "b": _test(0, 1)})
    assert au.threat_verdicts(a)[1]["malicious"].startswith("not shown to leak")


def test_deviation_rounds_are_swept_up_to_the_protocols_rounds():
    from privaudit.protocols.fedncf import FedNCF

    assert au.round_grid(50) == [1, 4, 16, 50] and au.round_grid(1) == [1] and au.round_grid(4) == [1, 4]
    cfg = FedNCF.resolve_config({})
    assert FedNCF.deviation_budget(cfg, 200) == 50 and FedNCF.deviation_budget(cfg, None) is None
    assert FedNCF.deviation_budget(FedNCF.resolve_config({"max_rounds": 7}), 200) == 7
    # a plan that fixes deviation_rounds (or --set) is kept; otherwise the server deviates in every round
    planned, budget = au._planned_config(FedNCF, {}, {"server": "sybil"}, 200)
    assert budget == 50 and planned["deviation_rounds"] == 50 and planned["record_rounds"] == 51
    planned, budget = au._planned_config(FedNCF, {"deviation_rounds": 3}, {"server": "sybil"}, 200)
    assert budget == 3 and planned["record_rounds"] == 50
