"""Shared test fixtures: the MovieLens 100K folder (tests and benchmarks only) and the dummies.

MovieLens 100K is not shipped (license). Tests that need it take the ``ml100k_path`` fixture:
the folder named by the environment variable ``PRIVAUDIT_ML100K``, else ``../shared/data/ml-100k``
beside the repository; without it they skip, naming the variable.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: the stand-in protocol, attacks and defenses (fixture ``dummy_registry``) for every test module
pytest_plugins = ["tests.dummies"]

ML100K_ENV = "PRIVAUDIT_ML100K"
REPO = Path(__file__).resolve().parents[1]


def ml100k_dir() -> Path:
    """The MovieLens 100K folder: ``$PRIVAUDIT_ML100K``, else ``../shared/data/ml-100k`` beside the repository."""
    env = os.environ.get(ML100K_ENV)
    return Path(env).expanduser() if env else REPO.parent / "shared" / "data" / "ml-100k"


@pytest.fixture(scope="session")
def ml100k_path() -> Path:
    """Path of the original MovieLens 100K files; skips when they are absent."""
    path = ml100k_dir()
    if not (path / "u.data").is_file():
        pytest.skip(f"MovieLens 100K not found at {path}: set {ML100K_ENV} to the ml-100k folder (tests only)")
    return path


@pytest.fixture
def no_compute(monkeypatch):
    """Fail the test if a protocol run or an experiment's points start."""

    def boom(*a, **k):
        raise AssertionError("compute started before the mistake was reported")

    from privaudit import audit, experiment, runner

    for module in (experiment, audit, runner):  # the runner's names, wherever they were imported
        for name in ("parallel_map", "run_protocol"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, boom)


#: file name -> schema kind of what privaudit's writers stage (privaudit.report_schema)
_SCHEMA_KINDS = {"audit.json": "audit", "results.json": "results"}


@pytest.fixture(autouse=True)
def _written_reports_validate(monkeypatch):
    """Every ``audit.json`` and ``results.json`` a test writes in this process (privaudit's
    writers all commit through ``Staged``) validates against its versioned schema
    (``privaudit/schemas``): checked as it is written (a test may corrupt it afterwards on
    purpose), reported when the test ends with the file and the first error. Each also reads
    back through the typed records (:mod:`privaudit.results.typed`) to the same JSON text."""
    import json

    from privaudit import report_schema
    from privaudit.reports import files
    from privaudit.results.typed import AuditRecord, ExperimentRun

    records = {"audit": AuditRecord, "results": ExperimentRun}

    problems = []
    commit = files.Staged.commit

    def validating_commit(self):
        finals = commit(self)
        for path in finals:
            if path.name in _SCHEMA_KINDS:
                kind = _SCHEMA_KINDS[path.name]
                doc = json.loads(path.read_text(encoding="utf-8"))
                found = report_schema.problem(doc, kind)
                if found is not None:
                    problems.append(f"{path} does not validate against the {kind} schema: {found}")
                elif json.dumps(records[kind].from_dict(doc).to_dict()) != json.dumps(doc):  # keys in order
                    problems.append(f"{path} does not round-trip through {records[kind].__name__}")
        return finals

    monkeypatch.setattr(files.Staged, "commit", validating_commit)
    yield problems
    assert not problems, problems[0]
