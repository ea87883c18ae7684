"""MovieLens 100K and local training: numpy only.

Node k is the k-th user of ``u.data`` (80 % of its ratings for training, seeded). A round fits
the user vector by ridge regression on the sent item matrix (ratings centred by the run
config's ``mean``), runs ``local-steps`` full-batch gradient steps on the rows of its rated
items with the user vector fixed, and returns the whole matrix.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

N_ITEMS = 1682


@lru_cache(maxsize=1)
def ratings_table(folder: str) -> np.ndarray:
    return np.loadtxt(Path(folder) / "u.data", dtype=np.int64)


def train_split(cfg, user: int) -> tuple[np.ndarray, np.ndarray]:
    table = ratings_table(str(cfg["data"]))
    uid = np.unique(table[:, 0])[user]
    rows = table[table[:, 0] == uid]
    keep = np.random.default_rng([int(cfg["seed"]), 1, user]).random(rows.shape[0]) >= 0.2
    order = np.argsort(rows[keep, 1])
    return (rows[keep, 1] - 1)[order], rows[keep, 2][order].astype(np.float64)


def init_items(cfg) -> np.ndarray:
    return np.random.default_rng([int(cfg["seed"]), 3]).normal(0.0, 0.1, size=(N_ITEMS, int(cfg["dim"])))


def local_train(V: np.ndarray, items: np.ndarray, ratings: np.ndarray, cfg) -> np.ndarray:
    lr, lam = float(cfg["lr"]), float(cfg["lam"])
    y = ratings - float(cfg["mean"])
    V = V.copy()
    rows = V[items]
    u = np.linalg.solve(rows.T @ rows + float(cfg["ridge"]) * np.eye(rows.shape[1]), rows.T @ y)
    for _ in range(int(cfg["local-steps"])):
        err = y - V[items] @ u
        V[items] += lr * (np.outer(err, u) - lam * V[items])
    return V


def private_data(context) -> dict[str, np.ndarray]:
    items, ratings = train_split(context.run_config, int(context.node_config["partition-id"]))
    return {"items": items.astype(np.int64), "ratings": ratings}


def public_info(run_config) -> dict:
    return {"n_items": N_ITEMS, "rating_min": 1.0, "rating_max": 5.0, "rating_step": 1.0}
