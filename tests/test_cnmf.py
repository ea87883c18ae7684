"""CNMF with biases (FedSPLIT paper eqs. 5-13): fits, invariants, and agreement with Surprise."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from privaudit.models.cnmf import CNMF, _bias_step, block_columns, fit_row_factors, observed


def _lowrank(n=120, m=150, k=3, density=0.2, seed=0):
    """Non-negative rank-k ratings 1..5 on a random mask, split 80/20 over entries."""
    rng = np.random.default_rng(seed)
    W = rng.gamma(2.0, 0.5, (n, k))
    H = rng.gamma(2.0, 0.5, (k, m))
    full = W @ H
    full = 1 + 4 * (full - full.min()) / (full.max() - full.min())
    mask = rng.random((n, m)) < density
    mask[np.arange(n), rng.integers(0, m, n)] = True
    rows, cols = np.nonzero(mask)
    vals = np.clip(np.round(full[rows, cols] + rng.normal(0, 0.3, rows.size)), 1, 5)
    test = rng.random(rows.size) < 0.2
    Xtr = sp.csr_matrix((vals[~test], (rows[~test], cols[~test])), shape=(n, m))
    return Xtr, rows[test], cols[test], vals[test]


def test_fit_beats_bias_free_baselines_and_stays_nonnegative():
    Xtr, tr, tc, tv = _lowrank()
    model = CNMF(n_components=5, n_iter=100).fit(Xtr, rng=0)
    assert model.W_.shape == (120, 5) and model.H_.shape == (5, 150)
    assert (model.W_ >= 0).all() and (model.H_ >= 0).all()
    rmse = float(np.sqrt(np.mean((model.predict(tr, tc) - tv) ** 2)))
    mean_rmse = float(np.sqrt(np.mean((Xtr.data.mean() - tv) ** 2)))
    assert rmse < 0.8 * mean_rmse, (rmse, mean_rmse)
    # the training fit is better still, and predictions respect the rating range
    assert model.rmse(Xtr) < rmse
    p = model.predict(tr, tc)
    assert p.min() >= 1.0 and p.max() <= 5.0
    assert model.mu_ == pytest.approx(Xtr.data.mean())


def test_given_mu_is_used_and_unrated_rows_and_columns_are_zero():
    Xtr, *_ = _lowrank(n=40, m=50)
    X = sp.lil_matrix(Xtr)
    X[5, :] = 0
    X[:, 7] = 0
    X = sp.csr_matrix(X)
    X.eliminate_zeros()
    model = CNMF(n_components=3, n_iter=20).fit(X, mu=3.0, rng=1)
    assert model.mu_ == 3.0
    assert np.all(model.W_[5] == 0) and model.b_W_[5] == 0
    assert np.all(model.H_[:, 7] == 0) and model.b_H_[7] == 0


def test_bias_step_matches_sequential_sgd():
    # n sequential steps b <- b + eta (r - (1 + reg) b) from b = 0 land where one step of s_n does
    eta, reg, r = 0.005, 0.02, 0.7
    for count in (1, 10, 400, 2000):
        b = 0.0
        for _ in range(count):
            b += eta * (r - (1 + reg) * b)
        step = _bias_step(np.array([count]), eta, reg)[0]
        assert step * count * (r - 0) == pytest.approx(b, rel=1e-9)  # sum_j err - reg n b0 with b0 = 0
    assert _bias_step(np.array([1]), eta, reg)[0] == pytest.approx(eta)
    assert _bias_step(np.array([0]), eta, reg)[0] == 0.0
    with pytest.raises(ValueError):
        _bias_step(np.array([1]), 2.0, 0.0)


def test_block_columns_fits_independent_groups_in_one_pass():
    Xtr, *_ = _lowrank(n=30, m=40, seed=3)
    group = np.repeat([0, 1, 2], 10)
    ranks = np.array([2, 3, 4])
    kw = dict(n_components=4, n_iter=15, init_low=0.3, init_high=0.3)  # constant init: deterministic
    joint = CNMF(**kw).fit(block_columns(Xtr, group, 3), mu=3.2, row_rank=ranks[group], col_rank=np.repeat(ranks, 40))
    for g in range(3):
        rows = np.flatnonzero(group == g)
        alone = CNMF(**{**kw, "n_components": int(ranks[g])}).fit(Xtr[rows], mu=3.2)
        np.testing.assert_allclose(joint.W_[rows, : ranks[g]], alone.W_, rtol=1e-9, atol=1e-12)
        assert np.all(joint.W_[rows, ranks[g] :] == 0)
        np.testing.assert_allclose(joint.H_[: ranks[g], g * 40 : (g + 1) * 40], alone.H_, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(joint.b_H_[g * 40 : (g + 1) * 40], alone.b_H_, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(joint.b_W_[rows], alone.b_W_, rtol=1e-9, atol=1e-12)
    # entries keep their values, columns move to the group's block
    B = block_columns(Xtr, group, 3)
    assert B.shape == (30, 120) and B.nnz == Xtr.nnz
    assert B[12, 40 + 5] == Xtr[12, 5]


def test_fit_rows_with_fixed_items_recovers_the_users():
    Xtr, tr, tc, tv = _lowrank(seed=4)
    model = CNMF(n_components=5, n_iter=100).fit(Xtr, rng=0)
    W, b_W = fit_row_factors(model, Xtr, model.H_, model.b_H_, model.mu_, rng=5)
    refit = CNMF(n_components=5, n_iter=100)
    refit.W_, refit.H_, refit.b_W_, refit.b_H_, refit.mu_ = W, model.H_, b_W, model.b_H_, model.mu_
    assert refit.rmse(Xtr) < model.rmse(Xtr) + 0.05
    # a row the adversary knows nothing about gets W = 0, b_W = 0
    X2 = sp.csr_matrix(Xtr)
    X2 = sp.vstack([X2, sp.csr_matrix((1, X2.shape[1]))]).tocsr()
    W2, b2 = model.fit_rows(X2, model.H_, model.b_H_, model.mu_, rng=0)
    assert np.all(W2[-1] == 0) and b2[-1] == 0
    with pytest.raises(ValueError):
        fit_row_factors(model, Xtr, model.H_[:, :10], model.b_H_, model.mu_)


def test_observed_keeps_csr_order():
    X = sp.csr_matrix(np.array([[0, 2.0, 0], [1.0, 0, 3.0]]))
    Xc, r, c, v = observed(X)
    assert r.tolist() == [0, 1, 1] and c.tolist() == [1, 0, 2] and v.tolist() == [2.0, 1.0, 3.0]


def _surprise_rmse(Xtr, tr, tc, tv, **params):
    surprise = pytest.importorskip("surprise", reason="scikit-surprise is not installed (test-only dependency)")
    coo = sp.coo_matrix(Xtr)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.tsv"
        path.write_text("".join(f"{r}\t{c}\t{v}\n" for r, c, v in zip(coo.row, coo.col, coo.data)))
        reader = surprise.Reader(line_format="user item rating", sep="\t", rating_scale=(1, 5))
        trainset = surprise.Dataset.load_from_file(str(path), reader).build_full_trainset()
    algo = surprise.NMF(biased=True, **params)
    algo.fit(trainset)
    est = np.array([algo.predict(str(r), str(c)).est for r, c in zip(tr, tc)])
    return float(np.sqrt(np.mean((est - tv) ** 2)))


def _matched(k, epochs, reg, reg_b, lr):
    ours = dict(n_components=k, n_iter=epochs, alpha=reg, beta=reg, gamma=reg_b, delta=reg_b, eta_W=lr, eta_H=lr)
    theirs = dict(n_factors=k, n_epochs=epochs, reg_pu=reg, reg_qi=reg, reg_bu=reg_b, reg_bi=reg_b, lr_bu=lr, lr_bi=lr)
    return ours, theirs


def test_matches_surprise_nmf_biased_on_synthetic():
    Xtr, tr, tc, tv = _lowrank(n=150, m=120, density=0.25, seed=7)
    ours, theirs = _matched(5, 50, 0.06, 0.02, 0.005)
    mine = CNMF(**ours).fit(Xtr, rng=0)
    rmse = float(np.sqrt(np.mean((mine.predict(tr, tc) - tv) ** 2)))
    ref = _surprise_rmse(Xtr, tr, tc, tv, random_state=0, **theirs)
    assert abs(rmse - ref) < 0.03, (rmse, ref)


@pytest.mark.slow
def test_matches_surprise_nmf_biased_on_ml100k(ml100k_path):
    """FedSPLIT paper §3.2 adapts Surprise's NMF; on an ML-100K 80/20 split RMSEs agree within 0.02."""
    from privaudit.data import load_dataset

    X = load_dataset(ml100k_path).ratings.tocoo()
    rng = np.random.default_rng(0)
    perm = rng.permutation(X.nnz)
    test, train = perm[: X.nnz // 5], perm[X.nnz // 5 :]
    Xtr = sp.csr_matrix((X.data[train], (X.row[train], X.col[train])), shape=X.shape)
    tr, tc, tv = X.row[test], X.col[test], X.data[test]
    ours, theirs = _matched(15, 50, 0.06, 0.02, 0.005)  # Surprise's defaults
    mine = CNMF(**ours).fit(Xtr, rng=0)
    rmse = float(np.sqrt(np.mean((mine.predict(tr, tc) - tv) ** 2)))
    ref = _surprise_rmse(Xtr, tr, tc, tv, random_state=0, **theirs)
    assert abs(rmse - ref) < 0.02, (rmse, ref)
    assert 0.85 < rmse < 1.0
