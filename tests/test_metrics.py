"""Tests for privaudit.metrics: every expected value is worked out by hand in the test."""

import math

import numpy as np
import pytest
import scipy.sparse as sp

from privaudit import metrics as M
from privaudit.metrics import (
    auc,
    hit_ratio_at_k,
    mae,
    majority_guess_accuracy,
    map_at_k,
    mean_ci95,
    mean_rank,
    ndcg_at_k_loo,
    ranking_metrics_at_k,
    ranking_metrics_at_k_factored,
    reconstruction_accuracy,
    relative_error,
    rmse,
    uniform_guess_accuracy,
)

L2 = math.log2
approx = pytest.approx


# ------------------------------------------------------------------ rmse / mae


def test_rmse_mae_by_hand():
    y, p = [1.0, 2.0, 3.0], [2.0, 2.0, 5.0]  # errors 1, 0, 2
    assert rmse(y, p) == approx(math.sqrt((1 + 0 + 4) / 3))
    assert mae(y, p) == approx((1 + 0 + 2) / 3)


def test_rmse_mae_lists_of_per_user_arrays():
    y = [np.array([1.0, 2.0]), np.array([3.0])]
    p = [np.array([2.0, 2.0]), np.array([5.0])]
    assert rmse(y, p) == approx(math.sqrt(5 / 3))
    assert mae(y, p) == approx(1.0)


def test_rmse_errors():
    with pytest.raises(ValueError):
        rmse([], [])
    with pytest.raises(ValueError):
        rmse([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError):
        mae(np.ones((2, 3)), np.ones((3, 2)))  # no silent broadcasting/reshaping
    with pytest.raises(ValueError):
        rmse([np.ones(2), np.ones(1)], [np.ones(1), np.ones(2)])  # per-user lengths differ
    assert math.isnan(rmse([1.0, 2.0], [1.0, np.nan]))  # NaN propagates, does not raise


# ------------------------------------------------------------------ leave-one-out HR / NDCG

LOO_SCORES = np.array(
    [
        [0.9, 0.5, 0.7, 0.1],  # target col 0: nobody above -> rank 0
        [0.2, 0.8, 0.8, 0.3],  # target col 1: col 2 ties -> pessimistic rank 1
        [0.1, 0.2, 0.3, 0.4],  # target col 0: three above -> rank 3
    ]
)
LOO_TARGET = np.array([0, 1, 0])


def test_hit_ratio_by_hand():
    assert hit_ratio_at_k(LOO_SCORES, LOO_TARGET, k=1) == approx((1 + 0 + 0) / 3)
    assert hit_ratio_at_k(LOO_SCORES, LOO_TARGET, k=2) == approx((1 + 1 + 0) / 3)
    assert hit_ratio_at_k(LOO_SCORES, LOO_TARGET, k=4) == approx(1.0)


def test_ndcg_loo_by_hand():
    assert ndcg_at_k_loo(LOO_SCORES, LOO_TARGET, k=2) == approx((1 / L2(2) + 1 / L2(3) + 0) / 3)
    assert ndcg_at_k_loo(LOO_SCORES, LOO_TARGET, k=4) == approx((1 / L2(2) + 1 / L2(3) + 1 / L2(5)) / 3)


def test_loo_ties_pessimistic_constant_scores():
    s = np.zeros((2, 101))  # 1 positive + 100 negatives, all tied -> rank 100
    t = np.array([0, 57])
    assert hit_ratio_at_k(s, t, k=10) == 0.0
    assert ndcg_at_k_loo(s, t, k=10) == 0.0
    assert hit_ratio_at_k(s, t, k=101) == 1.0
    assert ndcg_at_k_loo(s, t, k=101) == approx(1 / L2(100 + 2))


def test_loo_single_user_row():
    assert hit_ratio_at_k(np.array([0.1, 0.9, 0.5]), 1, k=1) == 1.0


def test_loo_errors():
    with pytest.raises(ValueError):
        hit_ratio_at_k(np.zeros((0, 5)), np.zeros(0, dtype=int))
    with pytest.raises(ValueError):
        hit_ratio_at_k(LOO_SCORES, np.array([0, 1, 4]))  # out of range
    with pytest.raises(ValueError):
        hit_ratio_at_k(LOO_SCORES, np.array([0.0, 1.0, 0.0]))  # not integers
    with pytest.raises(ValueError):
        hit_ratio_at_k(LOO_SCORES, np.array([0, 1]))  # wrong length
    with pytest.raises(ValueError):
        ndcg_at_k_loo(LOO_SCORES, LOO_TARGET, k=0)
    bad = LOO_SCORES.copy()
    bad[0, 2] = np.nan
    with pytest.raises(ValueError):
        ndcg_at_k_loo(bad, LOO_TARGET)


# ------------------------------------------------------------------ top-k ranking metrics

RANK_SCORES = np.array(
    [
        [0.9, 0.8, 0.7, 0.6, 0.5],  # list @3: items 0, 1, 2
        [0.1, 0.2, 0.3, 0.4, 0.5],  # list @3: items 4, 3, 2
        [0.3, 0.1, 0.2, 0.5, 0.4],  # no relevant item: skipped
    ]
)
RANK_REL = np.array(
    [
        [1, 0, 1, 0, 0],  # hits [1, 0, 1]: TP 2, |Rel| 2
        [1, 1, 0, 0, 1],  # hits [1, 0, 0]: TP 1, |Rel| 3
        [0, 0, 0, 0, 0],
    ],
    dtype=bool,
)


def _expected_rank_metrics():
    ndcg0 = (1 / L2(2) + 1 / L2(4)) / (1 / L2(2) + 1 / L2(3))
    ndcg1 = (1 / L2(2)) / (1 / L2(2) + 1 / L2(3) + 1 / L2(4))
    p = (2 / 3 + 1 / 3) / 2  # = 1/2
    r = (2 / 2 + 1 / 3) / 2  # = 2/3
    return {
        "ndcg": (ndcg0 + ndcg1) / 2,
        "precision": p,
        "recall": r,
        "f1": 2 * p * r / (p + r),  # = 4/7, harmonic mean of the AVERAGED P and R
    }


def test_ranking_metrics_by_hand():
    got = ranking_metrics_at_k(RANK_SCORES, RANK_REL, k=3)
    exp = _expected_rank_metrics()
    assert set(got) == {"ndcg", "precision", "recall", "f1"}
    for key in exp:
        assert got[key] == approx(exp[key]), key
    assert got["f1"] == approx(4 / 7)
    # the mean of per-user F1 would be (0.8 + 1/3) / 2 = 0.5667: not what privmvmf eq. 53 uses
    assert got["f1"] != approx((2 * (2 / 3) * 1 / (2 / 3 + 1) + 1 / 3) / 2)


def test_ranking_metrics_sparse_inputs_match_dense():
    dense = ranking_metrics_at_k(RANK_SCORES, RANK_REL, k=3)
    for conv in (sp.csr_matrix, sp.csc_matrix, sp.coo_matrix, sp.csr_array):
        got = ranking_metrics_at_k(RANK_SCORES, conv(RANK_REL), k=3)
        assert got == approx(dense)
    # a numeric relevance matrix: nonzero = relevant
    assert ranking_metrics_at_k(RANK_SCORES, RANK_REL.astype(float), k=3) == approx(dense)


def test_ranking_metrics_exclude():
    s = RANK_SCORES[:1]
    rel = RANK_REL[:1]
    excl = np.array([[1, 0, 0, 0, 0]], dtype=bool)  # item 0 (relevant) was a training item
    got = ranking_metrics_at_k(s, rel, k=3, exclude=excl)
    # list: items 1, 2, 3 -> hits [0, 1, 0]; item 0 still counts as relevant (|Rel| = 2)
    assert got["precision"] == approx(1 / 3)
    assert got["recall"] == approx(1 / 2)
    assert got["ndcg"] == approx((1 / L2(3)) / (1 / L2(2) + 1 / L2(3)))
    assert got["f1"] == approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    assert ranking_metrics_at_k(s, rel, k=3, exclude=sp.csr_matrix(excl)) == approx(got)


def test_ranking_metrics_fewer_candidates_than_k():
    s = np.array([[0.9, 0.8, 0.7, 0.6, 0.5]])
    rel = np.array([[0, 0, 1, 0, 1]], dtype=bool)
    excl = np.array([[1, 1, 0, 1, 0]], dtype=bool)  # only items 2 and 4 can be recommended
    got = ranking_metrics_at_k(s, rel, k=3, exclude=excl)
    assert got["precision"] == approx(2 / 2)  # TP / list length (2), not / k
    assert got["recall"] == approx(2 / 2)
    assert got["ndcg"] == approx(1.0)
    # k larger than the number of items
    got = ranking_metrics_at_k(s, rel, k=10)
    assert got["precision"] == approx(2 / 5)
    assert got["recall"] == approx(1.0)
    assert got["ndcg"] == approx((1 / L2(4) + 1 / L2(6)) / (1 / L2(2) + 1 / L2(3)))


def test_ranking_metrics_ties_are_pessimistic():
    s = np.full((1, 5), 0.5)
    rel = np.array([[0, 1, 0, 0, 1]], dtype=bool)
    got = ranking_metrics_at_k(s, rel, k=2)
    assert got == {"ndcg": 0.0, "precision": 0.0, "recall": 0.0, "f1": 0.0}
    # k = 4: order 0, 2, 3 (non-relevant first), then 1 -> hits [0, 0, 0, 1]
    got = ranking_metrics_at_k(s, rel, k=4)
    assert got["precision"] == approx(1 / 4)
    assert got["recall"] == approx(1 / 2)
    assert got["ndcg"] == approx((1 / L2(5)) / (1 / L2(2) + 1 / L2(3)))


def test_ranking_metrics_no_relevant_users_is_nan():
    got = ranking_metrics_at_k(RANK_SCORES, np.zeros_like(RANK_REL), k=3)
    assert all(math.isnan(v) for v in got.values())


def test_ranking_metrics_errors():
    with pytest.raises(ValueError):
        ranking_metrics_at_k(np.zeros((0, 0)), np.zeros((0, 0), dtype=bool))
    with pytest.raises(ValueError):
        ranking_metrics_at_k(RANK_SCORES, RANK_REL[:2])  # shape mismatch
    with pytest.raises(ValueError):
        ranking_metrics_at_k(RANK_SCORES, RANK_REL, exclude=np.zeros((3, 4), bool))
    with pytest.raises(ValueError):
        ranking_metrics_at_k(RANK_SCORES, RANK_REL, k=0)
    with pytest.raises(ValueError):
        ranking_metrics_at_k(RANK_SCORES[0], RANK_REL[0])  # 1-D scores


def _reference_ranking(scores, rel, k, excl):
    """Straightforward per-user loop, same definitions, for the randomized cross-check."""
    nd, pr, rc, ap, n = 0.0, 0.0, 0.0, 0.0, 0
    for u in range(scores.shape[0]):
        r = rel[u]
        if r.sum() == 0:
            continue
        cand = [i for i in range(scores.shape[1]) if not excl[u, i]]
        cand.sort(key=lambda i: (-scores[u, i], bool(r[i]), i))
        lst = cand[:k]
        hits = [bool(r[i]) for i in lst]
        tp = sum(hits)
        dcg = sum(1 / L2(j + 2) for j, h in enumerate(hits) if h)
        idcg = sum(1 / L2(j + 2) for j in range(min(k, int(r.sum()))))
        nd += dcg / idcg
        pr += tp / len(lst) if lst else 0.0
        rc += tp / r.sum()
        ap += sum(sum(hits[: j + 1]) / (j + 1) for j, h in enumerate(hits) if h) / r.sum()
        n += 1
    return nd / n, pr / n, rc / n, ap / n


def test_ranking_blocks_and_random_cross_check(monkeypatch):
    rng = np.random.default_rng(0)
    s = rng.integers(0, 4, size=(37, 23)).astype(float)  # many ties on purpose
    rel = rng.random((37, 23)) < 0.2
    excl = (rng.random((37, 23)) < 0.3) & ~rel
    nd, pr, rc, ap = _reference_ranking(s, rel, 5, excl)
    full = ranking_metrics_at_k(s, rel, k=5, exclude=excl)
    assert full["ndcg"] == approx(nd)
    assert full["precision"] == approx(pr)
    assert full["recall"] == approx(rc)
    assert map_at_k(s, rel, k=5, exclude=excl) == approx(ap)
    mr = mean_rank(s, rel.astype(float), exclude=excl)
    # reference mean rank: loop over the test entries, midrank among the available items
    ranks = []
    for u, i in zip(*np.nonzero(rel)):
        avail = ~excl[u]
        above = np.sum(avail & (s[u] > s[u, i]))
        ties = np.sum(avail & (s[u] == s[u, i])) - 1
        ranks.append((above + 0.5 * ties) / (avail.sum() - 1))
    assert mr == approx(np.mean(ranks))
    monkeypatch.setattr(M, "_BLOCK_ELEMENTS", 50)  # 2 users per block
    blocked = ranking_metrics_at_k(s, sp.csr_matrix(rel), k=5, exclude=sp.csr_matrix(excl))
    assert blocked == approx(full)
    assert map_at_k(s, rel, k=5, exclude=excl) == approx(ap)
    assert mean_rank(s, sp.csr_matrix(rel.astype(float)), exclude=excl) == approx(mr)


def _tied_case(rng, n_users=60, n_items=300, levels=120):
    """Integer scores (ties at every top-k boundary), relevance, exclusions; some users have
    almost every item excluded (fewer than k left) and some scores are -inf."""
    s = rng.integers(0, levels, size=(n_users, n_items)).astype(float)
    s[rng.random(s.shape) < 0.02] = -np.inf
    rel = rng.random(s.shape) < 0.1
    excl = rng.random(s.shape) < 0.3
    excl[:3] = rng.random((3, n_items)) < 0.99
    return s, rel, excl


@pytest.mark.parametrize("n_items", [300, 6000])  # 6000: the threshold comes from every 8th column
@pytest.mark.parametrize("kk", [1, 5, 10, 40])
@pytest.mark.parametrize("with_excl", [False, True])
def test_topk_selection_matches_full_sort_order(kk, with_excl, n_items):
    rng = np.random.default_rng(kk)
    s, rel, excl = _tied_case(rng, n_items=n_items)
    assert 300 < 16 * M._STRIDE * 40 <= 6000  # kk = 40: exact threshold at 300 items, strided at 6000
    if with_excl and n_items == 6000 and kk >= 10:
        # the nearly fully excluded rows keep < kk available items in the strided subset
        assert (~excl[:3, :: M._STRIDE]).sum(axis=1).min() < kk
    excl = excl if with_excl else None
    fast = M._topk_order(s, rel, excl, kk)
    full = M._topk_order_full(s, rel, excl, kk)
    avail = np.ones(s.shape, bool) if excl is None else ~excl
    n_avail = avail.sum(axis=1)
    for u in range(s.shape[0]):
        n = min(kk, n_avail[u])
        assert np.array_equal(fast[u, :n], full[u, :n])  # same items in the same order
    # ties straddle the k-th place in most rows, so the tie-breaking is exercised
    kth = -np.sort(-np.where(avail, s, -np.inf), axis=1)[:, kk - 1 : kk]
    assert np.mean(np.sum(avail & (s == kth), axis=1) > 1) > 0.5


def test_factored_ranking_bit_identical_to_full_sort(monkeypatch):
    rng = np.random.default_rng(7)
    U = rng.integers(-3, 4, size=(90, 4)).astype(float)  # small integers: many tied scores
    V = rng.integers(-3, 4, size=(250, 4)).astype(float)
    rel = rng.random((90, 250)) < 0.08
    excl = (rng.random((90, 250)) < 0.25) & ~rel
    monkeypatch.setattr(M, "_BLOCK_ELEMENTS", 2000)  # 8 users per block
    fast = {k: ranking_metrics_at_k_factored(U, V, sp.csr_matrix(rel), k=k, exclude=excl) for k in (1, 10, 30)}
    fast_dense = {k: ranking_metrics_at_k(U @ V.T, rel, k=k, exclude=excl) for k in (1, 10, 30)}
    monkeypatch.setattr(M, "_RANKING_THREADS", 1)  # blocks one after another instead of in threads
    serial = {k: ranking_metrics_at_k_factored(U, V, sp.csr_matrix(rel), k=k, exclude=excl) for k in (1, 10, 30)}
    monkeypatch.setattr(M, "_RANKING_THREADS", 3)
    assert serial == fast
    monkeypatch.setattr(M, "_topk_order", M._topk_order_full)  # the former full-sort path, same blocks
    for k in (1, 10, 30):
        old = ranking_metrics_at_k(U @ V.T, rel, k=k, exclude=excl)
        assert fast[k] == old  # exact, not approx
        assert fast_dense[k] == old
        assert 0 < old["ndcg"] < 1 and 0 < old["recall"] < 1  # a non-degenerate case
    with pytest.raises(ValueError):
        ranking_metrics_at_k_factored(U, V[:, :3], rel)


# ------------------------------------------------------------------ MAP@k (dp-prototypes eqs. 5-6)


def test_map_at_k_by_hand():
    # user 0: hits [1, 0, 1] -> AP = (1/1 + 2/3) / 2 ; user 1: hits [1, 0, 0] -> AP = (1/1) / 3
    test = RANK_REL.astype(float) * 4.0  # nonzero test entries are the relevant ones
    assert map_at_k(RANK_SCORES, test, k=3) == approx(((1 + 2 / 3) / 2 + 1 / 3) / 2)  # 7/12
    assert map_at_k(RANK_SCORES, sp.csr_matrix(test), k=3) == approx(7 / 12)


def test_map_denominator_is_number_of_relevant_items():
    s = np.array([[0.9, 0.8, 0.7, 0.6, 0.5]])
    test = np.array([[1, 1, 1, 1, 0]])
    # k = 2, both hits: AP = (1/1 + 2/2) / |Rel| = 2/4 (eq. 5 divides by |Rel| = 4, not min(k, 4))
    assert map_at_k(s, test, k=2) == approx(2 / 4)


def test_map_edge_cases():
    assert math.isnan(map_at_k(RANK_SCORES, np.zeros((3, 5)), k=3))
    with pytest.raises(ValueError):
        map_at_k(np.zeros((0, 3)), np.zeros((0, 3)))
    # constant scores: relevant items ranked last among ties
    s = np.zeros((1, 4))
    test = np.array([[1, 0, 0, 0]])
    assert map_at_k(s, test, k=3) == 0.0
    assert map_at_k(s, test, k=4) == approx((1 / 4) / 1)


# ------------------------------------------------------------------ mean rank (dp-prototypes eq. 4)

MR_SCORES = np.array(
    [
        [0.9, 0.5, 0.1, 0.7],
        [0.3, 0.3, 0.8, 0.1],
    ]
)
MR_TEST = np.array(
    [
        [2.0, 4.0, 0.0, 0.0],  # item 0: rank 0/3 = 0; item 1: 2 items above -> 2/3
        [1.0, 0.0, 0.0, 0.0],  # item 0: 1 above, 1 tie -> (1 + 0.5) / 3 = 0.5
    ]
)


def test_mean_rank_by_hand():
    expected = (2 * 0 + 4 * (2 / 3) + 1 * 0.5) / (2 + 4 + 1)  # = 19/42
    assert mean_rank(MR_SCORES, MR_TEST) == approx(expected)
    assert mean_rank(MR_SCORES, sp.csr_matrix(MR_TEST)) == approx(19 / 42)


def test_mean_rank_extremes_and_random():
    s = np.array([[4.0, 3.0, 2.0, 1.0]])
    assert mean_rank(s, np.array([[1, 0, 0, 0]])) == 0.0  # top
    assert mean_rank(s, np.array([[0, 0, 0, 1]])) == 1.0  # bottom
    assert mean_rank(np.zeros((3, 7)), np.eye(3, 7)) == approx(0.5)  # constant scores
    rng = np.random.default_rng(1)
    test = (rng.random((400, 50)) < 0.1).astype(float)
    assert mean_rank(rng.random((400, 50)), test) == approx(0.5, abs=0.03)


def test_mean_rank_exclude():
    excl = np.array([[0, 0, 0, 1], [0, 0, 0, 0]], dtype=bool)  # user 0: item 3 not ranked
    # user 0 now ranks 3 items: item 0 -> 0/2, item 1 -> 1/2 ; user 1 unchanged 0.5
    expected = (2 * 0 + 4 * (1 / 2) + 1 * 0.5) / 7
    assert mean_rank(MR_SCORES, MR_TEST, exclude=excl) == approx(expected)
    with pytest.raises(ValueError):  # a test entry may not be excluded
        mean_rank(MR_SCORES, MR_TEST, exclude=np.array([[1, 0, 0, 0], [0, 0, 0, 0]], bool))


def test_mean_rank_edge_cases():
    assert math.isnan(mean_rank(MR_SCORES, np.zeros((2, 4))))
    with pytest.raises(ValueError):
        mean_rank(np.zeros((0, 4)), np.zeros((0, 4)))
    with pytest.raises(ValueError):
        mean_rank(MR_SCORES, -MR_TEST)
    with pytest.raises(ValueError):
        mean_rank(MR_SCORES, MR_TEST[:1])
    with pytest.raises(ValueError):
        mean_rank(np.array([[1.0]]), np.array([[1.0]]))  # a single item has no percentile


# ------------------------------------------------------------------ reconstruction accuracy


def test_reconstruction_accuracy_by_hand():
    true = [np.array([5.0, 3.0, 1.0]), np.array([2.0, 4.0])]
    guess = [np.array([5.0, 3.0, 2.0]), np.array([2.0, 5.0])]
    assert reconstruction_accuracy(true, guess) == approx(3 / 5)  # pooled over all entries
    true2d = np.array([[1, 0, 1], [0, 0, 1]])
    guess2d = np.array([[1, 1, 1], [0, 1, 1]])
    assert reconstruction_accuracy(true2d, guess2d) == approx(4 / 6)
    assert reconstruction_accuracy([4.0, 3.0], [4.0, np.nan]) == approx(1 / 2)  # NaN is wrong


def test_reconstruction_accuracy_errors():
    with pytest.raises(ValueError):
        reconstruction_accuracy([], [])
    with pytest.raises(ValueError):
        reconstruction_accuracy([np.ones(2), np.ones(3)], [np.ones(3), np.ones(2)])
    with pytest.raises(ValueError):
        reconstruction_accuracy(np.ones(3), np.ones(4))


# ------------------------------------------------------------------ relative error (fedsplit eq. 4)


def test_relative_error_by_hand():
    X = np.array([[5.0, 0.0], [3.0, 4.0]])
    X_hat = np.array([[4.0, 1.0], [3.0, 2.0]])
    # observed (nonzero) entries: errors 1, 0, 2 ; ||X_obs||^2 = 25 + 9 + 16
    assert relative_error(X, X_hat) == approx((1 + 0 + 4) / (25 + 9 + 16))
    assert relative_error(X, X_hat, squared=False) == approx(math.sqrt(5 / 50))
    assert relative_error(sp.csr_matrix(X), X_hat) == approx(0.1)
    full = np.ones((2, 2), dtype=bool)  # score the zero entry too: extra error (0 - 1)^2
    assert relative_error(X, X_hat, mask=full) == approx((1 + 1 + 0 + 4) / 50)
    assert relative_error(X, X_hat, mask=sp.csr_matrix(full)) == approx(6 / 50)
    assert relative_error(X, X) == 0.0


def test_relative_error_errors():
    with pytest.raises(ValueError):
        relative_error(np.zeros((2, 2)), np.ones((2, 2)))  # nothing observed
    with pytest.raises(ValueError):
        relative_error(np.ones((2, 2)), np.ones((2, 3)))
    with pytest.raises(ValueError):
        relative_error(np.zeros((0, 0)), np.zeros((0, 0)))
    with pytest.raises(ValueError):
        relative_error(np.ones((2, 2)), np.ones((2, 2)), mask=np.ones((1, 2), bool))


# ------------------------------------------------------------------ AUC


def test_auc_by_hand_with_ties():
    labels = [1, 0, 1, 0]
    scores = [0.8, 0.4, 0.4, 0.2]
    # pos/neg pairs: (.8,.4)=1 (.8,.2)=1 (.4,.4)=1/2 (.4,.2)=1 -> 3.5 / 4
    assert auc(labels, scores) == approx(3.5 / 4)
    assert auc(np.array(labels, dtype=bool), scores) == approx(0.875)
    assert auc([1, 1, 0], [0.0, 0.0, 0.0]) == approx(0.5)
    assert auc([0, 1], [0.9, 0.1]) == 0.0


def test_auc_errors():
    with pytest.raises(ValueError):
        auc([], [])
    with pytest.raises(ValueError):
        auc([1, 1], [0.2, 0.3])  # one class only
    with pytest.raises(ValueError):
        auc([0, 2], [0.2, 0.3])  # not binary
    with pytest.raises(ValueError):
        auc([0, 1], [0.2, np.nan])
    with pytest.raises(ValueError):
        auc([0, 1, 1], [0.2, 0.3])


# ------------------------------------------------------------------ mean and 95 % CI


def test_mean_ci95_by_hand():
    # n = 3, mean 2, sd 1; for 2 degrees of freedom t_q = (2q - 1) / sqrt(2 q (1 - q)), q = .975
    t975 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # = 4.3027
    mean, half = mean_ci95([1.0, 2.0, 3.0])
    assert mean == approx(2.0)
    assert half == approx(t975 * 1.0 / math.sqrt(3))
    assert mean_ci95([1.0, np.nan, 2.0, 3.0]) == approx((2.0, t975 / math.sqrt(3)))  # NaN skipped


def test_mean_ci95_edge_cases():
    assert mean_ci95([5.0]) == (5.0, 0.0)
    assert mean_ci95([5.0, np.nan]) == (5.0, 0.0)
    m, h = mean_ci95([np.nan, np.nan])
    assert math.isnan(m) and math.isnan(h)
    assert mean_ci95([3.0, 3.0, 3.0]) == (3.0, 0.0)
    with pytest.raises(ValueError):
        mean_ci95([])


# ------------------------------------------------------------------ baselines


def test_uniform_guess_accuracy():
    assert uniform_guess_accuracy(5) == approx(1 / 5)  # ratings 1..5
    assert uniform_guess_accuracy(2) == approx(1 / 2)  # a 0/1 dummy
    assert uniform_guess_accuracy([5, 2]) == approx((1 / 5 + 1 / 2) / 2)
    for bad in (0, -1, 2.5, []):
        with pytest.raises(ValueError):
            uniform_guess_accuracy(bad)


def test_majority_guess_accuracy():
    assert majority_guess_accuracy([1, 1, 2, 3]) == approx(2 / 4)
    assert majority_guess_accuracy([1, 1, 2, 3], guess=3) == approx(1 / 4)
    assert majority_guess_accuracy([np.array([4, 4, 5]), np.array([4])]) == approx(3 / 4)
    assert majority_guess_accuracy(np.array([[0, 1], [0, 0]])) == approx(3 / 4)
    with pytest.raises(ValueError):
        majority_guess_accuracy([])
