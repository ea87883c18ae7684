"""Typed results (privaudit.results.typed, privaudit.api): the records round-trip the wire dicts
losslessly (order, absent keys, unknown keys), the API returns Results / AuditResults that still
index as dicts, write the folders the CLI writes, and render escaped HTML in a notebook.

Every results.json and audit.json any test writes is also round-tripped by the autouse fixture
of tests/conftest.py (every protocol the suite runs)."""

from __future__ import annotations

import json

import pytest

import privaudit
from privaudit import registry
from privaudit.api import AuditResults, Results
from privaudit.cli import main
from privaudit.errors import PrivauditError
from privaudit.report_schema import RESULTS_SCHEMA_VERSION
from privaudit.reports.files import dumps_json
from privaudit.results.typed import (
    AuditCell,
    AuditRecord,
    AuditRun,
    ExperimentRun,
    MetricTest,
    Point,
    Verdict,
    VerdictRow,
)
from tests.dummies import DummyAttack, write_csv

HOSTILE = '<img src=x onerror="alert(1)">&'


def _no_timings(obj):
    if isinstance(obj, dict):
        return {k: _no_timings(v) for k, v in obj.items() if not (k == "seconds" or str(k).endswith("_seconds"))}
    if isinstance(obj, list):
        return [_no_timings(v) for v in obj]
    return obj


def _classes(obj, path="results"):
    """Paths in ``obj`` holding a class (none may: results carry names)."""
    if isinstance(obj, type):
        return [path]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _classes(v, f"{path}.{k}")]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _classes(v, f"{path}[{i}]")]
    return []


@pytest.fixture(scope="module")
def dummies():
    """The dummy protocol, attacks and defenses, registered for this module's tests."""
    from tests.dummies import DUMMIES, register_dummies

    register_dummies()
    try:
        yield DUMMIES
    finally:
        for kind, name in DUMMIES:
            registry.unregister(kind, name)


@pytest.fixture(scope="module")
def sweep(dummies):
    """A defense sweep of the dummy protocol with reference runs (no scale-0 value), 2 seeds."""
    exp = privaudit.build_experiment(
        protocol="dummy-proto", sweep="dummy-noise.scale=0.5,2", seeds=2, jobs=1, progress=False
    )
    return exp, exp.run()


def test_a_sweep_round_trips_through_the_records(sweep):
    _, results = sweep
    assert isinstance(results, Results) and isinstance(results, dict) and results.plan_toml
    assert _classes(dict(results)) == []  # no class objects (the attack is named, looked up in the registry)
    record = ExperimentRun.from_dict(results)
    again = record.to_dict()
    assert dumps_json(again) == dumps_json(results) and list(again) == list(results)  # values, NaN, key order
    assert results.to_json() == dumps_json({"schema_version": RESULTS_SCHEMA_VERSION, **results})
    # typed all the way down
    assert len(record.points) == 4 and all(isinstance(p, Point) for p in record.points)
    assert [p.reference for p in record.reference] == [True, True] and record.points[0].reference is None
    verdict = record.verdicts[0]
    assert isinstance(verdict, Verdict) and isinstance(verdict.rows[0], VerdictRow)
    assert isinstance(verdict.reference_row, VerdictRow)
    test = verdict.rows[0].tests["accuracy"]
    assert isinstance(test, MetricTest) and test.metric == "accuracy" and 0 <= test.p <= 1
    assert test.low <= test.advantage <= test.high
    assert [p.value for p in record.points] == [0.5, 0.5, 2.0, 2.0] and record.sweep == "dummy-noise.scale"
    # the attribute and the key agree; a record reads as a mapping of its wire keys
    assert results.verdicts[0].sentence == results["verdicts"][0]["sentence"] == verdict["sentence"]
    assert verdict["rows"][0]["tests"]["accuracy"]["p"] == test.p and "reference_row" in verdict
    assert results.protocol == "dummy-proto" and results.attack == "dummy-attack" and results.seeds == [0, 1]
    with pytest.raises(AttributeError):
        results.no_such_field  # noqa: B018
    # the renderers take any Mapping: they read the records as they read the dicts
    from privaudit.reports import render

    assert render.verdict_lines(verdict) == render.verdict_lines(results["verdicts"][0])
    assert render.format_table(record) == render.format_table(results)


def test_unknown_keys_survive_in_place_and_absent_keys_stay_absent(sweep):
    _, results = sweep
    doc = json.loads(results.to_json())
    doc["verdicts"][0]["rows"][0]["tests"]["accuracy"]["new_stat"] = [1, 2]
    doc["points"][0] = {"future": {"x": 1}, **doc["points"][0], "z_last": None}
    doc["utility_interval"] = {"low": 0.1, "high": 0.2}  # a field another branch adds
    del doc["points"][1]["supported"]
    record = ExperimentRun.from_dict(doc)
    assert record.points[0].extra == {"future": {"x": 1}, "z_last": None}
    assert record.extra["utility_interval"] == {"low": 0.1, "high": 0.2}
    assert record.verdicts[0].rows[0].tests["accuracy"].extra == {"new_stat": [1, 2]}
    assert record.points[1].supported is None and "supported" not in record.points[1]
    assert json.dumps(record.to_dict()) == json.dumps(doc)  # same keys, same order
    assert list(record.to_dict()["points"][0])[0] == "future"
    # snapshots: the record is a copy of the dict, its dicts are copies again
    record.points[0].attack_metrics["accuracy"] = -1.0
    assert doc["points"][0]["attack_metrics"]["accuracy"] != -1.0
    with pytest.raises(TypeError, match="needs a mapping, got list"):
        Point.from_dict([1, 2])


def test_a_record_built_in_code_writes_its_set_and_required_fields():
    cell = AuditCell(attack="a", defense=None, value=None, metric="m", verdict="leaks", advantage=0.2)
    assert cell.to_dict() == {
        "attack": "a",
        "defense": None,
        "value": None,
        "metric": "m",
        "verdict": "leaks",
        "advantage": 0.2,
        "dp_violation": None,
    }
    import dataclasses

    changed = dataclasses.replace(Point.from_dict({"value": 1, "seed": 0}), reason="no uploads")
    assert changed.to_dict() == {"value": 1, "seed": 0, "reason": "no uploads"}


def test_repr_html_escapes_a_hostile_attack_name(dummies):
    hostile = type("Hostile", (DummyAttack,), {})
    registry.register_attack(HOSTILE)(hostile)
    try:
        exp = privaudit.build_experiment(protocol="dummy-proto", attack=HOSTILE, seeds=1, jobs=1, progress=False)
        results = exp.run()
    finally:
        registry.unregister("attack", HOSTILE)
    assert results["attack"] == HOSTILE and HOSTILE in results.verdicts[0].sentence
    page = results._repr_html_()
    assert "<img" not in page and 'onerror="' not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;" in page
    assert "Verdict." in page and "<table>" in page and "advantage [bounds]" in page
    # the verdict and the decision table of the run (the console's table, as HTML)
    assert results.verdicts[0].plain.split(":")[0].replace("<", "&lt;")[:8] in page


def test_write_report_writes_the_cli_folder(tmp_path, dummies, capsys):
    csv = write_csv(tmp_path / "ratings.csv", 24)
    cli = tmp_path / "cli"
    argv = ["attack", "--protocol", "dummy-proto", "--sweep", "dummy-noise.scale=0,1", "--seeds", "1"]
    assert main([*argv, "--jobs", "1", "--data", csv, "--out", str(cli), "--quiet"]) == 0
    capsys.readouterr()
    # read back from the CLI's results.json: the same folder, byte for byte
    again = Results.read(cli / "results.json")
    again.plan_toml = (cli / "plan.toml").read_text()
    copy = again.write_report(tmp_path / "copy")
    names = sorted(p.name for p in cli.iterdir())
    assert names == sorted(p.name for p in copy.iterdir())
    for name in names:
        assert (cli / name).read_bytes() == (copy / name).read_bytes(), name
    # the in-memory run writes the same files, plan.toml included, results.json equal but for timings
    exp = privaudit.build_experiment(
        protocol="dummy-proto", sweep="dummy-noise.scale=0,1", seeds=1, jobs=1, data=csv, progress=False
    )
    api = exp.run().write_report(tmp_path / "api")
    assert sorted(p.name for p in api.iterdir()) == names
    assert (api / "plan.toml").read_bytes() == (cli / "plan.toml").read_bytes()
    assert _no_timings(json.loads((api / "results.json").read_text())) == _no_timings(
        json.loads((cli / "results.json").read_text())
    )
    with pytest.raises(PrivauditError, match="not empty; pass force=True"):
        again.write_report(copy)  # nothing silently replaced
    with pytest.raises(PrivauditError, match="a results.json, not a audit.json"):
        AuditResults.read(cli / "results.json")


def test_audit_results_are_typed_written_like_the_cli_and_shown_escaped(tmp_path, dummies):
    from privaudit import audit as au
    from privaudit.plan import audit_to_toml

    spec = dict(protocol="dummy-proto", seeds=2, jobs=1, attacks=["dummy-attack"], defenses=["dummy-noise"])
    audit = privaudit.run_audit(privaudit.Audit(progress=False, **spec))
    assert isinstance(audit, AuditResults) and _classes(dict(audit)) == []
    record = audit.record
    assert isinstance(record, AuditRecord) and dumps_json(record.to_dict()) == dumps_json(audit)
    assert all(isinstance(r, AuditRun) for r in audit.runs) and isinstance(audit.runs[0].attacks["dummy-attack"], Point)
    cells = {(c.attack, c.defense): c for c in audit.matrix}
    assert set(cells) == {("dummy-attack", None), ("dummy-attack", "dummy-noise")}
    assert cells[("dummy-attack", None)].verdict == audit["matrix"][0]["verdict"] == "leaks"
    assert audit.attacks[0].metric_specs["accuracy"]["unit"] == "fraction"  # looked up by name
    out = audit.write_report(tmp_path / "api")
    # what `privaudit audit` writes for the same result (cli_audit: write_audit with the plan's TOML)
    cli = au.write_audit(dict(audit), tmp_path / "cli", plan_toml=audit_to_toml(privaudit.Audit(**spec)))
    names = sorted(p.name for p in cli.iterdir())
    assert names == sorted(p.name for p in out.iterdir()) == ["audit.html", "audit.json", "plan.toml"]
    for name in names:
        assert (cli / name).read_bytes() == (out / name).read_bytes(), name
    written = json.loads((out / "audit.json").read_text())
    assert AuditResults.read(out / "audit.json").to_json() == (out / "audit.json").read_text()
    # a hostile attack name in the notebook view: escaped
    page = AuditResults.from_dict({**written, "matrix": [{**written["matrix"][0], "attack": HOSTILE}]})._repr_html_()
    assert "<img" not in page and "&lt;img src=x" in page and "<table>" in page


def test_a_transcript_audit_round_trips_and_shows_its_rows(dummies):
    from privaudit.experiment import run_transcript
    from privaudit.integrations import recorded

    doc = recorded.audit_transcript(run_transcript(protocol="dummy-proto", seed=0).transcript)
    record = AuditRecord.from_dict(doc)
    assert dumps_json(record.to_dict()) == dumps_json(doc) and list(record.to_dict()) == list(doc)
    rows = {r.attack: r for r in record.rows}
    assert rows["dummy-attack"].verdict == "leaks" and rows["dummy-needs-attack"].applies is False
    assert isinstance(rows["dummy-attack"].tests["accuracy"], MetricTest)
    assert record.extra.keys() == {"canaries"}  # a key the record does not declare, kept
    audit = AuditResults(doc)
    assert "dummy-attack: leaks" in audit._repr_html_()
    with pytest.raises(PrivauditError, match="recorded.write_audit"):
        audit.write_report("unused")
