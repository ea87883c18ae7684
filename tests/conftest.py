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
