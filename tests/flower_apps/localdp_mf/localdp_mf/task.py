"""Data and local training: numpy only.

Each node is one user of a seeded synthetic implicit-rating matrix (users x items, ratings 1..5).
A round fits the user vector by ridge regression on the sent item matrix, runs ``local-steps``
full-batch gradient steps on the rows of the rated items, and returns the whole matrix.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=2)
def ratings_of(users: int, items: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng([seed, 11])
    pop = rng.zipf(1.6, size=items).astype(float)
    pop /= pop.sum()
    out = []
    for _ in range(users):
        n = int(rng.integers(10, 40))
        its = np.sort(rng.choice(items, size=n, replace=False, p=pop))
        out.append((its.astype(np.int64), rng.integers(1, 6, size=n).astype(np.float64)))
    return out


def user_data(cfg, user: int) -> tuple[np.ndarray, np.ndarray]:
    return ratings_of(int(cfg["users"]), int(cfg["items"]), int(cfg["seed"]))[user]


def init_items(cfg) -> np.ndarray:
    return np.random.default_rng([int(cfg["seed"]), 3]).normal(0.0, 0.1, size=(int(cfg["items"]), int(cfg["dim"])))


def local_train(V: np.ndarray, items: np.ndarray, ratings: np.ndarray, cfg) -> np.ndarray:
    lr, lam = float(cfg["lr"]), float(cfg["lam"])
    y = ratings - ratings.mean()
    V = V.copy()
    rows = V[items]
    u = np.linalg.solve(rows.T @ rows + np.eye(rows.shape[1]), rows.T @ y)
    for _ in range(int(cfg["local-steps"])):
        err = y - V[items] @ u
        V[items] += lr * (np.outer(err, u) - lam * V[items])
    return V


def private_data(context) -> dict[str, np.ndarray]:
    items, ratings = user_data(context.run_config, int(context.node_config["partition-id"]))
    return {"items": items, "ratings": ratings}


def public_info(run_config) -> dict:
    return {"n_items": int(run_config["items"]), "rating_min": 1.0, "rating_max": 5.0, "rating_step": 1.0}
