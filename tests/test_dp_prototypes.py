"""The dp-prototypes mechanism (dp-prototypes.txt Algorithms 2-6): Gumbel top-s equals
sequential exponential mechanisms in distribution, the epsilon split of every step, the
privacy ratios of private_partition and localswap, sparse recovery's noise, the defense."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from privaudit.defenses.dp_prototypes import DPPrototypes
from privaudit.errors import PrivauditError
from privaudit.models import private_kmeans as pk


def _plackett_luce(u, scale, s):
    """Exact probability of every ordered s-tuple under sequential sampling without replacement."""
    w = np.exp(np.asarray(u) / scale)
    probs = {}
    for tup in itertools.permutations(range(len(u)), s):
        p, left = 1.0, w.sum()
        for i in tup:
            p *= w[i] / left
            left -= w[i]
        probs[tup] = p
    return probs


def test_gumbel_top_s_matches_sequential_exponential_mechanism():
    u, scale, s, N = np.array([0.0, 1.0, 2.0, 0.5]), 1.0, 2, 6000
    rng = np.random.default_rng(0)
    gum = pk.gumbel_top_s(np.tile(u, (N, 1)), s, scale, rng)
    seq = np.array([pk.sequential_exponential(u, s, scale, rng) for _ in range(N)])
    exact = _plackett_luce(u, scale, s)
    cats = list(exact)
    index = {c: j for j, c in enumerate(cats)}
    c_g = np.bincount([index[tuple(r)] for r in gum], minlength=len(cats))
    c_s = np.bincount([index[tuple(r)] for r in seq], minlength=len(cats))
    # two-sample chi-square (contingency table) and goodness of fit of each to Plackett-Luce
    _, p_two, _, _ = stats.chi2_contingency(np.vstack([c_g, c_s]))
    expected = N * np.array([exact[c] for c in cats])
    assert p_two > 1e-3
    assert stats.chisquare(c_g, expected).pvalue > 1e-3
    assert stats.chisquare(c_s, expected).pvalue > 1e-3
    # and it is not a vacuous test: a uniform draw is rejected
    uniform = np.array([rng.permutation(4)[:2] for _ in range(N)])
    c_u = np.bincount([index[tuple(r)] for r in uniform], minlength=len(cats))
    assert stats.chisquare(c_u, expected).pvalue < 1e-6


@pytest.mark.parametrize("trials", [1, 5])
def test_budget_split_sums_to_epsilon(trials):
    b = pk.budget_split(2.0, trials)
    assert b.total == pytest.approx(2.0)
    eps_t = (2.0 - b.selection) / trials
    assert b.candidate == pytest.approx(eps_t / 8) and b.localswap == pytest.approx(eps_t / 8)
    assert b.support + b.values == pytest.approx(3 * eps_t / 4)
    assert b.selection == (pytest.approx(2.0 / 3) if trials > 1 else 0.0)
    assert pk.n_trials(0.1) == 5 and pk.n_trials(0.5) == 2


def test_candidate_respects_its_epsilon_and_partition_ratio():
    rng = np.random.default_rng(1)
    Y = rng.normal(size=(60, 6)) * 0.3
    eps = 0.05
    C, info = pk.candidate(Y, k=3, epsilon=eps, delta=0.1, Lambda=2.0, rng=rng)
    # T_c grids with eps / T_c each; D levels of eps' each per grid; total <= eps
    assert info["n_grids"] == math.ceil(25 * 3 * math.log(60 / 0.1))
    assert info["eps_grid"] * info["n_grids"] == pytest.approx(eps)
    assert info["eps_used"] <= eps + 1e-12
    assert C.shape[1] == 6 and C.shape[0] >= info["n_grids"]
    # f(m+1) / f(m) within exp(+-eps') for every count: the Laplace threshold test
    e1, gamma = 0.3, 7.0
    m = np.arange(0, 30)
    r = np.log(pk.inclusion_probability(m + 1, e1, gamma)) - np.log(pk.inclusion_probability(m, e1, gamma))
    assert np.all(np.abs(r) <= e1 + 1e-12) and np.all(r >= 0)


def test_partition_refines_dense_cells_when_the_budget_allows():
    # a huge budget: cells with many points pass the threshold gamma and get refined
    rng = np.random.default_rng(2)
    Y = np.vstack([rng.normal(0.5, 0.01, size=(400, 2)), rng.normal(-0.5, 0.01, size=(400, 2))])
    C, info = pk.private_partition(Y, np.array([[-1.0, -1.0]]), 2.0, 5000.0, 0.1, rng)
    assert info["added"] >= 2 and info["depth"] >= 2
    assert np.min(np.linalg.norm(C - [0.5, 0.5], axis=1)) < 0.2


def test_localswap_steps_respect_their_epsilon():
    rng = np.random.default_rng(3)
    Lam = 1.0
    Y = rng.uniform(-0.5, 0.5, size=(40, 3))
    C = rng.uniform(-0.5, 0.5, size=(25, 3))  # all within the ball of radius Lambda
    D = pk._sqdist(Y, C)
    Z = np.array([0, 4, 9])
    eps_step = 0.7
    lw, _ = pk.swap_log_weights(D, Z, eps_step, Lam)
    for drop in range(Y.shape[0]):  # neighbouring data set: one row removed
        lw2, _ = pk.swap_log_weights(np.delete(D, drop, axis=0), Z, eps_step, Lam)
        ok = np.isfinite(lw)
        p1 = lw[ok] - np.logaddexp.reduce(lw[ok])
        p2 = lw2[ok] - np.logaddexp.reduce(lw2[ok])
        assert np.max(np.abs(p1 - p2)) <= eps_step + 1e-9
    Zi, info = pk.localswap(Y, C, 3, 0.5, Lam, rng, iters=9)
    assert info["eps_step"] == pytest.approx(0.05) and info["eps_used"] == pytest.approx(0.5)
    assert len(set(Zi.tolist())) == 3


def test_sparse_recovery_support_and_noise_scale():
    rng = np.random.default_rng(4)
    m, s, Lam = 12, 3, 5.0
    X = np.zeros((200, m))
    X[:, [1, 4, 7]] = 4.0
    labels = np.zeros(200, dtype=np.int64)
    # huge budget: exact support, values ~ the mean
    P = pk.sparse_recovery(sp.csr_matrix(X), labels, 1, s, Lam, 1e6, 1e6, rng)
    assert set(np.flatnonzero(P[0])) == {1, 4, 7}
    assert np.allclose(P[0, [1, 4, 7]], 4.0, atol=1e-3)
    # Laplace values: scale 2 s Lambda / (eps n_j) (before clipping, measure around mu = 2.5)
    X2 = np.zeros((50, m))
    X2[:, :3] = 2.5
    eps_v = 200.0
    b = 2 * s * Lam / (eps_v * 50)
    draws = np.array([pk.sparse_recovery(X2, np.zeros(50, dtype=np.int64), 1, s, Lam, 1e6, eps_v, rng)[0, :3] for _ in range(400)])
    assert np.std(draws - 2.5) == pytest.approx(math.sqrt(2) * b, rel=0.15)


def test_private_prototypes_shapes_and_determinism():
    rng = np.random.default_rng(5)
    X = sp.random(40, 30, density=0.2, random_state=5, data_rvs=lambda n: rng.integers(1, 6, n).astype(float)).tocsr()
    a = pk.private_prototypes(X, 4, 1.0, 0.3, 5.0, 5, np.random.default_rng(9), swap_iters=5, n_grids=50)
    b = pk.private_prototypes(X, 4, 1.0, 0.3, 5.0, 5, np.random.default_rng(9), swap_iters=5, n_grids=50)
    assert a.prototypes.shape == (4, 30)
    assert np.array_equal(a.prototypes, b.prototypes)
    assert (a.prototypes >= 0).all() and (a.prototypes <= 5).all()
    assert ((a.prototypes > 0).sum(axis=1) <= 5).all()
    assert a.info["trials"] == pk.n_trials(0.3) == 3
    assert sum(a.info["cluster_sizes"]) == 40


def test_clip_rows_bounds_sparsity_and_range():
    X = sp.csr_matrix(np.array([[1, 2, 3, 9, 0], [0, 0, 4, 0, 0]], dtype=float))
    A = pk.clip_rows(X, 2, 5.0, np.random.default_rng(0))
    assert list(np.diff(A.indptr)) == [2, 1] and A.max() <= 5.0


def test_defense_parameters_validated():
    with pytest.raises(PrivauditError, match="epsilon"):
        DPPrototypes(epsilon=0)
    with pytest.raises(PrivauditError, match="delta"):
        DPPrototypes(delta=1.5)
    d = DPPrototypes(epsilon="0.5")
    assert d.config["epsilon"] == 0.5 and d.privacy_spent(1) == {"epsilon": 0.5, "delta": 0.0}
