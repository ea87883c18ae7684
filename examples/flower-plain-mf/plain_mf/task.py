"""Data and local training of the plain FedAvg MF app (numpy only, no Flower import).

Each Flower node is one user (partition id = user index) holding the ratings of privaudit's
synthetic dataset or of a dataset privaudit loads by name (``data = "ml-100k"``), split 80/20
into train and test items with a seeded generator. Each round the client receives the whole
item matrix V (n_items x dim), fits its user vector by ridge regression on its train items

    u = argmin_u sum_{i in S} (r_i - mu - u.v_i)^2 + ridge ||u||^2      (mu: public global mean)

keeps u on the device, and runs ``local-epochs`` epochs of minibatch SGD on the rows of its
rated items with u fixed, loss 1/2 (r_i - mu - u.v_i)^2 + lam/2 ||v_i||^2 per rating; it
returns the whole matrix (untrained rows unchanged).
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


def init_items(seed: int, n_items: int, dim: int) -> np.ndarray:
    """Initial item matrix, shape (n_items, dim): N(0, 0.1^2) from the run seed."""
    return np.random.default_rng([seed, 3]).normal(0.0, 0.1, size=(n_items, dim))


def ridge_user(rows: np.ndarray, y: np.ndarray, ridge: float) -> np.ndarray:
    """argmin_u ||y - rows u||^2 + ridge ||u||^2, shape (dim,)."""
    k = rows.shape[1]
    return np.linalg.solve(rows.T @ rows + ridge * np.eye(k), rows.T @ y)


def local_train(V: np.ndarray, items: np.ndarray, ratings: np.ndarray, cfg, rng: np.random.Generator):
    """One round of local training; returns (the whole updated matrix, u, train loss).

    Parameters
    ----------
    V : ndarray of shape (n_items, dim)
        The matrix the server sent (not modified).
    items, ratings : ndarray of shape (n,)
        The user's train items (distinct ids) and ratings.
    cfg : mapping
        Run config: ``lr``, ``lam``, ``ridge``, ``local-epochs``, ``batch-size``, ``global-mean``.
    """
    lr, lam = float(cfg["lr"]), float(cfg["lam"])
    y = ratings - float(cfg["global-mean"])
    V = V.copy()
    u = ridge_user(V[items], y, float(cfg["ridge"]))
    batch = max(int(cfg["batch-size"]), 1)
    for _ in range(int(cfg["local-epochs"])):
        order = rng.permutation(items.size)
        for start in range(0, items.size, batch):
            b = items[order[start : start + batch]]
            err = y[order[start : start + batch]] - V[b] @ u
            V[b] -= lr * (-np.outer(err, u) + lam * V[b])
    loss = float(np.mean((y - V[items] @ u) ** 2))
    return V, u, loss


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
    """Facts every party knows: the item count and rating scale, and the training recipe the
    app publishes (learning rate, L2 weight, local epochs, the global mean it centres by)."""
    dataset = dataset_of(run_config)
    return {
        "n_items": int(dataset.n_items),
        "attribute_names": list(dataset.attribute_names),
        "rating_min": float(dataset.rating_min),
        "rating_max": float(dataset.rating_max),
        "rating_step": float(dataset.rating_step),
        "lr": float(run_config["lr"]),
        "lam": float(run_config["lam"]),
        "local_steps": int(run_config["local-epochs"]),
        "global_mean": float(run_config["global-mean"]),
    }
