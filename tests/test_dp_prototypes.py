"""The dp-prototypes mechanism (DP-prototypes paper Algorithms 2-6): Gumbel top-s equals
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
    assert b.count == pytest.approx(2.0 / 20)
    eps_t = (2.0 - b.count - b.selection) / trials
    assert b.candidate == pytest.approx(eps_t / 8) and b.localswap == pytest.approx(eps_t / 8)
    assert b.support + b.values == pytest.approx(3 * eps_t / 4)
    assert b.selection == (pytest.approx((2.0 - 0.1) / 3) if trials > 1 else 0.0)
    assert pk.n_trials(0.1) == 5 and pk.n_trials(0.5) == 2
    # the split the mechanism reports is the one it used
    X = sp.random(30, 20, density=0.2, random_state=1, data_rvs=lambda n: np.full(n, 3.0)).tocsr()
    info = pk.private_prototypes(
        X, 3, 2.0, 0.1, 5.0, 4, np.random.default_rng(0), trials=trials, swap_iters=3, n_grids=20
    ).info
    assert sum(v for k_, v in info["budget"].items() if k_ in ("count", "selection")) + trials * sum(
        info["budget"][k_] for k_ in ("candidate", "localswap", "support", "values")
    ) == pytest.approx(2.0)


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
    # the structural n (grids, eps', gamma) is the privatised one when given, not the data's
    _, info2 = pk.candidate(Y, k=3, epsilon=eps, delta=0.1, Lambda=2.0, rng=rng, n_public=500)
    assert info2["n_grids"] == math.ceil(25 * 3 * math.log(500 / 0.1))
    assert info2["eps_prime"] == pytest.approx(eps / info2["n_grids"] / (2 * math.log(500)))
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
    # huge budget: exact support, values ~ the mean (normaliser = cluster size)
    P = pk.sparse_recovery(sp.csr_matrix(X), labels, 1, s, Lam, 1e6, 1e6, rng, normaliser=200.0)
    assert set(np.flatnonzero(P[0])) == {1, 4, 7}
    assert np.allclose(P[0, [1, 4, 7]], 4.0, atol=1e-3)
    # Laplace values on the sums: scale s Lambda / eps, whatever the cluster size (measured around
    # mu = 2.5 before clipping, in mean units: s Lambda / (eps * normaliser))
    for n_rows in (50, 10):
        X2 = np.zeros((n_rows, m))
        X2[:, :3] = 2.5
        eps_v = 4.0
        b = s * Lam / (eps_v * 50.0)
        draws = np.array(
            [
                pk.sparse_recovery(X2, np.zeros(n_rows, dtype=np.int64), 1, s, Lam, 1e6, eps_v, rng, normaliser=50.0)[
                    0, :3
                ]
                for _ in range(400)
            ]
        )
        assert np.std(draws - 2.5 * n_rows / 50.0) == pytest.approx(math.sqrt(2) * b, rel=0.15)


def test_sparse_recovery_support_is_eps_dp_for_added_or_removed_rows():
    """Exact law of the ordered support (Plackett-Luce with scale s Lambda / eps_sup) for a
    cluster and for every neighbour with one row removed: log-ratio <= eps_sup."""
    Lam, s, eps_sup = 5.0, 2, 0.8
    X = np.array([[5, 0, 3, 0], [0, 4, 5, 0], [1, 0, 0, 5], [5, 5, 0, 0]], dtype=float)
    scale = s * Lam / eps_sup

    def law(rows):
        return _plackett_luce(rows.sum(axis=0), scale, s)

    full = law(X)
    worst = 0.0
    for drop in range(X.shape[0]):
        nb = law(np.delete(X, drop, axis=0))
        worst = max(worst, max(abs(math.log(full[c] / nb[c])) for c in full))
    assert 0.05 < worst <= eps_sup + 1e-12
    # and the Gumbel draw follows that law (scale as documented)
    rng = np.random.default_rng(7)
    N = 4000
    draws = np.array(
        [pk.sparse_recovery(X, np.zeros(4, dtype=np.int64), 1, s, Lam, eps_sup, 1e6, rng)[0] for _ in range(N)]
    )
    freq = (draws > 0).mean(axis=0)
    marg = np.zeros(4)
    for c, pr in full.items():
        marg[list(c)] += pr
    assert np.allclose(freq, marg, atol=0.03)


def test_candidates_are_pulled_into_the_ball_before_localswap(monkeypatch):
    seen = {}
    real = pk.localswap

    def spy(Y, C, *a, **kw):
        seen["Y"], seen["C"] = np.linalg.norm(Y, axis=1).max(), np.linalg.norm(C, axis=1).max()
        return real(Y, C, *a, **kw)

    monkeypatch.setattr(pk, "localswap", spy)
    X = sp.random(40, 30, density=0.3, random_state=3, data_rvs=lambda n: np.full(n, 5.0)).tocsr()
    pk.private_prototypes(X, 3, 1.0, 0.3, 5.0, 4, np.random.default_rng(1), trials=1, swap_iters=3, n_grids=30)
    Lambda_Y = 5.0 * math.sqrt(4)
    assert seen["Y"] <= Lambda_Y + 1e-9 and seen["C"] <= Lambda_Y + 1e-9


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
    spent = d.privacy_spent(1)
    assert d.config["epsilon"] == 0.5 and (spent["epsilon"], spent["delta"], spent["accountant"]) == (0.5, 0.0, "basic")


def test_every_prototype_upload_of_a_silo_is_composed():
    """A silo that uploads prototypes twice spends 2 epsilon (one upload: epsilon); user-level claim."""
    from privaudit.defenses.base import UploadBatch

    class _Chan:
        rng = np.random.default_rng(0)

    d = DPPrototypes(epsilon=0.5, trials=1, swap_iters=2)
    assert d.privacy_spent(1)["releases"] == 1
    rows = np.random.default_rng(1).integers(0, 6, size=(12, 5)).astype(np.float64)
    for r in range(2):
        batch = UploadBatch(r, "prototypes", ["client:0"], [{"rows": rows}], meta={"k": 2, "s": 5, "Lambda": 5.0})
        out = d.on_upload(batch, _Chan())
        assert set(out.payloads[0]) == {"prototypes"}
    spent = d.privacy_spent(1)
    assert spent["releases"] == 2 and spent["epsilon"] == pytest.approx(1.0) and spent["replace_epsilon"] == 2.0
    assert spent["neighbour"] == "user" and spent["item_set_covered"] is True
