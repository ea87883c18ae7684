"""Evaluation metrics: utility of the recommenders (here) and success of the attacks
(:mod:`privaudit.attack_metrics`, re-exported here: import every metric from this module).

Pure numpy (scipy only for sparse inputs, ``rankdata`` and the t quantile), vectorized over
users; per-user Python loops are never used. Large ranking inputs are processed in blocks of
users so memory stays bounded.

Conventions shared by every function:

* ``scores`` are dense ``float`` matrices ``(n_users, n_items)`` (higher = recommended first).
  NaN scores make an ordering undefined and raise :class:`ValueError`; ``±inf`` is allowed.
* Matrices of test items (``relevant``, ``test_matrix``, ``exclude``, ``mask``) may be dense
  arrays or scipy sparse matrices/arrays of the same shape as ``scores``.
* Input with no elements (size 0) raises :class:`ValueError`. A well-formed input on which a
  ranking metric is undefined for every user (no user has a relevant/test item) returns NaN,
  which :func:`mean_ci95` skips, so one degenerate point does not abort a sweep.
* Results are plain Python ``float`` (fractions in [0, 1] unless stated otherwise).

Sources (the papers are listed under References in the README): FedNCF paper (HR@k, NDCG@k, leave-one-out), PrivMVMF paper
(eq. 43 accuracy; appendix .2, eqs. 50-54: NDCG@10, precision, recall, F1, relevance =
rating >= 4), DP-prototypes paper (eq. 4 mean percentile rank, eqs. 5-6 MAP@k),
FedSPLIT paper (eq. 4 relative error).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit._metric_inputs import paired_values
from privaudit.attack_metrics import (
    auc,
    clopper_pearson,
    empirical_epsilon,
    f1_score,
    majority_guess_accuracy,
    mean_ci95,
    reconstruction_accuracy,
    relative_error,
    roc_summary,
    set_precision_recall,
    set_prf,
    uniform_guess_accuracy,
)

__all__ = [
    "rmse",
    "mae",
    "error_sums_by_user",
    "hit_ratio_at_k",
    "ndcg_at_k_loo",
    "ranking_metrics_at_k",
    "ranking_metrics_at_k_factored",
    "mean_rank",
    "map_at_k",
    "reconstruction_accuracy",
    "relative_error",
    "set_precision_recall",
    "f1_score",
    "set_prf",
    "auc",
    "roc_summary",
    "clopper_pearson",
    "empirical_epsilon",
    "mean_ci95",
    "uniform_guess_accuracy",
    "majority_guess_accuracy",
]

# Users are processed in blocks of at most this many matrix elements.
_BLOCK_ELEMENTS = 1 << 22
_STRIDE = 8  # _topk_order bounds each row's k-th best score from every 8th column
_RANKING_THREADS = min(4, os.cpu_count() or 1)  # threads ranking blocks of users in parallel


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return int(k)


def _scores_2d(scores: Any, name: str = "scores") -> np.ndarray:
    """Dense float64 (n_users, n_items) score matrix without NaN."""
    if sp.issparse(scores):
        scores = scores.toarray()
    s = np.asarray(scores, dtype=float)
    if s.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (n_users, n_items) matrix, got shape {s.shape}")
    if s.size == 0:
        raise ValueError(f"{name} is empty (shape {s.shape})")
    if np.isnan(s).any():
        raise ValueError(f"{name} contains NaN; the ranking is undefined")
    return s


def _matrix(m: Any, shape: tuple[int, int], name: str, dtype: Any = bool) -> Any:
    """A dense ndarray or a CSR matrix of the given shape (bool: nonzero -> True)."""
    if sp.issparse(m):
        out = sp.csr_matrix(m)
        if dtype is bool:
            out = out.astype(bool)
            out.eliminate_zeros()
        else:
            out = out.astype(dtype)
    else:
        arr = np.asarray(m)
        out = (arr != 0) if dtype is bool else arr.astype(dtype)
    if out.shape != shape:
        raise ValueError(f"{name} has shape {out.shape} but scores have shape {shape}")
    return out


def _rows(m: Any, lo: int, hi: int) -> np.ndarray:
    """Dense rows lo:hi of a dense array or CSR matrix."""
    if sp.issparse(m):
        return np.asarray(m[lo:hi].toarray())
    return m[lo:hi]


def _blocks(n_rows: int, n_cols: int):
    step = max(1, _BLOCK_ELEMENTS // max(1, n_cols))
    for lo in range(0, n_rows, step):
        yield lo, min(n_rows, lo + step)


def _topk_order_full(s: np.ndarray, rel: np.ndarray, excl: np.ndarray | None, kk: int) -> np.ndarray:
    """Reference ordering by a full row sort (the definition :func:`_topk_order` reproduces)."""
    keys = [rel, -s] if excl is None else [rel, -s, excl]  # last key is the primary one
    return np.lexsort(keys, axis=-1)[:, :kk]


def _topk_order(s: np.ndarray, rel: np.ndarray, excl: np.ndarray | None, kk: int) -> np.ndarray:
    """Column indices (b, kk) of every row's first kk items in the order of
    :func:`_topk_order_full` -- non-excluded first, score descending, non-relevant first,
    column index ascending -- by top-k selection: ``np.partition`` of every ``_STRIDE``-th
    column finds a score t no better than each row's kk-th best non-excluded score, and only
    the non-excluded items scoring >= t (a superset of the first kk, all ties included) are
    sorted. Positions past a row's number of non-excluded items are arbitrary."""
    b, m = s.shape
    if 4 * kk >= m:
        return _topk_order_full(s, rel, excl, kk)
    neg = -s
    if excl is not None:
        neg = np.where(excl, np.inf, neg)
    # t: per row, a bound >= the kk-th smallest non-excluded neg, from the kk-th smallest of
    # every _STRIDE-th column (the kk-th smallest of a subset is never smaller); rows whose
    # subset holds fewer than kk finite values get the exact kk-th smallest instead
    t = np.partition(neg[:, ::_STRIDE] if m >= 16 * _STRIDE * kk else neg, kk - 1, axis=1)[:, kk - 1 : kk]
    loose = t[:, 0] == np.inf
    if loose.any():
        t[loose] = np.partition(neg[loose], kk - 1, axis=1)[:, kk - 1 : kk]
    cand = neg <= t  # every item ranked in the first kk places, plus some more
    if excl is not None:
        cand &= ~excl
    r, c = np.nonzero(cand)  # row-major: each row's candidates, columns ascending
    counts = np.bincount(r, minlength=b)
    width = max(kk, int(counts.max()))
    if 2 * width >= m:  # heavy ties: selection saves nothing
        return _topk_order_full(s, rel, excl, kk)
    # (b, width) candidate columns; a row with fewer candidates is padded with fillers
    # (column 0, flagged), which sort after every candidate
    starts = np.cumsum(counts) - counts
    slot = np.arange(r.size) - np.repeat(starts, counts)
    cols = np.zeros((b, width), dtype=np.intp)
    cols[r, slot] = c
    filler = np.ones((b, width), dtype=bool)
    filler[r, slot] = False
    keys = [
        cols,
        np.take_along_axis(rel, cols, axis=1),
        np.take_along_axis(neg, cols, axis=1),
        filler,
    ]  # last key is the primary one: candidates before fillers
    order = np.lexsort(keys, axis=-1)[:, :kk]
    return np.take_along_axis(cols, order, axis=1)


def _topk_hits(s: np.ndarray, rel: np.ndarray, excl: np.ndarray | None, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Relevance of the top-k list of every user in a block.

    Items are ordered by score (descending); ties are broken pessimistically (non-relevant
    items first, then by column index); excluded items are never recommended. Returns
    ``hits`` (b, min(k, n_items)) bool -- position j holds True iff the j-th recommended item
    (0-based) is relevant -- and ``n_rec`` (b,), the length of each user's list,
    ``min(k, number of non-excluded items)``.
    """
    b, m = s.shape
    kk = min(k, m)
    order = _topk_order(s, rel, excl, kk)
    hits = np.take_along_axis(rel, order, axis=1)
    n_avail = np.full(b, m) if excl is None else m - excl.sum(axis=1)
    n_rec = np.minimum(kk, n_avail)
    hits &= np.arange(kk)[None, :] < n_rec[:, None]
    return hits, n_rec


def _desc_tie_counts(s: np.ndarray, avail: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """For every entry: how many available items of its row score strictly higher, and how
    many available items (itself included) score exactly the same. Shapes (b, m), int64.
    Entries that are not available get meaningless values."""
    b, m = s.shape
    neg = -s
    if avail is None:
        order = np.argsort(neg, axis=1, kind="stable")
    else:
        order = np.lexsort([neg, ~avail], axis=-1)  # available first, then by score
    sv = np.take_along_axis(neg, order, axis=1)
    change = sv[:, 1:] != sv[:, :-1]
    if avail is not None:
        sa = np.take_along_axis(avail, order, axis=1)
        change |= sa[:, 1:] != sa[:, :-1]
    first = np.ones((b, m), dtype=bool)
    first[:, 1:] = change
    last = np.ones((b, m), dtype=bool)
    last[:, :-1] = change
    idx = np.broadcast_to(np.arange(m), (b, m))
    start = np.maximum.accumulate(np.where(first, idx, 0), axis=1)
    end = np.minimum.accumulate(np.where(last, idx, m - 1)[:, ::-1], axis=1)[:, ::-1]
    greater = np.empty((b, m), dtype=np.int64)
    tied = np.empty((b, m), dtype=np.int64)
    np.put_along_axis(greater, order, start, axis=1)
    np.put_along_axis(tied, order, end - start + 1, axis=1)
    return greater, tied


# --------------------------------------------------------------------------- rating error


def rmse(y_true: Any, y_pred: Any) -> float:
    """Root mean squared error, ``sqrt(mean((y_true - y_pred)^2))``, in rating units.

    Both inputs have the same shape (any), or are lists of per-user 1-D arrays with the same
    lengths (concatenated). NaN propagates (a diverged model reports NaN, it does not raise).
    Used for test RMSE in DP-prototypes paper §4.2 and FedSPLIT paper.
    """
    a, b = paired_values(y_true, y_pred, "y_true", "y_pred")
    return float(np.sqrt(np.mean((a - b) ** 2)))


def mae(y_true: Any, y_pred: Any) -> float:
    """Mean absolute error, ``mean(|y_true - y_pred|)``, in rating units. Inputs as :func:`rmse`."""
    a, b = paired_values(y_true, y_pred, "y_true", "y_pred")
    return float(np.mean(np.abs(a - b)))


def error_sums_by_user(y_true: Any, y_pred: Any, users: Any, n_users: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-user error sums of rating predictions: ``(sum (y_true - y_pred)^2, sum |y_true -
    y_pred|, count)``, each ``(n_users,)`` (float, float, int64), over the entries of each user.

    ``y_true``, ``y_pred``: 1-D, one entry per test rating; ``users``: 1-D int, the user (row,
    ``0 <= u < n_users``) of each entry. The pooled :func:`rmse` is ``sqrt(sq.sum() /
    count.sum())`` and :func:`mae` ``ab.sum() / count.sum()``: the per-user contributions whose
    ratio of sums is the metric (a bootstrap over users resamples them in pairs).
    """
    a, b = paired_values(y_true, y_pred, "y_true", "y_pred")
    u = np.asarray(users)
    if u.shape != a.shape:
        raise ValueError(f"users must have one entry per rating (shape {a.shape}), got shape {u.shape}")
    if u.size and not np.issubdtype(u.dtype, np.integer):
        raise ValueError(f"users must hold integers, got dtype {u.dtype}")
    n = int(n_users)
    if u.size and (u.min() < 0 or u.max() >= n):
        raise ValueError(f"users out of range [0, {n})")
    err = a - b
    sq = np.bincount(u, weights=err**2, minlength=n).astype(float)
    ab = np.bincount(u, weights=np.abs(err), minlength=n).astype(float)
    return sq, ab, np.bincount(u, minlength=n).astype(np.int64)


# --------------------------------------------------------------------------- leave-one-out


def _loo_ranks(scores: Any, target_index: Any) -> np.ndarray:
    s = np.asarray(scores.toarray() if sp.issparse(scores) else scores, dtype=float)
    t = np.asarray(target_index)
    if s.ndim == 1:  # a single user
        s = s[None, :]
        t = t.reshape(1)
    s = _scores_2d(s)
    if t.shape != (s.shape[0],):
        raise ValueError(f"target_index must have shape ({s.shape[0]},) (one index per user), got {t.shape}")
    if not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"target_index must hold integers, got dtype {t.dtype}")
    if (t < 0).any() or (t >= s.shape[1]).any():
        raise ValueError(f"target_index out of range [0, {s.shape[1]})")
    target = s[np.arange(s.shape[0]), t]
    # Pessimistic ties: every other candidate with score >= the target's is ranked above it.
    return (s >= target[:, None]).sum(axis=1) - 1


def _loo_gains(scores: Any, target_index: Any, k: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per user: (hit 0/1, NDCG gain) of the leave-one-out target (float arrays)."""
    k = _check_k(k)
    ranks = _loo_ranks(scores, target_index)
    hits = (ranks < k).astype(float)
    gains = np.where(ranks < k, 1.0 / np.log2(ranks + 2.0), 0.0)
    return hits, gains


def hit_ratio_at_k(scores: Any, target_index: Any, k: int = 10, by_user: bool = False) -> Any:
    """Leave-one-out hit ratio HR@k (FedNCF paper §4.1), averaged over users, in [0, 1].

    ``scores``: (n_users, n_candidates) float -- each row scores the user's held-out item and
    its sampled negatives (fedncf: 1 positive + 100 negatives); a 1-D row is one user.
    ``target_index``: (n_users,) int, the column of the held-out item in each row.

    The 0-based rank of the target is the number of *other* candidates whose score is
    ``>=`` the target's: ties are broken pessimistically (a tied negative counts as ranked
    above the target), so a constant scorer gets HR = 0, never a lucky hit.
    HR_u = 1 if rank_u < k else 0; HR@k = mean_u HR_u. ``by_user``: return ``(HR@k, HR_u)``,
    the per-user values (n_users,) float whose mean it is.
    """
    hits, _ = _loo_gains(scores, target_index, k)
    value = float(np.mean(hits))
    return (value, hits) if by_user else value


def ndcg_at_k_loo(scores: Any, target_index: Any, k: int = 10, by_user: bool = False) -> Any:
    """Leave-one-out NDCG@k (FedNCF paper §4.1), averaged over users, in [0, 1].

    Inputs and the pessimistic tie rule as :func:`hit_ratio_at_k`. With one relevant item the
    ideal DCG is 1, so NDCG_u = 1 / log2(rank_u + 2) if rank_u < k else 0 (rank 0-based:
    the top position gives 1, the second 1/log2(3)). ``by_user``: return ``(NDCG@k, NDCG_u)``.
    """
    _, gains = _loo_gains(scores, target_index, k)
    value = float(np.mean(gains))
    return (value, gains) if by_user else value


# --------------------------------------------------------------------------- top-k lists


def ranking_metrics_at_k(scores: Any, relevant: Any, k: int = 10, exclude: Any = None, by_user: bool = False) -> Any:
    """NDCG@k, precision@k, recall@k and F1@k of top-k lists (PrivMVMF paper appendix .2,
    eqs. 50-54; there relevance = test rating >= 4 and k = 10).

    ``scores``: (n_users, n_items) float. ``relevant``: (n_users, n_items) bool, dense or scipy
    sparse -- the test items judged relevant (e.g. ``test_ratings >= 4``); nonzero = relevant.
    ``exclude``: optional (n_users, n_items) bool, dense or sparse -- items never recommended
    (typically the user's training items).

    Per user u, the list L_u holds the ``n_rec_u = min(k, #non-excluded items)`` best-scored
    non-excluded items; ties are broken pessimistically (non-relevant before relevant, then
    by column index), so constant scores earn nothing. With TP_u = |L_u ∩ Rel_u|:

    * precision_u = TP_u / n_rec_u  (= TP_u / (TP_u + FP_u); 0 if the list is empty)
    * recall_u    = TP_u / |Rel_u|  (= TP_u / (TP_u + FN_u))
    * NDCG_u = DCG_u / IDCG_u, DCG_u = sum_{j=0}^{n_rec_u-1} rel(L_u[j]) / log2(j + 2)
      (binary gains), IDCG_u = sum_{j=0}^{min(k, |Rel_u|)-1} 1 / log2(j + 2).

    precision, recall and ndcg are averaged over the users with |Rel_u| >= 1 (users without a
    relevant test item are skipped). F1 follows PrivMVMF paper eq. 53, which is stated in terms
    of the (averaged) Precision and Recall only: ``F1 = 2 P R / (P + R)`` of the averaged P and
    R -- *not* the mean of per-user F1 (0 when P + R = 0). Relevant items that are also
    excluded still count in |Rel_u| (they can never be hit). If no user has a relevant item,
    every value is NaN.

    Returns ``{"ndcg", "precision", "recall", "f1"}``, all floats in [0, 1]. ``by_user``: return
    ``(that dict, {"ndcg", "precision", "recall": (n_users,) float})``, the per-user values whose
    mean over the users with a relevant item is the metric (NaN for the other users; F1 has no
    per-user form).
    """
    s = _scores_2d(scores)
    return _ranking_metrics(lambda lo, hi: s[lo:hi], s.shape, relevant, k, exclude, by_user)


def ranking_metrics_at_k_factored(
    user_factors: Any, item_factors: Any, relevant: Any, k: int = 10, exclude: Any = None, by_user: bool = False
) -> Any:
    """:func:`ranking_metrics_at_k` of ``scores = user_factors @ item_factors.T`` without the
    full score matrix: scores are computed, checked and ranked one block of users at a time
    (peak memory about one block of ``2**22`` scores plus the inputs).

    ``user_factors``: (n_users, d) float; ``item_factors``: (n_items, d) float. Same values,
    bit for bit, as ``ranking_metrics_at_k(user_factors @ item_factors.T, ...)`` when the row
    blocks of the product equal the rows of the full product (true of numpy's float64 matmul).
    ``by_user`` as :func:`ranking_metrics_at_k`.
    """
    U = np.asarray(user_factors, dtype=float)
    V = np.asarray(item_factors, dtype=float)
    if U.ndim != 2 or V.ndim != 2 or U.shape[1] != V.shape[1]:
        raise ValueError(f"factor shapes {U.shape} and {V.shape} do not give a (n_users, n_items) product")
    shape = (U.shape[0], V.shape[0])
    if shape[0] * shape[1] == 0:
        raise ValueError(f"scores is empty (shape {shape})")
    Vt = V.T

    def block(lo: int, hi: int) -> np.ndarray:
        s = U[lo:hi] @ Vt
        if np.isnan(s).any():
            raise ValueError("scores contains NaN; the ranking is undefined")
        return s

    return _ranking_metrics(block, shape, relevant, k, exclude, by_user)


def _ranking_metrics(
    score_rows, shape: tuple[int, int], relevant: Any, k: Any, exclude: Any, by_user: bool = False
) -> Any:
    """Body of :func:`ranking_metrics_at_k`; ``score_rows(lo, hi)`` gives score rows lo:hi."""
    k = _check_k(k)
    rel = _matrix(relevant, shape, "relevant")
    excl = None if exclude is None else _matrix(exclude, shape, "exclude")
    n_rel = _row_counts(rel)
    kk = min(k, shape[1])
    discounts = 1.0 / np.log2(np.arange(kk) + 2.0)
    ideal = np.cumsum(discounts)

    tot = {"ndcg": 0.0, "precision": 0.0, "recall": 0.0}
    users = {name: np.full(shape[0], math.nan) for name in tot} if by_user else {}
    n_users = 0
    for hits, n_rec, nr, rows in _relevant_user_hits(score_rows, shape, rel, excl, n_rel, k):
        tp = hits.sum(axis=1)
        dcg = hits @ discounts
        idcg = ideal[np.minimum(kk, nr) - 1]
        prec = np.divide(tp, n_rec, out=np.zeros(len(tp)), where=n_rec > 0)
        for name, per in (("ndcg", dcg / idcg), ("precision", prec), ("recall", tp / nr)):
            tot[name] += float(np.sum(per))
            if by_user:
                users[name][rows] = per
        n_users += len(nr)
    if n_users == 0:
        out = {"ndcg": math.nan, "precision": math.nan, "recall": math.nan, "f1": math.nan}
    else:
        out = {name: value / n_users for name, value in tot.items()}
        p, r = out["precision"], out["recall"]
        out["f1"] = 2.0 * p * r / (p + r) if p + r > 0 else 0.0
    out = {key: float(out[key]) for key in ("ndcg", "precision", "recall", "f1")}
    return (out, users) if by_user else out


def _relevant_user_hits(score_rows, shape: tuple[int, int], rel: Any, excl: Any, n_rel: np.ndarray, k: int):
    """Per block of users with at least one relevant item: ``(hits, n_recommended, n_relevant,
    rows)`` (``rows``: the users' row indices).

    ``hits`` (users x min(k, items)) bool marks relevant items in each user's top k (ties as in
    :func:`_topk_hits`); users without relevant items are skipped.
    """

    def one(bounds: tuple[int, int]):
        lo, hi = bounds
        nr = n_rel[lo:hi]
        keep = nr > 0
        if not keep.any():
            return None
        rb = _rows(rel, lo, hi)[keep]
        eb = None if excl is None else _rows(excl, lo, hi)[keep]
        hits, n_rec = _topk_hits(score_rows(lo, hi)[keep], rb, eb, k)
        return hits, n_rec, nr[keep], lo + np.flatnonzero(keep)

    blocks = list(_blocks(*shape))
    workers = min(_RANKING_THREADS, len(blocks))
    if workers <= 1:
        results = map(one, blocks)
        yield from (res for res in results if res is not None)
        return
    # numpy's selection, sorting and products release the GIL: blocks run in threads and
    # come back in block order (each block is independent, so the values do not change)
    with ThreadPoolExecutor(workers) as pool:
        yield from (res for res in pool.map(one, blocks) if res is not None)


def _row_counts(m: Any) -> np.ndarray:
    if sp.issparse(m):
        return np.asarray(m.getnnz(axis=1), dtype=np.int64)
    return np.asarray(m.sum(axis=1), dtype=np.int64)


def map_at_k(scores: Any, test_matrix: Any, k: int = 10, exclude: Any = None, by_user: bool = False) -> Any:
    """Mean average precision MAP@k, DP-prototypes paper eqs. 5-6, in [0, 1].

    ``scores``: (n_users, n_items) float. ``test_matrix``: (n_users, n_items), dense or scipy
    sparse; its nonzero entries are the user's relevant test items (dp-prototypes: the held-out
    entries of the test set T). ``exclude``: optional bool mask of items never recommended.
    The top-k list is built exactly as in :func:`ranking_metrics_at_k` (pessimistic ties).

    With rel(i) = 1 if the item at position i (1-based) is relevant and p(u, i) the precision
    of the first i items, eq. 5: ``AP@k(u) = sum_{i=1}^{k} p(u, i) rel(i) / |Rel_u|`` -- the
    denominator is the user's number of relevant items, as in the paper (the common
    ``min(k, |Rel_u|)`` variant differs only when |Rel_u| > k). Eq. 6: MAP@k is the mean of
    AP@k over the users with at least one relevant test item (NaN if there are none).
    ``by_user``: return ``(MAP@k, AP@k(u))``, the (n_users,) per-user values (NaN for users
    without a relevant test item).
    """
    k = _check_k(k)
    s = _scores_2d(scores)
    shape = s.shape
    rel = _matrix(test_matrix, shape, "test_matrix")
    excl = None if exclude is None else _matrix(exclude, shape, "exclude")
    n_rel = _row_counts(rel)
    kk = min(k, shape[1])
    positions = np.arange(1, kk + 1, dtype=float)
    total, n_users = 0.0, 0
    per_user = np.full(shape[0], math.nan)
    for hits, _, nr, rows in _relevant_user_hits(lambda lo, hi: s[lo:hi], shape, rel, excl, n_rel, k):
        prec = np.cumsum(hits, axis=1) / positions
        ap = (prec * hits).sum(axis=1) / nr
        total += float(np.sum(ap))
        per_user[rows] = ap
        n_users += len(nr)
    value = total / n_users if n_users else math.nan
    return (value, per_user) if by_user else value


def mean_rank(scores: Any, test_matrix: Any, exclude: Any = None, by_user: bool = False) -> Any:
    """Weighted mean percentile rank, DP-prototypes paper eq. 4 (Hu, Koren & Volinsky 2008).

    ``scores``: (n_users, n_items) float. ``test_matrix``: (n_users, n_items), dense or scipy
    sparse, non-negative; its nonzero entries x_ui form the test set T and are the weights.
    ``exclude``: optional bool mask of items left out of every ranking (e.g. training items);
    a test entry may not be excluded.

    rank_ui is the percentile of item i in user u's list of the n_u ranked items:
    ``rank_ui = (#{j: s_uj > s_ui} + 0.5 #{j != i: s_uj = s_ui}) / (n_u - 1)`` -- 0 = top,
    1 = bottom, ties share the average position, so a constant or random scorer gives 0.5.
    Eq. 4: ``mean_rank = sum_{(u,i) in T} x_ui rank_ui / sum_{(u,i) in T} x_ui`` (lower is
    better; >= 0.5 is no better than random). NaN if T is empty. ``by_user``: return
    ``(mean_rank, (num_u, den_u))``, each user's ``sum_i x_ui rank_ui`` and ``sum_i x_ui``
    ((n_users,) float): the metric is their ratio of sums.
    """
    s = _scores_2d(scores)
    shape = s.shape
    if sp.issparse(test_matrix):
        x = sp.csr_matrix(test_matrix, dtype=float)
        x.eliminate_zeros()
        if x.shape != shape:
            raise ValueError(f"test_matrix has shape {x.shape} but scores have shape {shape}")
        if x.nnz and (x.data < 0).any():
            raise ValueError("test_matrix weights must be non-negative")
        if np.isnan(x.data).any():
            raise ValueError("test_matrix contains NaN")
    else:
        x = np.asarray(test_matrix, dtype=float)
        if x.shape != shape:
            raise ValueError(f"test_matrix has shape {x.shape} but scores have shape {shape}")
        if np.isnan(x).any():
            raise ValueError("test_matrix contains NaN")
        if (x < 0).any():
            raise ValueError("test_matrix weights must be non-negative")
    excl = None if exclude is None else _matrix(exclude, shape, "exclude")
    num = den = 0.0
    num_u, den_u = np.zeros(shape[0]), np.zeros(shape[0])
    for lo, hi in _blocks(*shape):
        xb = _rows(x, lo, hi) if sp.issparse(x) else x[lo:hi]
        users, items = np.nonzero(xb)
        if users.size == 0:
            continue
        w = xb[users, items]
        avail = None if excl is None else ~_rows(excl, lo, hi)
        if avail is not None and not avail[users, items].all():
            raise ValueError("a test entry of test_matrix is also in exclude")
        n_avail = np.full(hi - lo, shape[1]) if avail is None else avail.sum(axis=1)
        if (n_avail[users] < 2).any():
            raise ValueError("a percentile rank needs at least two ranked items per user")
        greater, tied = _desc_tie_counts(s[lo:hi], avail)
        position = greater[users, items] + 0.5 * (tied[users, items] - 1)
        rank = position / (n_avail[users] - 1)
        num += float(np.sum(w * rank))
        den += float(np.sum(w))
        num_u[lo:hi] = np.bincount(users, weights=w * rank, minlength=hi - lo)
        den_u[lo:hi] = np.bincount(users, weights=w, minlength=hi - lo)
    value = num / den if den > 0 else math.nan
    return (value, (num_u, den_u)) if by_user else value
