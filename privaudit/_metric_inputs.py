"""Input checks shared by :mod:`privaudit.metrics` and :mod:`privaudit.attack_metrics`:
dense arrays or lists of per-user arrays, flattened and paired."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp


def _is_ragged_sequence(x: Any) -> bool:
    """True for a list/tuple of per-user arrays (anything with ndim >= 1 inside)."""
    return isinstance(x, (list, tuple)) and len(x) > 0 and any(np.ndim(e) >= 1 for e in x)


def flat_values(x: Any, name: str, dtype: Any = float) -> tuple[np.ndarray, list[int] | None]:
    """Flatten an array or a list of per-user arrays; also return the per-part sizes."""
    if sp.issparse(x):
        raise ValueError(f"{name} must be a dense array or a list of arrays, not a sparse matrix")
    if _is_ragged_sequence(x):
        parts = [np.asarray(e, dtype=dtype).ravel() for e in x]
        return np.concatenate(parts), [p.size for p in parts]
    return np.asarray(x, dtype=dtype).ravel(), None


def paired_values(a: Any, b: Any, name_a: str, name_b: str) -> tuple[np.ndarray, np.ndarray]:
    """Two equally shaped inputs (arrays, or lists of per-user arrays) as flat float arrays."""
    if _is_ragged_sequence(a) or _is_ragged_sequence(b):
        fa, sa = flat_values(a, name_a)
        fb, sb = flat_values(b, name_b)
        if sa is not None and sb is not None and sa != sb:
            raise ValueError(f"{name_a} and {name_b} have different per-user lengths")
        if fa.size != fb.size:
            raise ValueError(f"{name_a} has {fa.size} values but {name_b} has {fb.size}")
    else:
        aa = np.asarray(a, dtype=float)
        ab = np.asarray(b, dtype=float)
        if aa.shape != ab.shape:
            raise ValueError(f"{name_a} has shape {aa.shape} but {name_b} has shape {ab.shape}")
        fa, fb = aa.ravel(), ab.ravel()
    if fa.size == 0:
        raise ValueError(f"{name_a} and {name_b} are empty")
    return fa, fb


def scipy_stats():
    """``scipy.stats``, imported on first use (importing it slows every command's start)."""
    from scipy import stats

    return stats
