"""The :class:`RatingsDataset` container shared by loaders, protocols and attacks.

A dataset holds an explicit-feedback rating matrix plus the side information the federated
recommenders use (one-hot user attributes, multi-hot item features) and the raw ids needed to
map indices back to the source files. Everything is indexed by contiguous 0-based user and
item indices; ``user_ids[u]`` / ``item_ids[i]`` give the original ids.

Conventions
-----------
* ``ratings`` is a canonical ``scipy.sparse.csr_matrix`` (sorted indices, no duplicates) of
  shape ``(n_users, n_items)`` and dtype float64; a stored entry means "rated", and stored
  zeros are removed (0 means unrated).
* ``timestamps`` (optional) has exactly the same ``indptr``/``indices`` as ``ratings`` and
  int64 unix times as data (a timestamp of 0 is kept as an explicit entry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit.errors import DataError

__all__ = ["RatingsDataset", "build_csr"]


def build_csr(
    rows: np.ndarray,
    cols: np.ndarray,
    values: np.ndarray,
    shape: tuple[int, int],
    dtype: Any = np.float64,
    order: np.ndarray | None = None,
) -> sp.csr_matrix:
    """Canonical CSR matrix from COO triples that contain no duplicate ``(row, col)`` pairs.

    Unlike ``csr_matrix((v, (r, c)))`` this keeps explicit zeros, so two matrices built from
    the same ``rows``/``cols`` always share the same sparsity structure.

    Args:
        rows, cols: (nnz,) integer indices.
        values: (nnz,) values.
        shape: ``(n_rows, n_cols)``.
        dtype: dtype of the stored values.
        order: optional precomputed row-major order of the entries (from :func:`sort_coo`).

    Returns:
        ``csr_matrix`` of ``shape`` with sorted indices.
    """
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    if order is None:
        order = np.argsort(rows * int(shape[1]) + cols)
    counts = np.bincount(rows, minlength=shape[0])
    indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    data = np.asarray(values, dtype=dtype)[order]
    mat = sp.csr_matrix((data, cols[order], indptr), shape=shape)
    mat.has_sorted_indices = True
    return mat


def _canonical(mat: Any, shape: tuple[int, int] | None = None) -> sp.csr_matrix:
    """``mat`` as a canonical float64 CSR matrix without stored zeros."""
    out = sp.csr_matrix(mat, dtype=np.float64, copy=True)
    if shape is not None and out.shape != shape:
        raise DataError(f"rating matrix has shape {out.shape}, expected {shape}")
    out.sum_duplicates()
    out.eliminate_zeros()
    out.sort_indices()
    return out


def _as_rows(a: Any, n: int, what: str, name: str) -> np.ndarray:
    """``a`` as a float64 (n, p) array; an empty 1-D input means p = 0."""
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim == 1 and arr.size == 0:
        return np.zeros((n, 0))
    if arr.ndim != 2 or arr.shape[0] != n:
        raise DataError(f"dataset {name!r}: {what} has shape {arr.shape}, expected ({n}, p)")
    return arr


def _same_structure(a: sp.csr_matrix, b: sp.csr_matrix) -> bool:
    return (
        a.shape == b.shape
        and a.nnz == b.nnz
        and np.array_equal(a.indptr, b.indptr)
        and np.array_equal(a.indices, b.indices)
    )


def _keys(mat: sp.csr_matrix) -> np.ndarray:
    """Row-major linear keys ``row * n_cols + col`` of the stored entries (sorted for canonical CSR)."""
    rows = np.repeat(np.arange(mat.shape[0], dtype=np.int64), np.diff(mat.indptr))
    return rows * mat.shape[1] + mat.indices.astype(np.int64)


@dataclass(eq=False, repr=False)
class RatingsDataset:
    """An explicit-feedback ratings dataset with user attributes and item features.

    Attributes:
        name: ``"ml-100k"``, ``"ml-1m"``, ``"ml-latest-small"``, ``"csv"`` or ``"synthetic"``.
        ratings: (n_users, n_items) float64 CSR; stored entries are the ratings, 0 = unrated.
        user_attributes: (n_users, p) float64 one-hot dummies (0/1); p may be 0.
        attribute_names: p column names such as ``"age=7-16"``, ``"gender=F"``,
            ``"occupation=writer"``, ``"region=9"``, ``"region=unknown"``.
        item_features: (n_items, q) float64 multi-hot genres (0/1); q may be 0.
        feature_names: q column names such as ``"genre=Action"``.
        user_ids: (n_users,) original user ids (int64 or str), index -> raw id.
        item_ids: (n_items,) original item ids (int64 or str), index -> raw id.
        timestamps: (n_users, n_items) int64 CSR with the same structure as ``ratings``
            (unix seconds), or None.
        user_region: (n_users,) int64 first ZIP digit 0..9, -1 = unknown / non-numeric.
        rating_min, rating_max, rating_step: the rating scale (1, 5, 1 for ML-100K;
            0.5, 5, 0.5 for ML latest-small; step 0 means continuous ratings).
    """

    name: str
    ratings: sp.csr_matrix
    user_attributes: np.ndarray
    attribute_names: list[str]
    item_features: np.ndarray
    feature_names: list[str]
    user_ids: np.ndarray
    item_ids: np.ndarray
    timestamps: sp.csr_matrix | None
    user_region: np.ndarray
    rating_min: float
    rating_max: float
    rating_step: float

    def __post_init__(self) -> None:
        ratings = self.ratings
        if not (
            sp.isspmatrix_csr(ratings)
            and ratings.dtype == np.float64
            and ratings.has_canonical_format
            and not (ratings.data == 0).any()
        ):
            ratings = _canonical(ratings)
        self.ratings = ratings
        n, m = ratings.shape
        self.user_attributes = _as_rows(self.user_attributes, n, "user_attributes", self.name)
        self.item_features = _as_rows(self.item_features, m, "item_features", self.name)
        self.attribute_names = [str(a) for a in self.attribute_names]
        self.feature_names = [str(f) for f in self.feature_names]
        self.user_ids = np.asarray(self.user_ids)
        self.item_ids = np.asarray(self.item_ids)
        self.user_region = np.asarray(self.user_region, dtype=np.int64)
        self.rating_min = float(self.rating_min)
        self.rating_max = float(self.rating_max)
        self.rating_step = float(self.rating_step)
        checks = [
            (len(self.attribute_names) == self.user_attributes.shape[1], "attribute_names"),
            (len(self.feature_names) == self.item_features.shape[1], "feature_names"),
            (self.user_ids.shape == (n,), "user_ids"),
            (self.item_ids.shape == (m,), "item_ids"),
            (self.user_region.shape == (n,), "user_region"),
        ]
        for ok, what in checks:
            if not ok:
                raise DataError(f"dataset {self.name!r}: {what} does not match the rating matrix shape {n}x{m}")
        if self.timestamps is not None:
            ts = self.timestamps
            if not sp.isspmatrix_csr(ts) or ts.dtype != np.int64:
                ts = sp.csr_matrix(ts, dtype=np.int64)
                ts.sort_indices()
            if not _same_structure(ts, ratings):
                raise DataError(f"dataset {self.name!r}: timestamps do not have the sparsity of the ratings")
            self.timestamps = ts

    # ------------------------------------------------------------------ basics
    @property
    def n_users(self) -> int:
        """Number of users (rows)."""
        return int(self.ratings.shape[0])

    @property
    def n_items(self) -> int:
        """Number of items (columns)."""
        return int(self.ratings.shape[1])

    @property
    def n_ratings(self) -> int:
        """Number of stored ratings."""
        return int(self.ratings.nnz)

    def summary(self) -> dict:
        """``{"name", "users", "items", "ratings", "attributes": p, "item_features": q}``."""
        return {
            "name": self.name,
            "users": self.n_users,
            "items": self.n_items,
            "ratings": self.n_ratings,
            "attributes": int(self.user_attributes.shape[1]),
            "item_features": int(self.item_features.shape[1]),
        }

    def __repr__(self) -> str:
        s = self.summary()
        return (
            f"RatingsDataset(name={s['name']!r}, users={s['users']}, items={s['items']}, "
            f"ratings={s['ratings']}, attributes={s['attributes']}, item_features={s['item_features']}, "
            f"scale={self.rating_min:g}..{self.rating_max:g} step {self.rating_step:g}, "
            f"timestamps={'yes' if self.timestamps is not None else 'no'})"
        )

    def user_items(self, u: int) -> tuple[np.ndarray, np.ndarray]:
        """Items rated by user ``u``: (item indices int64 sorted, ratings float64), both (n_u,)."""
        u = int(u)
        if not -self.n_users <= u < self.n_users:
            raise IndexError(f"user index {u} out of range for {self.n_users} users")
        u %= self.n_users
        lo, hi = self.ratings.indptr[u], self.ratings.indptr[u + 1]
        return (
            self.ratings.indices[lo:hi].astype(np.int64),
            self.ratings.data[lo:hi].astype(np.float64, copy=True),
        )

    # ------------------------------------------------------------------ derived datasets
    def _replace(self, **changes: Any) -> RatingsDataset:
        fields = {
            "name": self.name,
            "ratings": self.ratings,
            "user_attributes": self.user_attributes,
            "attribute_names": list(self.attribute_names),
            "item_features": self.item_features,
            "feature_names": list(self.feature_names),
            "user_ids": self.user_ids,
            "item_ids": self.item_ids,
            "timestamps": self.timestamps,
            "user_region": self.user_region,
            "rating_min": self.rating_min,
            "rating_max": self.rating_max,
            "rating_step": self.rating_step,
        }
        fields.update(changes)
        return RatingsDataset(**fields)

    def _subset(self, rows: np.ndarray | slice, cols: np.ndarray | slice) -> tuple[sp.csr_matrix, sp.csr_matrix | None]:
        """Ratings and timestamps restricted to ``rows`` x ``cols`` with identical structure."""
        pos = sp.csr_matrix(
            (np.arange(1, self.n_ratings + 1, dtype=np.int64), self.ratings.indices, self.ratings.indptr),
            shape=self.ratings.shape,
        )
        sub = pos[rows][:, cols].tocsr()
        sub.sort_indices()
        take = sub.data - 1
        ratings = sp.csr_matrix((self.ratings.data[take], sub.indices, sub.indptr), shape=sub.shape)
        ratings.has_sorted_indices = True
        ts = None
        if self.timestamps is not None:
            ts = sp.csr_matrix((self.timestamps.data[take], sub.indices.copy(), sub.indptr.copy()), shape=sub.shape)
            ts.has_sorted_indices = True
        return ratings, ts

    @staticmethod
    def _index(idx: Any, n: int, what: str) -> np.ndarray:
        idx = np.asarray(idx)
        if idx.dtype == bool:
            if idx.shape != (n,):
                raise DataError(f"boolean {what} mask has shape {idx.shape}, expected ({n},)")
            return np.flatnonzero(idx)
        if idx.size == 0:
            return np.zeros(0, dtype=np.int64)
        if idx.dtype.kind not in "iu":
            raise DataError(f"{what} indices must be integers or a boolean mask, got dtype {idx.dtype}")
        idx = idx.astype(np.int64).ravel()
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise DataError(f"{what} index out of range for {n} {what}s")
        return idx % n if n else idx

    def subset_users(self, idx: Any) -> RatingsDataset:
        """Dataset with only the users ``idx`` (int indices in the given order, or a bool mask); all items kept."""
        idx = self._index(idx, self.n_users, "user")
        ratings, ts = self._subset(idx, slice(None))
        return self._replace(
            ratings=ratings,
            timestamps=ts,
            user_attributes=self.user_attributes[idx],
            user_ids=self.user_ids[idx],
            user_region=self.user_region[idx],
        )

    def subset_items(self, idx: Any) -> RatingsDataset:
        """Dataset with only the items ``idx`` (int indices in the given order, or a bool mask); all users kept."""
        idx = self._index(idx, self.n_items, "item")
        ratings, ts = self._subset(slice(None), idx)
        return self._replace(
            ratings=ratings,
            timestamps=ts,
            item_features=self.item_features[idx],
            item_ids=self.item_ids[idx],
        )

    def with_ratings(self, ratings_csr: Any) -> RatingsDataset:
        """Same metadata with a new (n_users, n_items) rating matrix.

        Stored zeros are dropped. Timestamps are carried over to the new sparsity pattern when
        every new entry had a timestamp (e.g. a train/test split); otherwise they become None.
        """
        ratings = _canonical(ratings_csr, shape=self.ratings.shape)
        ts = None
        if self.timestamps is not None:
            old, new = _keys(self.ratings), _keys(ratings)
            pos = np.searchsorted(old, new)
            pos_c = np.minimum(pos, max(old.size - 1, 0))
            if old.size and np.array_equal(old[pos_c], new):
                ts = sp.csr_matrix(
                    (self.timestamps.data[pos_c], ratings.indices.copy(), ratings.indptr.copy()),
                    shape=ratings.shape,
                )
                ts.has_sorted_indices = True
            elif new.size == 0:
                ts = sp.csr_matrix(ratings.shape, dtype=np.int64)
        return self._replace(ratings=ratings, timestamps=ts)

    def select_ratings(self, mask: Any) -> RatingsDataset:
        """Keep only the stored ratings where ``mask`` is True (same shape and metadata).

        Args:
            mask: (n_ratings,) bool over the stored entries in CSR order
                (``ratings.data`` order); timestamps are kept for the selected entries.
        """
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (self.n_ratings,):
            raise DataError(f"rating mask has shape {mask.shape}, expected ({self.n_ratings},)")
        rows = np.repeat(np.arange(self.n_users), np.diff(self.ratings.indptr))
        indptr = np.concatenate(([0], np.cumsum(np.bincount(rows[mask], minlength=self.n_users))))
        indices = self.ratings.indices[mask]
        ratings = sp.csr_matrix((self.ratings.data[mask], indices, indptr), shape=self.ratings.shape)
        ratings.has_sorted_indices = True
        ts = None
        if self.timestamps is not None:
            ts = sp.csr_matrix((self.timestamps.data[mask], indices.copy(), indptr.copy()), shape=self.ratings.shape)
            ts.has_sorted_indices = True
        return self._replace(ratings=ratings, timestamps=ts)

    @classmethod
    def from_triples(
        cls,
        users: Any,
        items: Any,
        ratings: Any,
        timestamps: Any = None,
        *,
        name: str = "csv",
        rating_min: float | None = None,
        rating_max: float | None = None,
        rating_step: float | None = None,
    ) -> RatingsDataset:
        """Dataset without side information from (user id, item id, rating[, timestamp]) triples.

        Raw ids are mapped to contiguous indices sorted by raw id. The rating scale defaults to
        the observed min/max and the coarsest of 1, 0.5, 0.25, 0.1, 0.05, 0.01 that fits all
        ratings (0 = continuous); a declared bound or step that a rating violates raises
        :class:`DataError`, as do duplicate (user, item) pairs.
        """
        users, items = np.asarray(users), np.asarray(items)
        values = np.asarray(ratings, dtype=np.float64)
        if not (users.shape == items.shape == values.shape) or users.ndim != 1:
            raise DataError("users, items and ratings must be 1-D arrays of the same length")
        user_ids, rows = np.unique(users, return_inverse=True)
        item_ids, cols = np.unique(items, return_inverse=True)
        shape = (user_ids.size, item_ids.size)
        dup = duplicate_positions(rows, cols, shape[1])
        if dup.size:
            raise DataError(f"duplicate rating for user {users[dup[0]]!r} and item {items[dup[0]]!r} (entry {dup[0]})")
        ts = None
        if timestamps is not None:
            ts = build_csr(rows, cols, np.asarray(timestamps, dtype=np.int64), shape, dtype=np.int64)
        lo, hi, step = infer_scale(values)
        lo = lo if rating_min is None else float(rating_min)
        hi = hi if rating_max is None else float(rating_max)
        step = step if rating_step is None else float(rating_step)
        off = (values < lo - 1e-9) | (values > hi + 1e-9)
        if step > 0:
            q = (values - lo) / step
            off |= np.abs(q - np.round(q)) > 1e-9
        if off.any():
            k = int(np.flatnonzero(off)[0])
            raise DataError(f"rating {values[k]:g} (entry {k}) is not on the scale {lo:g}..{hi:g} step {step:g}")
        return cls(
            name=name,
            ratings=build_csr(rows, cols, values, shape),
            user_attributes=np.zeros((shape[0], 0)),
            attribute_names=[],
            item_features=np.zeros((shape[1], 0)),
            feature_names=[],
            user_ids=user_ids,
            item_ids=item_ids,
            timestamps=ts,
            user_region=np.full(shape[0], -1, dtype=np.int64),
            rating_min=lo,
            rating_max=hi,
            rating_step=step,
        )


def sort_coo(rows: np.ndarray, cols: np.ndarray, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-major order of COO entries and the duplicates.

    Returns:
        (order, duplicates): ``order`` (nnz,) sorts the entries by (row, col) (stable);
        ``duplicates`` are the input positions, ascending, of entries whose (row, col) pair
        occurred earlier in the input.
    """
    keys = np.asarray(rows, dtype=np.int64) * int(n_cols) + np.asarray(cols, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    return order, np.sort(order[1:][sk[1:] == sk[:-1]])


def duplicate_positions(rows: np.ndarray, cols: np.ndarray, n_cols: int) -> np.ndarray:
    """Positions (in input order, ascending) of entries whose (row, col) pair occurred earlier."""
    return sort_coo(rows, cols, n_cols)[1]


def infer_scale(values: np.ndarray) -> tuple[float, float, float]:
    """(min, max, step) of observed ratings; step is the coarsest grid that fits, else 0."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return 0.0, 0.0, 0.0
    lo, hi = float(values.min()), float(values.max())
    for step in (1.0, 0.5, 0.25, 0.1, 0.05, 0.01):
        q = values / step
        if np.all(np.abs(q - np.round(q)) < 1e-6):
            return lo, hi, step
    return lo, hi, 0.0
