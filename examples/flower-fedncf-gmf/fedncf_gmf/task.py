"""Data and local training of the FedNCF-GMF reference app (PyTorch).

Each node is one user of privaudit's synthetic dataset (or a ``user,item,rating`` CSV named by
the run config key ``data``); its rated items are its positives (implicit feedback). GMF
scores an item as sigmoid(h . (p_u * q_i)) with a private user embedding p_u, item
embeddings q_i and the shared output weights h. Each round a client draws ``negatives``
unrated items per positive, runs ``local-epochs`` full-batch SGD steps on the binary
cross-entropy over positives and negatives, keeps p_u, and uploads the updated rows of the
items it trained (positives and negatives) with its updated h.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=4)
def load_dataset(data: str, users: int, items: int, seed: int):
    if data == "synthetic":
        from privaudit.data.synthetic import synthetic

        return synthetic(n_users=users, n_items=items, seed=seed)
    from privaudit.data import load_dataset as load

    return load(data)


def dataset_of(run_config):
    return load_dataset(
        str(run_config["data"]), int(run_config["data-users"]), int(run_config["data-items"]), int(run_config["seed"])
    )


def positives(dataset, user: int) -> np.ndarray:
    """The user's positives (every rated item), int64 sorted."""
    return dataset.user_items(user)[0]


def sample_negatives(n_items: int, pos: np.ndarray, k: int, seed: int, user: int, rnd: int) -> np.ndarray:
    """``k`` unrated items per positive (with replacement across positives, unique per draw)."""
    rng = np.random.default_rng([seed, 4, user, rnd])
    pool = np.setdiff1d(np.arange(n_items), pos)
    size = min(pool.size, k * pos.size)
    return np.sort(rng.choice(pool, size=size, replace=False))


def init_user(seed: int, user: int, dim: int) -> np.ndarray:
    return np.random.default_rng([seed, 2, user]).normal(0.0, 0.1, size=dim)


def init_model(seed: int, n_items: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 3])
    return rng.normal(0.0, 0.1, size=(n_items, dim)), np.ones(dim)


def local_train(p, Q, h, labels, lr: float, epochs: int):
    """Full-batch SGD on the mean BCE of sigmoid(h . (p * q_i)); returns updated (p, Q, h, loss).

    Parameters
    ----------
    p : ndarray of shape (dim,)
    Q : ndarray of shape (n, dim)   rows of the trained items
    h : ndarray of shape (dim,)
    labels : ndarray of shape (n,)  1 for positives, 0 for negatives
    """
    import torch

    tp = torch.tensor(p, dtype=torch.float64, requires_grad=True)
    tQ = torch.tensor(Q, dtype=torch.float64, requires_grad=True)
    th = torch.tensor(h, dtype=torch.float64, requires_grad=True)
    y = torch.tensor(labels, dtype=torch.float64)
    opt = torch.optim.SGD([tp, tQ, th], lr=lr)
    loss = torch.tensor(0.0)
    for _ in range(epochs):
        opt.zero_grad()
        logits = (tQ * tp) @ th
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="sum") / max(len(labels), 1)
        loss.backward()
        opt.step()
    return tp.detach().numpy(), tQ.detach().numpy(), th.detach().numpy(), float(loss)


def private_data(context) -> dict[str, np.ndarray]:
    """Ground truth of one node for privaudit's recorder: its positives and attributes."""
    dataset = dataset_of(context.run_config)
    user = int(context.node_config["partition-id"])
    return {
        "items": positives(dataset, user).astype(np.int64),
        "attributes": np.asarray(dataset.user_attributes[user], dtype=np.float64),
    }


def public_info(run_config) -> dict:
    dataset = dataset_of(run_config)
    return {"n_items": int(dataset.n_items), "attribute_names": list(dataset.attribute_names)}
