"""Data and local training: numpy only.

GMF: score(u, i) = h . (p_u * q_i) + b_i. Each node is one user of a seeded synthetic
implicit-feedback matrix; its positives are the items it interacted with. Every local epoch
draws ``num-negatives`` fresh non-interacted items per positive and runs one SGD pass of binary
cross-entropy over positives and negatives, updating the user vector p_u (kept on the node,
re-initialised from the seed each round), the item rows q_i, the item biases b_i and h. The
client returns the whole item table, the biases and h.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=2)
def positives_of(users: int, items: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, 5])
    pop = 1.0 / np.arange(1, items + 1) ** 0.8
    pop /= pop.sum()
    return [np.sort(rng.choice(items, size=int(rng.integers(8, 25)), replace=False, p=pop)) for _ in range(users)]


def positives(cfg, user: int) -> np.ndarray:
    return positives_of(int(cfg["users"]), int(cfg["items"]), int(cfg["seed"]))[user]


def init_model(cfg) -> list[np.ndarray]:
    rng = np.random.default_rng([int(cfg["seed"]), 3])
    n, k = int(cfg["items"]), int(cfg["dim"])
    return [rng.normal(0.0, 0.1, size=(n, k)), np.zeros(n), np.ones(k)]


def local_train(model: list[np.ndarray], pos: np.ndarray, cfg, rng: np.random.Generator) -> list[np.ndarray]:
    Q, b, h = (a.copy() for a in model)
    lr = float(cfg["learning-rate"])
    p = rng.normal(0.0, 0.1, size=Q.shape[1])
    unrated = np.setdiff1d(np.arange(Q.shape[0]), pos)
    for _ in range(int(cfg["local-epochs"])):
        neg = rng.choice(unrated, size=int(cfg["num-negatives"]) * pos.size)
        items = np.concatenate([pos, neg])
        labels = np.concatenate([np.ones(pos.size), np.zeros(neg.size)])
        for j in rng.permutation(items.size):
            i, y = items[j], labels[j]
            s = h @ (p * Q[i]) + b[i]
            g = 1.0 / (1.0 + np.exp(-s)) - y  # d BCE / d score
            gp, gq, gh = g * h * Q[i], g * h * p, g * p * Q[i]
            p -= lr * gp
            Q[i] -= lr * gq
            h -= lr * gh
            b[i] -= lr * g
    return [Q, b, h]


def private_data(context) -> dict[str, np.ndarray]:
    return {"items": positives(context.run_config, int(context.node_config["partition-id"])).astype(np.int64)}


def public_info(run_config) -> dict:
    return {"n_items": int(run_config["items"])}
