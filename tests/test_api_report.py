"""Python API = CLI: ``privaudit.Sweep`` and the CLI's sweep text are accepted alike, and
``privaudit.write_report(results, folder, experiment=...)`` writes the folder ``privaudit attack``
writes for the same run, file for file (timings apart)."""

from __future__ import annotations

import json

import pytest

import privaudit
from privaudit.cli import main
from privaudit.errors import PrivauditError
from privaudit.report_schema import stamped
from privaudit.reports.files import dumps_json
from tests.dummies import write_csv

TIMINGS = ("seconds", "total_seconds", "epoch_seconds", "iteration_seconds")


def _timed(key) -> bool:
    return key in TIMINGS or str(key).endswith("_seconds")


def _with_timings(obj, source):
    """``obj`` with every timing taken from ``source`` (the same structure otherwise)."""
    if isinstance(obj, dict) and isinstance(source, dict):
        return {k: source[k] if _timed(k) and k in source else _with_timings(v, source.get(k)) for k, v in obj.items()}
    if isinstance(obj, list) and isinstance(source, list) and len(obj) == len(source):
        return [_with_timings(v, w) for v, w in zip(obj, source)]
    return obj


def _no_timings(obj):
    if isinstance(obj, dict):
        return {k: _no_timings(v) for k, v in obj.items() if k not in TIMINGS and not str(k).endswith("_seconds")}
    if isinstance(obj, list):
        return [_no_timings(v) for v in obj]
    return obj


@pytest.mark.usefixtures("dummy_registry")
def test_write_report_writes_the_cli_folder(tmp_path, capsys):
    csv = write_csv(tmp_path / "ratings.csv", 24)
    cli = tmp_path / "cli"
    argv = ["attack", "--protocol", "dummy-proto", "--sweep", "dummy-noise.scale=0,1", "--seeds", "2"]
    assert main([*argv, "--jobs", "1", "--data", csv, "--out", str(cli), "--quiet"]) == 0
    capsys.readouterr()
    exp = privaudit.build_experiment(
        protocol="dummy-proto", sweep="dummy-noise.scale=0,1", seeds=2, jobs=1, data=csv, progress=False
    )
    results = exp.run()
    a = json.loads((cli / "results.json").read_text())
    # the same run (NaN written as null), stamped with the schema and privaudit versions when written
    assert _no_timings(a) == _no_timings(json.loads(dumps_json(stamped(results, "results"))))
    # with the CLI run's timings (the per-point seconds are shown in report.html and results.csv)
    api = privaudit.write_report(_with_timings(results, a), tmp_path / "api", experiment=exp)
    names = sorted(p.name for p in cli.iterdir())
    assert names == sorted(p.name for p in api.iterdir())
    assert {"results.json", "results.csv", "report.md", "report.html", "plan.toml"} <= set(names)
    for name in names:  # figures, tables, pages, plan and results byte for byte
        assert (cli / name).read_bytes() == (api / name).read_bytes(), name
    b = json.loads((api / "results.json").read_text())
    with pytest.raises(PrivauditError, match="not empty; pass force=True"):
        privaudit.write_report(b, api)  # nothing silently replaced
    assert privaudit.write_report(b, api, force=True) == api


@pytest.mark.usefixtures("dummy_registry")
def test_sweep_as_object_or_text():
    text = privaudit.build_experiment(protocol="dummy-proto", sweep="dummy-noise.scale=0,1").plan().sweep
    obj = privaudit.build_experiment(protocol="dummy-proto", sweep=privaudit.Sweep("dummy-noise", "scale", (0, 1)))
    assert text == obj.plan().sweep and text.values == (0.0, 1.0)
    with pytest.raises(PrivauditError, match=r"expected TARGET.PARAM=V1,V2"):
        privaudit.build_experiment(protocol="dummy-proto", sweep="scale=0,1")
    with pytest.raises(PrivauditError, match=r"privaudit.Sweep\(target, param, values\) or 'TARGET.PARAM=V1,V2"):
        privaudit.build_experiment(protocol="dummy-proto", sweep=("dummy-noise", "scale"))
