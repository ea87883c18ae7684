"""Shared test fixtures: the MovieLens 100K folder (tests only) and small helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

ML100K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ml-100k"


@pytest.fixture(scope="session")
def ml100k_path() -> Path:
    """Path of the original MovieLens 100K files; skips when they are absent."""
    if not (ML100K / "u.data").exists():
        pytest.skip(f"MovieLens 100K not found at {ML100K} (tests only; never needed at run time)")
    return ML100K
