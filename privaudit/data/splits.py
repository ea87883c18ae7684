"""Train/test splits, cold-start splits, k-fold over ratings and min-count filtering.

Every function that draws randomness takes ``rng``: a ``numpy.random.Generator``, an int seed
or None, passed through ``numpy.random.default_rng`` (a Generator is used as is and advanced;
None draws fresh OS entropy, so pass a Generator or seed for reproducible runs).

Splits of ratings return datasets with the same users, items and metadata as the input (only
the rating matrix and timestamps differ), so indices stay aligned between train and test.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp

from privaudit.data.dataset import RatingsDataset
from privaudit.errors import DataError

__all__ = [
    "holdout_split",
    "leave_one_out",
    "cold_start_users",
    "cold_start_items",
    "kfold_ratings",
    "filter_min_ratings",
]

RngLike = np.random.Generator | int | None
#: Tie rules of :func:`leave_one_out`.
LOO_TIES = ("random", "highest")


def _rng(rng: RngLike) -> np.random.Generator:
    return np.random.default_rng(rng)


def _entry_rows(ds: RatingsDataset) -> np.ndarray:
    """(n_ratings,) row index of every stored rating, in CSR order."""
    return np.repeat(np.arange(ds.n_users, dtype=np.int64), np.diff(ds.ratings.indptr))


def _check_fraction(fraction: float, name: str, upper_open: bool = False) -> float:
    fraction = float(fraction)
    ok = 0.0 <= fraction < 1.0 if upper_open else 0.0 <= fraction <= 1.0
    if not ok:
        rng_txt = "[0, 1)" if upper_open else "[0, 1]"
        raise DataError(f"{name} must be in {rng_txt}, got {fraction}")
    return fraction


def _round_half_up(x: np.ndarray | float) -> np.ndarray:
    return np.floor(np.asarray(x, dtype=np.float64) + 0.5).astype(np.int64)


def holdout_split(
    ds: RatingsDataset, test_fraction: float = 0.2, rng: RngLike = None
) -> tuple[RatingsDataset, RatingsDataset]:
    """Per-user random holdout of rated items.

    Each user with ``n_u`` ratings puts ``round(test_fraction * n_u)`` of them, capped at
    ``n_u - 1``, into the test set, so every user with ratings keeps at least one training
    rating (users with a single rating have no test item).

    Returns:
        (train, test): datasets with ``ds``'s shape and metadata; their rating matrices are
        disjoint and sum to ``ds.ratings``.
    """
    test_fraction = _check_fraction(test_fraction, "test_fraction", upper_open=True)
    rng = _rng(rng)
    rows = _entry_rows(ds)
    n_u = np.diff(ds.ratings.indptr)
    n_test = np.minimum(_round_half_up(test_fraction * n_u), np.maximum(n_u - 1, 0))
    order = np.lexsort((rng.random(rows.size), rows))  # random order inside each user
    rank = np.empty(rows.size, dtype=np.int64)
    rank[order] = np.arange(rows.size) - ds.ratings.indptr[rows[order]]
    test = rank < n_test[rows]
    return ds.select_ratings(~test), ds.select_ratings(test)


def leave_one_out(
    ds: RatingsDataset, rng: RngLike = None, ties: str = "random"
) -> tuple[RatingsDataset, sp.csr_matrix]:
    """Hold out each user's latest rating (by timestamp).

    ``ties`` decides between ratings that share a user's latest timestamp (415 of the 943
    ML-100K users have such ties, 3.9 ratings each on average) and, without timestamps,
    between all of a user's ratings:

    - ``"random"`` (default): uniformly at random, drawn from ``rng`` -- the reading of "the
      last interaction" that does not depend on how items are numbered (a stable sort of the
      original file, the usual pandas recipe, behaves the same way on ML-100K, whose file
      order is unrelated to item ids);
    - ``"highest"``: the highest item index. Deterministic, but biased wherever ids carry
      meaning: on ML-100K higher ids are later, less popular films, and the popularity
      ranker's HR@10 on the held-out items drops well below its file-order value.

    Every user with at least one rating contributes exactly one test entry (a user with a
    single rating is left with an empty training row).

    Returns:
        (train, test): ``train`` a dataset without the held-out ratings; ``test`` a
        (n_users, n_items) float64 CSR matrix with one entry (the rating) per user that has
        ratings, and an empty row otherwise.
    """
    if ties not in LOO_TIES:
        raise DataError(f"leave-one-out ties must be 'random' or 'highest', got {ties!r}")
    rows = _entry_rows(ds)
    ts = ds.timestamps.data if ds.timestamps is not None else np.zeros(rows.size, dtype=np.int64)
    tiebreak = ds.ratings.indices if ties == "highest" else _rng(rng).random(rows.size)
    order = np.lexsort((tiebreak, ts, rows))  # last of each user block = latest
    ends = ds.ratings.indptr[1:]
    has = ends > ds.ratings.indptr[:-1]
    chosen = order[ends[has] - 1]
    mask = np.zeros(rows.size, dtype=bool)
    mask[chosen] = True
    test = ds.select_ratings(mask).ratings
    return ds.select_ratings(~mask), test


def _cold_split(n: int, fraction: float, rng: RngLike, what: str) -> tuple[np.ndarray, np.ndarray]:
    fraction = _check_fraction(fraction, f"cold-start {what} fraction")
    perm = _rng(rng).permutation(n).astype(np.int64)
    n_cold = int(_round_half_up(fraction * n))
    return np.sort(perm[n_cold:]), np.sort(perm[:n_cold])


def cold_start_users(ds: RatingsDataset, fraction: float = 0.1, rng: RngLike = None) -> tuple[np.ndarray, np.ndarray]:
    """Random cold-start users: (warm_user_idx, cold_user_idx), sorted int64, disjoint, covering
    all users; ``round(fraction * n_users)`` are cold."""
    return _cold_split(ds.n_users, fraction, rng, "user")


def cold_start_items(ds: RatingsDataset, fraction: float = 0.1, rng: RngLike = None) -> tuple[np.ndarray, np.ndarray]:
    """Random cold-start items: (warm_item_idx, cold_item_idx), sorted int64, disjoint, covering
    all items; ``round(fraction * n_items)`` are cold."""
    return _cold_split(ds.n_items, fraction, rng, "item")


def kfold_ratings(
    ds: RatingsDataset, k: int = 5, rng: RngLike = None
) -> Iterator[tuple[RatingsDataset, RatingsDataset]]:
    """K-fold cross-validation over individual ratings.

    Ratings are shuffled and dealt into ``k`` folds of sizes differing by at most one; fold
    ``f`` yields ``(train, test)`` with test = fold ``f`` and train = the rest. Each rating is
    in exactly one test fold. Arguments are checked (and the folds drawn) at call time; the
    datasets are built lazily as the iterator is consumed.
    """
    k = int(k)
    if not 2 <= k <= max(ds.n_ratings, 2):
        raise DataError(f"kfold_ratings: k must be in 2..{max(ds.n_ratings, 2)}, got {k}")
    fold = np.empty(ds.n_ratings, dtype=np.int64)
    fold[_rng(rng).permutation(ds.n_ratings)] = np.arange(ds.n_ratings) % k

    def folds() -> Iterator[tuple[RatingsDataset, RatingsDataset]]:
        for f in range(k):
            test = fold == f
            yield ds.select_ratings(~test), ds.select_ratings(test)

    return folds()


def filter_min_ratings(ds: RatingsDataset, min_user: int = 0, min_item: int = 0) -> RatingsDataset:
    """Drop users with fewer than ``min_user`` and items with fewer than ``min_item`` ratings,
    repeating until both hold for every remaining user and item (the k-core).

    Returns:
        a dataset with the surviving users and items, in their original order.
    """
    pattern = ds.ratings.copy()
    pattern.data = np.ones_like(pattern.data)
    pattern = pattern.tocsr()
    users = np.arange(ds.n_users)
    items = np.arange(ds.n_items)
    while True:
        user_counts = np.asarray(pattern.sum(axis=1)).ravel()
        item_counts = np.asarray(pattern.sum(axis=0)).ravel()
        keep_u = user_counts >= min_user
        keep_i = item_counts >= min_item
        if keep_u.all() and keep_i.all():
            break
        pattern = pattern[keep_u][:, keep_i]
        users, items = users[keep_u], items[keep_i]
    out = ds
    if users.size != ds.n_users:
        out = out.subset_users(users)
    if items.size != ds.n_items:
        out = out.subset_items(items)
    return out
