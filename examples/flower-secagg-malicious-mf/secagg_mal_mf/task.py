"""Data and local training of the SecAgg+ GMF-MF reference app (numpy only).

Each node is one user (partition id = user index) holding its train ratings (80 %) of
privaudit's synthetic dataset (the split of ``examples/flower-fedavg-mf``). The model is
matrix factorization with a shared output weight vector ``h`` (GMF with an identity output,
He et al., WWW 2017): r_hat_i = h . (u * v_i). Local training runs ``local-steps`` full-batch
gradient steps on

    L(u, V_S, h) = 1/2 sum_{i in S} (r_i - h.(u * v_i))^2 + lam/2 (||u||^2 + ||V_S||^2)

over the user's train items S; the user vector ``u`` stays on the node.

Why the malicious plan works: with v_i = 0 for every item and h = 0, every gradient of the
uploaded parameters vanishes (d/dv_i = -e_i h*u + lam v_i = 0, d/dh = -sum e_i u*v_i = 0),
for any u and ratings and for every step (only u decays by lam), so a client sent (0, 0)
uploads exactly zero deltas.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=4)
def load_dataset(data: str, users: int, items: int, seed: int):
    """The ratings dataset of a run (cached per process: every node of a worker shares it)."""
    if data == "synthetic":
        from privaudit.data.synthetic import synthetic

        return synthetic(n_users=users, n_items=items, seed=seed)
    from privaudit.data import load_dataset

    return load_dataset(data)


def dataset_of(run_config) -> object:
    """The dataset named by a run config (keys ``data``, ``data-users``, ``data-items``, ``seed``)."""
    return load_dataset(
        str(run_config["data"]), int(run_config["data-users"]), int(run_config["data-items"]), int(run_config["seed"])
    )


def user_split(dataset, user: int, seed: int, test_fraction: float = 0.2):
    """Train and test (items, ratings) of ``user``: a seeded split of its ratings."""
    items, ratings = dataset.user_items(user)
    rng = np.random.default_rng([seed, 1, user])
    test = rng.random(items.size) < test_fraction
    if test.all():
        test[0] = False
    return (items[~test], ratings[~test]), (items[test], ratings[test])


def init_user(seed: int, user: int, dim: int) -> np.ndarray:
    """Initial user vector, shape (dim,): N(0, 0.1^2) from a per-user seeded generator."""
    return np.random.default_rng([seed, 2, user]).normal(0.0, 0.1, size=dim)


def init_items(seed: int, n_items: int, dim: int) -> np.ndarray:
    """Initial item embeddings, shape (n_items, dim): N(0, 0.1^2) from the run seed."""
    return np.random.default_rng([seed, 3]).normal(0.0, 0.1, size=(n_items, dim))


def local_train(u, V, h, items, r, lr: float, lam: float, steps: int):
    """``steps`` full-batch gradient steps; returns (u, V, h) updated (V: all n_items rows,
    only ``items`` change). u (K,), V (n_items, K), h (K,), items (n,), r (n,)."""
    u, V, h = u.copy(), V.copy(), h.copy()
    for _ in range(steps):
        rows = V[items]
        e = r - rows @ (h * u)
        grad_u = -(rows.T @ e) * h + lam * u
        grad_rows = -np.outer(e, h * u) + lam * rows
        grad_h = -(rows.T @ e) * u
        u, h = u - lr * grad_u, h - lr * grad_h
        V[items] = rows - lr * grad_rows
    return u, V, h


def init_h(dim: int) -> np.ndarray:
    """Initial output weights, shape (dim,): ones (plain MF at the start)."""
    return np.ones(dim)


def private_data(context) -> dict[str, np.ndarray]:
    """Ground truth of one node for privaudit's recorder: its train items, ratings, attributes."""
    dataset = dataset_of(context.run_config)
    user = int(context.node_config["partition-id"])
    (items, ratings), _ = user_split(dataset, user, int(context.run_config["seed"]))
    return {
        "items": items.astype(np.int64),
        "ratings": ratings.astype(np.float64),
        "attributes": np.asarray(dataset.user_attributes[user], dtype=np.float64),
    }


def public_info(run_config) -> dict:
    """Facts every party knows (recorded in the transcript's public config)."""
    dataset = dataset_of(run_config)
    return {
        "n_items": int(dataset.n_items),
        "attribute_names": list(dataset.attribute_names),
        "rating_min": float(dataset.rating_min),
        "rating_max": float(dataset.rating_max),
        "rating_step": float(dataset.rating_step),
    }
