"""Scoring with a trained NCF model (logits of candidate items) and the uniform negative
sampling used for training and for evaluation candidates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from privaudit.models.ncf.network import forward, require_torch


def score(
    arch: str,
    D: int,
    layers: Sequence[int],
    net: dict[str, np.ndarray],
    users: np.ndarray,
    items: np.ndarray,
    candidates: np.ndarray,
) -> np.ndarray:
    """Logits (n, k) of user rows ``users`` (n, Dtot) for item ids ``candidates`` (n, k) of ``items``."""
    torch = require_torch()
    n_layers = len(layers) if arch in ("mlp", "neumf") else 0
    with torch.no_grad():
        p_net = {k: torch.as_tensor(np.asarray(v, dtype=np.float32)) for k, v in net.items()}
        U = torch.as_tensor(np.asarray(users, dtype=np.float32))
        Itab = torch.as_tensor(np.asarray(items, dtype=np.float32))
        cand = torch.as_tensor(np.asarray(candidates, dtype=np.int64))
        out = forward(arch, D, n_layers, p_net, U[:, None, :], Itab[cand])
    return out.numpy()


def sample_negatives(users: np.ndarray, exclude: Any, n_items: int, rng: np.random.Generator) -> np.ndarray:
    """One uniformly random item per entry of ``users`` not in that user's row of ``exclude``
    (CSR, sorted indices), by vectorised rejection sampling."""
    users = np.asarray(users, dtype=np.int64)
    out = rng.integers(n_items, size=len(users))
    indptr, indices = exclude.indptr, exclude.indices
    row_keys = np.repeat(np.arange(exclude.shape[0], dtype=np.int64), np.diff(indptr)) * n_items + indices
    row_keys.sort()
    todo = np.arange(len(users))
    while todo.size:
        keys = users[todo] * n_items + out[todo]
        pos = np.searchsorted(row_keys, keys)
        hit = (
            (pos < row_keys.size) & (row_keys[np.minimum(pos, row_keys.size - 1)] == keys)
            if row_keys.size
            else np.zeros(len(keys), dtype=bool)
        )
        todo = todo[hit]
        out[todo] = rng.integers(n_items, size=todo.size)
    return out
