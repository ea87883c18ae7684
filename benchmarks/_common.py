"""Helpers shared by the benchmark scripts: where MovieLens 100K is.

The same rule as the tests (tests/conftest.py): the folder named by the environment variable
``PRIVAUDIT_ML100K``, else ``../shared/data/ml-100k`` beside the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

ML100K_ENV = "PRIVAUDIT_ML100K"
REPO = Path(__file__).resolve().parents[1]


def ml100k_dir() -> Path:
    """The MovieLens 100K folder (it may not exist: callers check or fall back to synthetic data)."""
    env = os.environ.get(ML100K_ENV)
    return Path(env).expanduser() if env else REPO.parent / "shared" / "data" / "ml-100k"
