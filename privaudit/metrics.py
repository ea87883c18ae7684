"""Evaluation metrics: utility of the recommenders and success of the attacks.

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

__all__ = [
    "rmse",
    "mae",
    "hit_ratio_at_k",
    "ndcg_at_k_loo",
    "ranking_metrics_at_k",
    "ranking_metrics_at_k_factored",
    "mean_rank",
    "map_at_k",
    "reconstruction_accuracy",
    "relative_error",
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


# --------------------------------------------------------------------------- helpers


def _is_ragged_sequence(x: Any) -> bool:
    """True for a list/tuple of per-user arrays (anything with ndim >= 1 inside)."""
    return isinstance(x, (list, tuple)) and len(x) > 0 and any(np.ndim(e) >= 1 for e in x)


def _flat(x: Any, name: str, dtype: Any = float) -> tuple[np.ndarray, list[int] | None]:
    """Flatten an array or a list of per-user arrays; also return the per-part sizes."""
    if sp.issparse(x):
        raise ValueError(f"{name} must be a dense array or a list of arrays, not a sparse matrix")
    if _is_ragged_sequence(x):
        parts = [np.asarray(e, dtype=dtype).ravel() for e in x]
        return np.concatenate(parts), [p.size for p in parts]
    return np.asarray(x, dtype=dtype).ravel(), None


def _paired(a: Any, b: Any, name_a: str, name_b: str) -> tuple[np.ndarray, np.ndarray]:
    """Two equally shaped inputs (arrays, or lists of per-user arrays) as flat float arrays."""
    if _is_ragged_sequence(a) or _is_ragged_sequence(b):
        fa, sa = _flat(a, name_a)
        fb, sb = _flat(b, name_b)
        if sa is not None and sb is not None and sa != sb:
            raise ValueError(f"{name_a} and {name_b} have different per-user lengths")
        if fa.size != fb.size:
            raise ValueError(f"{name_a} has {fa.size} values but {name_b} has {fb.size}")
    else:
        aa = np.asarray(a, dtype=float)
        ab = np.asarray(b, dtype=float)
        if aa.shape != ab.shape:
            raise ValueError(f"{name_a} has shape {aa.shape} but {name_b} has shape {ab.shape}")
        fa, fb = aa.ravel(), ab.ravel()
    if fa.size == 0:
        raise ValueError(f"{name_a} and {name_b} are empty")
    return fa, fb


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return int(k)


def _stats():
    """``scipy.stats``, imported on first use (importing it slows every command's start)."""
    from scipy import stats

    return stats


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
    a, b = _paired(y_true, y_pred, "y_true", "y_pred")
    return float(np.sqrt(np.mean((a - b) ** 2)))


def mae(y_true: Any, y_pred: Any) -> float:
    """Mean absolute error, ``mean(|y_true - y_pred|)``, in rating units. Inputs as :func:`rmse`."""
    a, b = _paired(y_true, y_pred, "y_true", "y_pred")
    return float(np.mean(np.abs(a - b)))


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


def hit_ratio_at_k(scores: Any, target_index: Any, k: int = 10) -> float:
    """Leave-one-out hit ratio HR@k (FedNCF paper §4.1), averaged over users, in [0, 1].

    ``scores``: (n_users, n_candidates) float -- each row scores the user's held-out item and
    its sampled negatives (fedncf: 1 positive + 100 negatives); a 1-D row is one user.
    ``target_index``: (n_users,) int, the column of the held-out item in each row.

    The 0-based rank of the target is the number of *other* candidates whose score is
    ``>=`` the target's: ties are broken pessimistically (a tied negative counts as ranked
    above the target), so a constant scorer gets HR = 0, never a lucky hit.
    HR_u = 1 if rank_u < k else 0; HR@k = mean_u HR_u.
    """
    k = _check_k(k)
    ranks = _loo_ranks(scores, target_index)
    return float(np.mean(ranks < k))


def ndcg_at_k_loo(scores: Any, target_index: Any, k: int = 10) -> float:
    """Leave-one-out NDCG@k (FedNCF paper §4.1), averaged over users, in [0, 1].

    Inputs and the pessimistic tie rule as :func:`hit_ratio_at_k`. With one relevant item the
    ideal DCG is 1, so NDCG_u = 1 / log2(rank_u + 2) if rank_u < k else 0 (rank 0-based:
    the top position gives 1, the second 1/log2(3)).
    """
    k = _check_k(k)
    ranks = _loo_ranks(scores, target_index)
    gains = np.where(ranks < k, 1.0 / np.log2(ranks + 2.0), 0.0)
    return float(np.mean(gains))


# --------------------------------------------------------------------------- top-k lists


def ranking_metrics_at_k(scores: Any, relevant: Any, k: int = 10, exclude: Any = None) -> dict[str, float]:
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

    Returns ``{"ndcg", "precision", "recall", "f1"}``, all floats in [0, 1].
    """
    s = _scores_2d(scores)
    return _ranking_metrics(lambda lo, hi: s[lo:hi], s.shape, relevant, k, exclude)


def ranking_metrics_at_k_factored(
    user_factors: Any, item_factors: Any, relevant: Any, k: int = 10, exclude: Any = None
) -> dict[str, float]:
    """:func:`ranking_metrics_at_k` of ``scores = user_factors @ item_factors.T`` without the
    full score matrix: scores are computed, checked and ranked one block of users at a time
    (peak memory about one block of ``2**22`` scores plus the inputs).

    ``user_factors``: (n_users, d) float; ``item_factors``: (n_items, d) float. Same values,
    bit for bit, as ``ranking_metrics_at_k(user_factors @ item_factors.T, ...)`` when the row
    blocks of the product equal the rows of the full product (true of numpy's float64 matmul).
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

    return _ranking_metrics(block, shape, relevant, k, exclude)


def _ranking_metrics(score_rows, shape: tuple[int, int], relevant: Any, k: Any, exclude: Any) -> dict[str, float]:
    """Body of :func:`ranking_metrics_at_k`; ``score_rows(lo, hi)`` gives score rows lo:hi."""
    k = _check_k(k)
    rel = _matrix(relevant, shape, "relevant")
    excl = None if exclude is None else _matrix(exclude, shape, "exclude")
    n_rel = _row_counts(rel)
    kk = min(k, shape[1])
    discounts = 1.0 / np.log2(np.arange(kk) + 2.0)
    ideal = np.cumsum(discounts)

    tot = {"ndcg": 0.0, "precision": 0.0, "recall": 0.0}
    n_users = 0
    for hits, n_rec, nr in _relevant_user_hits(score_rows, shape, rel, excl, n_rel, k):
        tp = hits.sum(axis=1)
        dcg = hits @ discounts
        idcg = ideal[np.minimum(kk, nr) - 1]
        tot["ndcg"] += float(np.sum(dcg / idcg))
        prec = np.divide(tp, n_rec, out=np.zeros(len(tp)), where=n_rec > 0)
        tot["precision"] += float(np.sum(prec))
        tot["recall"] += float(np.sum(tp / nr))
        n_users += len(nr)
    if n_users == 0:
        return {"ndcg": math.nan, "precision": math.nan, "recall": math.nan, "f1": math.nan}
    out = {name: value / n_users for name, value in tot.items()}
    p, r = out["precision"], out["recall"]
    out["f1"] = 2.0 * p * r / (p + r) if p + r > 0 else 0.0
    return {key: float(out[key]) for key in ("ndcg", "precision", "recall", "f1")}


def _relevant_user_hits(score_rows, shape: tuple[int, int], rel: Any, excl: Any, n_rel: np.ndarray, k: int):
    """Per block of users with at least one relevant item: ``(hits, n_recommended, n_relevant)``.

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
        return hits, n_rec, nr[keep]

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


def map_at_k(scores: Any, test_matrix: Any, k: int = 10, exclude: Any = None) -> float:
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
    for hits, _, nr in _relevant_user_hits(lambda lo, hi: s[lo:hi], shape, rel, excl, n_rel, k):
        prec = np.cumsum(hits, axis=1) / positions
        total += float(np.sum((prec * hits).sum(axis=1) / nr))
        n_users += len(nr)
    return total / n_users if n_users else math.nan


def mean_rank(scores: Any, test_matrix: Any, exclude: Any = None) -> float:
    """Weighted mean percentile rank, DP-prototypes paper eq. 4 (Hu, Koren & Volinsky 2008).

    ``scores``: (n_users, n_items) float. ``test_matrix``: (n_users, n_items), dense or scipy
    sparse, non-negative; its nonzero entries x_ui form the test set T and are the weights.
    ``exclude``: optional bool mask of items left out of every ranking (e.g. training items);
    a test entry may not be excluded.

    rank_ui is the percentile of item i in user u's list of the n_u ranked items:
    ``rank_ui = (#{j: s_uj > s_ui} + 0.5 #{j != i: s_uj = s_ui}) / (n_u - 1)`` -- 0 = top,
    1 = bottom, ties share the average position, so a constant or random scorer gives 0.5.
    Eq. 4: ``mean_rank = sum_{(u,i) in T} x_ui rank_ui / sum_{(u,i) in T} x_ui`` (lower is
    better; >= 0.5 is no better than random). NaN if T is empty.
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
    return num / den if den > 0 else math.nan


# --------------------------------------------------------------------------- attacks


def reconstruction_accuracy(true: Any, guess: Any) -> float:
    """Attack accuracy, PrivMVMF paper eq. 43: the fraction of entries guessed exactly.

    ``accuracy = sum_u sum_i 1[guess_ui == true_ui] / sum_u n_u`` -- pooled over all entries
    of all users (not a mean of per-user accuracies). The caller clips and rounds the
    estimates first (ratings to the rating range, attribute dummies to [0, 1]); comparison is
    exact. ``true``/``guess``: arrays of the same shape, or lists of per-user 1-D arrays
    (concatenated; per-user lengths must agree). A NaN guess counts as wrong. In [0, 1].
    """
    a, b = _paired(true, guess, "true", "guess")
    return float(np.mean(a == b))


def relative_error(X: Any, X_hat: Any, mask: Any = None, squared: bool = True) -> float:
    """Relative reconstruction error, FedSPLIT paper eq. 4, restricted to observed entries.

    ``X``: (n, m) true matrix (dense or scipy sparse); ``X_hat``: (n, m) reconstruction;
    ``mask``: optional (n, m) bool (dense or sparse) of the entries to score -- by default the
    nonzero entries of X (the observed ratings, as in FedSPLIT paper §4.4). With Ω the mask:

        RE = ||(X - X_hat)_Ω||_F^2 / ||X_Ω||_F^2          (eq. 4 -- squared norms)

    ``squared=False`` returns the ratio of the (unsquared) Frobenius norms, i.e. sqrt(RE).
    Dimensionless, >= 0; 0 = perfect. Raises ValueError if Ω is empty or ||X_Ω|| = 0.
    """
    Xd = np.asarray(X.toarray() if sp.issparse(X) else X, dtype=float)
    Xh = np.asarray(X_hat.toarray() if sp.issparse(X_hat) else X_hat, dtype=float)
    if Xd.shape != Xh.shape:
        raise ValueError(f"X has shape {Xd.shape} but X_hat has shape {Xh.shape}")
    if Xd.size == 0:
        raise ValueError("X is empty")
    if mask is None:
        m = Xd != 0
    else:
        mm = mask.toarray() if sp.issparse(mask) else np.asarray(mask)
        if mm.shape != Xd.shape:
            raise ValueError(f"mask has shape {mm.shape} but X has shape {Xd.shape}")
        m = mm != 0
    if not m.any():
        raise ValueError("no observed entries to score (empty mask)")
    denom = float(np.sum(Xd[m] ** 2))
    if denom == 0.0:
        raise ValueError("X is zero on the scored entries; the relative error is undefined")
    re = float(np.sum((Xd[m] - Xh[m]) ** 2)) / denom
    return re if squared else math.sqrt(re)


def auc(labels: Any, scores: Any) -> float:
    """Area under the ROC curve via the Mann-Whitney U statistic, in [0, 1].

    ``labels``: (n,) binary (bool or 0/1), 1 = positive (e.g. member, real rating).
    ``scores``: (n,) float, higher = more likely positive. With average ranks R (ties share
    the mean rank, so a tied positive/negative pair counts 1/2):
    ``AUC = (sum_{positives} R_i - n_pos (n_pos + 1) / 2) / (n_pos n_neg)``.
    0.5 = chance. Raises ValueError if a class is missing or scores contain NaN.
    """
    y = np.asarray(labels).ravel()
    s = np.asarray(scores, dtype=float).ravel()
    if y.size == 0:
        raise ValueError("labels are empty")
    if y.shape != s.shape:
        raise ValueError(f"labels have {y.size} values but scores have {s.size}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    if y.dtype != bool:
        if not np.isin(y, (0, 1)).all():
            raise ValueError("labels must be binary (bool or 0/1)")
        y = y.astype(bool)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both positive and negative labels")
    ranks = _stats().rankdata(s, method="average")
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


#: False-positive rates at which :func:`roc_summary` reports the true-positive rate
#: (Carlini et al., "Membership Inference Attacks From First Principles", IEEE S&P 2022).
LOW_FPRS: tuple[float, ...] = (0.01, 0.001)


def roc_summary(labels: Any, scores: Any, fprs: tuple[float, ...] = LOW_FPRS, max_points: int = 200) -> dict[str, Any]:
    """ROC curve, AUC and TPR at low false-positive rates of per-record decisions.

    ``labels``: (n,) binary, 1 = positive; ``scores``: (n,) finite floats, higher = positive.
    Uses ``sklearn.metrics.roc_curve``. Returns ``{"auc", "tpr@<f>", ..., "n_pos", "n_neg",
    "fpr", "tpr"}`` where ``tpr@0.01`` is the largest TPR at FPR <= 0.01 and is NaN when there
    are fewer than ``1 / f`` negatives (the FPR cannot be resolved: ``"fpr_floor"`` = 1/n_neg
    says the smallest non-zero FPR measurable). ``fpr``/``tpr`` are the curve, thinned to at
    most ``max_points`` points (keeping the ends and the low-FPR part), as lists for JSON.
    A single-class input gives NaN for AUC and every TPR and an empty curve.
    """
    from sklearn.metrics import roc_curve

    y = np.asarray(labels).ravel().astype(bool)
    s = np.asarray(scores, dtype=float).ravel()
    if y.shape != s.shape:
        raise ValueError(f"labels have {y.size} values but scores have {s.size}")
    if not np.isfinite(s).all():
        raise ValueError("scores must be finite")
    n_pos = int(y.sum())
    n_neg = int(y.size - n_pos)
    out: dict[str, Any] = {"n_pos": n_pos, "n_neg": n_neg, "fpr_floor": (1.0 / n_neg) if n_neg else math.nan}
    if n_pos == 0 or n_neg == 0:
        out.update({"auc": math.nan, **{f"tpr@{f:g}": math.nan for f in fprs}, "fpr": [], "tpr": []})
        return out
    fpr, tpr, _ = roc_curve(y, s)
    out["auc"] = auc(y, s)
    for f in fprs:
        out[f"tpr@{f:g}"] = float(tpr[fpr <= f].max()) if n_neg * f >= 1 else math.nan
    if fpr.size > max_points:
        # keep the low-FPR end (log axes) and a uniform thinning of the rest
        keep = np.unique(
            np.concatenate(
                [
                    np.geomspace(1, fpr.size - 1, max_points // 2).astype(int),
                    np.linspace(0, fpr.size - 1, max_points // 2).astype(int),
                ]
            )
        )
        fpr, tpr = fpr[keep], tpr[keep]
    out["fpr"] = [float(v) for v in fpr]
    out["tpr"] = [float(v) for v in tpr]
    return out


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval of a binomial proportion ``k / n``.

    Each side holds with probability ``(1 + confidence) / 2``; ``n = 0`` gives ``(0, 1)``.
    """
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    a = (1.0 - confidence) / 2.0
    lo = 0.0 if k == 0 else float(_stats().beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(_stats().beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def _threshold_epsilons(
    s: np.ndarray, y: np.ndarray, delta: float, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct threshold of ``s`` (test "positive iff score >= threshold"): the two
    Clopper-Pearson epsilon bounds (TPR side, TNR side) and the thresholds."""
    n_pos = int(y.sum())
    n_neg = int(y.size - n_pos)
    order = np.argsort(-s, kind="stable")
    ss, yy = s[order], y[order]
    tp = np.cumsum(yy)
    fp = np.cumsum(~yy)
    last = np.r_[ss[1:] != ss[:-1], True]  # thresholds between distinct scores
    tp, fp, thr = tp[last], fp[last], ss[last]
    a = (1.0 - confidence) / 2.0  # a union bound over the two intervals of one test
    beta = _stats().beta
    tpr_lo = np.where(tp == 0, 0.0, beta.ppf(a, np.maximum(tp, 1), n_pos - tp + 1))
    fpr_hi = np.where(fp == n_neg, 1.0, beta.ppf(1 - a, fp + 1, np.maximum(n_neg - fp, 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        e1 = np.log(np.maximum(tpr_lo - delta, 0.0) / fpr_hi)
        e2 = np.log(np.maximum(1.0 - fpr_hi - delta, 0.0) / (1.0 - tpr_lo))
    return np.nan_to_num(e1, nan=-np.inf, posinf=np.inf), np.nan_to_num(e2, nan=-np.inf, posinf=np.inf), thr


def empirical_epsilon(
    labels: Any, scores: Any, delta: float = 0.0, confidence: float = 0.95, seed: Any = 0
) -> dict[str, float]:
    """Lower bound on the epsilon of a DP mechanism from an attack's per-record decisions.

    The test "positive iff score >= threshold" has TPR and FPR; an (epsilon, delta)-DP mechanism
    forces ``TPR <= e^eps FPR + delta`` and ``1 - FPR <= e^eps (1 - TPR) + delta`` (Kairouz et
    al., ICML 2015). The records are split at random in two halves (``seed``: an int, a
    SeedSequence or a Generator): on the first the threshold and the inequality with the
    largest Clopper-Pearson bound are chosen, on the second that single test is scored, with
    Clopper-Pearson bounds at ``confidence`` (lower on TPR and 1-FPR, upper on FPR and 1-TPR,
    each at (1 - confidence) / 2): ``ln((TPR_lo - delta) / FPR_hi)`` or ``ln((1 - FPR_hi -
    delta) / (1 - TPR_lo))`` (Jagielski et al., NeurIPS 2020; Nasr et al., IEEE S&P 2021).
    Choosing the threshold on the records it is scored on would overstate the bound.

    Returns ``{"epsilon_lb", "threshold", "side", "tp", "fp", "n_pos", "n_neg", "n_pos_scored",
    "n_neg_scored"}``: ``side`` "tpr" (first inequality) or "tnr"; ``tp``/``fp`` counted on the
    scored half; ``n_pos``/``n_neg`` over all records. ``epsilon_lb`` is 0.0 when the chosen
    test gives no evidence and NaN when a class has fewer than two records.
    """
    y = np.asarray(labels).ravel().astype(bool)
    s = np.asarray(scores, dtype=float).ravel()
    if y.size != s.size:
        raise ValueError(f"empirical_epsilon: {y.size} labels but {s.size} scores")
    n_pos = int(y.sum())
    n_neg = int(y.size - n_pos)
    out: dict[str, Any] = {
        "epsilon_lb": math.nan,
        "threshold": math.nan,
        "side": "tpr",
        "tp": 0,
        "fp": 0,
        "n_pos": n_pos,
        "n_neg": n_neg,
        "n_pos_scored": 0,
        "n_neg_scored": 0,
    }
    if n_pos < 2 or n_neg < 2:
        return out
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    # a stratified random half: each class split in two, so both halves hold both classes
    choose = np.zeros(y.size, dtype=bool)
    for cls in (True, False):
        idx = np.flatnonzero(y == cls)
        choose[rng.permutation(idx)[: idx.size // 2]] = True
    e1, e2, thr = _threshold_epsilons(s[choose], y[choose], delta, confidence)
    k1, k2 = int(np.argmax(e1)), int(np.argmax(e2))
    side, threshold = ("tpr", thr[k1]) if e1[k1] >= e2[k2] else ("tnr", thr[k2])
    ys, sc = y[~choose], s[~choose]
    pos, neg = int(ys.sum()), int(ys.size - ys.sum())
    tp = int(np.sum(ys & (sc >= threshold)))
    fp = int(np.sum(~ys & (sc >= threshold)))
    a = (1.0 - confidence) / 2.0
    beta = _stats().beta
    tpr_lo = 0.0 if tp == 0 else float(beta.ppf(a, tp, pos - tp + 1))
    fpr_hi = 1.0 if fp == neg else float(beta.ppf(1 - a, fp + 1, neg - fp))
    with np.errstate(divide="ignore", invalid="ignore"):
        if side == "tpr":
            e = np.log(np.float64(max(tpr_lo - delta, 0.0)) / np.float64(fpr_hi))
        else:
            e = np.log(np.float64(max(1.0 - fpr_hi - delta, 0.0)) / np.float64(1.0 - tpr_lo))
    e = float(e) if not np.isnan(e) else -math.inf
    out.update(
        {
            "epsilon_lb": max(0.0, e),
            "threshold": float(threshold),
            "side": side,
            "tp": tp,
            "fp": fp,
            "n_pos_scored": pos,
            "n_neg_scored": neg,
        }
    )
    return out


def mean_ci95(values: Any) -> tuple[float, float]:
    """Mean and half-width of the 95 % confidence interval of the mean (Student t).

    ``values``: array-like of any shape (e.g. one metric over seeds). NaNs are ignored.
    ``half_width = t_{0.975, n-1} * std(ddof=1) / sqrt(n)`` (scipy.stats.t); the interval is
    ``mean ± half_width``. One finite value -> half_width 0.0; all NaN -> (nan, nan).
    Raises ValueError for an empty input.
    """
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0:
        raise ValueError("mean_ci95 of an empty input")
    v = v[~np.isnan(v)]
    n = v.size
    if n == 0:
        return math.nan, math.nan
    mean = float(np.mean(v))
    if n == 1:
        return mean, 0.0
    half = float(_stats().t.ppf(0.975, n - 1) * np.std(v, ddof=1) / math.sqrt(n))
    return mean, half


def uniform_guess_accuracy(domain_size: Any) -> float:
    """Expected accuracy of guessing uniformly at random over a finite value domain.

    ``domain_size``: int >= 1 (e.g. 5 for ratings 1..5, 2 for a 0/1 attribute dummy), or an
    array of per-entry domain sizes, in which case the mean of ``1 / d`` (the expected
    fraction of entries guessed right). The random-guess baseline of PrivMVMF paper §6.2.
    """
    d = np.asarray(domain_size, dtype=float)
    if d.size == 0:
        raise ValueError("domain_size is empty")
    if np.isnan(d).any() or (d < 1).any() or (d != np.round(d)).any():
        raise ValueError(f"domain sizes must be integers >= 1, got {domain_size!r}")
    return float(np.mean(1.0 / d))


def majority_guess_accuracy(values: Any, guess: Any = None) -> float:
    """Accuracy of always guessing one value (the majority-class baseline).

    ``values``: the true values (array of any shape, or a list of per-user arrays).
    ``guess``: the constant guessed; by default the most frequent value of ``values`` itself
    (the best constant guess in hindsight, an upper bound for any constant strategy). Pass a
    guess learned elsewhere (e.g. the majority of an auxiliary set) for an honest baseline.
    Returns ``#{values == guess} / #values`` in [0, 1].
    """
    v, _ = _flat(values, "values", dtype=None)
    if v.size == 0:
        raise ValueError("values are empty")
    if guess is not None:
        return float(np.mean(v == guess))
    _, counts = np.unique(v, return_counts=True)
    return float(counts.max() / v.size)
