"""Sampling defense: virtual unrated items (PrivMVMF eq. 36, FedRec UA/HF) and what item sets leak."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from privaudit.defenses.base import ClientData
from privaudit.defenses.sampling import DEFAULT_W, SamplingDefense, item_set_guess, sample_unrated
from privaudit.errors import PrivauditError
from privaudit.registry import get


def _ratings(n=40, m=60, seed=0):
    rng = np.random.default_rng(seed)
    dense = np.where(rng.random((n, m)) < 0.2, rng.integers(1, 6, (n, m)), 0).astype(float)
    dense[0, :] = 0
    dense[0, :3] = [5, 4, 3]  # a light user
    dense[1, :] = rng.integers(1, 6, m)  # a user who rated everything
    return sp.csr_matrix(dense)


def _sets(mat):
    return [mat.indices[mat.indptr[u] : mat.indptr[u + 1]] for u in range(mat.shape[0])]


def test_registered_and_grid():
    cls = get("defense", "sampling")
    assert cls is SamplingDefense and cls.strength == "rho" and tuple(cls.default_grid) == (0, 1, 2, 3)


def test_default_weight_is_fedmvmf_default_w():
    """Without its own w the defense weighs sampled items by FedMVMF's default w (no import of fedmvmf)."""
    assert SamplingDefense().weight == DEFAULT_W == get("protocol", "fedmvmf").default_config["w"]
    assert SamplingDefense(w=0.7).weight == 0.7


@pytest.mark.parametrize(
    "params, message",
    [
        ({"rho": -1}, "rho"),
        ({"filling": "zero"}, "filling"),
        ({"w": -0.5}, "w"),
        ({"distribution": "x"}, "distribution"),
    ],
)
def test_invalid(params, message):
    with pytest.raises(PrivauditError, match=message):
        SamplingDefense(**params)


@pytest.mark.parametrize("rho", [0.5, 1, 2.5])
def test_weight_filling_counts_and_values(rho):
    R = _ratings()
    d = SamplingDefense(rho=rho, w=0.3)
    out = d.on_client_data(ClientData.from_ratings(R), np.random.default_rng(1))
    n_rated = np.diff(R.indptr)
    n_all = np.diff(out.ratings.indptr)
    expected = np.minimum(np.floor(rho * n_rated + 0.5), R.shape[1] - n_rated)
    assert np.array_equal(n_all - n_rated, expected)
    assert n_all[1] == R.shape[1]  # nothing left to sample for the user who rated everything
    # same sparsity in ratings / weights / virtual; real entries untouched
    for mat in (out.weights, out.virtual):
        assert np.array_equal(mat.indptr, out.ratings.indptr) and np.array_equal(mat.indices, out.ratings.indices)
    virt = out.virtual.data
    assert np.all(out.ratings.data[virt] == 0) and np.all(out.weights.data[virt] == 0.3)
    assert np.all(out.weights.data[~virt] == 1)
    real = out.ratings.copy()
    real.eliminate_zeros()  # virtual ratings are 0 under weight filling
    assert (real != R).nnz == 0
    # sampled items are unrated, without repetition
    for u in range(R.shape[0]):
        lo, hi = out.ratings.indptr[u], out.ratings.indptr[u + 1]
        items = out.ratings.indices[lo:hi]
        assert len(np.unique(items)) == len(items)
        assert not np.intersect1d(items[virt[lo:hi]], R.indices[R.indptr[u] : R.indptr[u + 1]]).size


def test_ua_filling_uses_user_mean_and_weight_one():
    R = _ratings()
    out = SamplingDefense(rho=1, filling="ua").on_client_data(ClientData.from_ratings(R), np.random.default_rng(2))
    means = np.asarray(R.sum(axis=1)).ravel() / np.diff(R.indptr)
    rows = np.repeat(np.arange(R.shape[0]), np.diff(out.ratings.indptr))
    virt = out.virtual.data
    assert np.allclose(out.ratings.data[virt], means[rows[virt]])
    assert np.all(out.weights.data == 1)
    hf = SamplingDefense(rho=1, filling="hf", t_predict=3).on_client_data(
        ClientData.from_ratings(R), np.random.default_rng(2)
    )
    assert np.allclose(hf.ratings.data, out.ratings.data)  # HF starts as UA; the protocol refills later


def test_rho_zero_is_identity_and_sampling_is_uniform():
    R = _ratings()
    data = ClientData.from_ratings(R)
    assert SamplingDefense(rho=0).on_client_data(data, np.random.default_rng(0)) is data
    # each unrated item of a user is equally likely (chi-square-free check on frequencies)
    one = sp.csr_matrix(np.r_[[np.r_[np.ones(10), np.zeros(40)]]])
    counts = np.zeros(50)
    rng = np.random.default_rng(3)
    for _ in range(400):
        s = sample_unrated(one, 1.0, rng)
        counts[s.indices] += 1
    assert counts[:10].sum() == 0
    freq = counts[10:] / 400
    assert np.all(np.abs(freq - 10 / 40) < 0.1)


def test_item_set_guess_uniform_is_chance():
    R = _ratings(200, 300, seed=5)
    out = SamplingDefense(rho=2).on_client_data(ClientData.from_ratings(R), np.random.default_rng(0))
    res = item_set_guess(_sets(out.ratings), _sets(R), 2.0)
    assert abs(res["precision"] - 1 / 3) < 0.02 and res["chance"] == pytest.approx(1 / 3)


@pytest.mark.slow
@pytest.mark.parametrize("rho", [1, 2, 3])
def test_ml100k_rated_guess_at_chance(rho, ml100k_path):
    """The server seeing I_u ∪ S_u picks a rated item with probability ~1/(1+rho) (PrivMVMF paper §5).

    All 943 users. Uniform sampling (the paper's): only an observer without an item prior is at
    chance; one who ranks the uploaded items by how many clients uploaded them does much better
    (popularity skew). ``distribution=matched`` brings every item-only observer (popularity,
    rarity, true rating counts) and the co-occurrence lift to within 0.02 of chance at rho = 1;
    at rho = 2, 3 the items rated by more than N / (1 + rho) of an activity group cannot be
    matched and keep the popularity ranking above chance (below the oracle bound of
    benchmarks/sampling_leakage.py); a low-rank (collaborative-filtering) observer beats
    chance under every sampling. Numbers: docs/reproduction.md "Sampling: what the item sets leak".
    """
    from privaudit.data import load_dataset

    R = load_dataset(ml100k_path).ratings
    chance = 1 / (1 + rho)
    nj = np.bincount(R.indices, minlength=R.shape[1])
    out = SamplingDefense(rho=rho).on_client_data(ClientData.from_ratings(R), np.random.default_rng(0))
    uni = item_set_guess(_sets(out.ratings), _sets(R), rho)
    assert abs(uni["precision"] - chance) < 0.02
    pop = item_set_guess(_sets(out.ratings), _sets(R), rho, "popularity")
    assert pop["precision"] > chance + 0.25  # 0.781 / 0.692 / 0.635
    popdist = SamplingDefense(rho=rho, distribution="popularity").on_client_data(
        ClientData.from_ratings(R), np.random.default_rng(0)
    )
    pop2 = item_set_guess(_sets(popdist.ratings), _sets(R), rho, "popularity")
    assert pop["precision"] - 0.25 < pop2["precision"] < pop["precision"] - 0.15  # 0.594 / 0.481 / 0.431

    d = SamplingDefense(rho=rho, distribution="matched")
    matched = d.on_client_data(ClientData.from_ratings(R), np.random.default_rng(0))
    sets = _sets(matched.ratings)
    res = {
        s: item_set_guess(sets, _sets(R), rho, s, item_counts=nj)["precision"]
        for s in ("uniform", "popularity", "rarity", "counts", "cooccurrence", "lowrank")
    }
    assert abs(res["uniform"] - chance) < 0.02
    if rho == 1:
        for s in ("popularity", "rarity", "counts", "cooccurrence"):
            assert abs(res[s] - chance) < 0.02, (s, res[s])
    else:  # unmatchable (capped) items: 0.392 / 0.352 (chance 0.333 / 0.250)
        assert chance + 0.04 < res["popularity"] < chance + 0.13
        assert res["popularity"] < pop2["precision"] - 0.05
    assert d.matched_info["capped_uploads"] < 0.3  # 0.114 / 0.188 / 0.229
    # collaborative filtering on the sets still beats chance at rho = 1 (0.588); matched
    # sampling removes most of it (uniform sampling: 0.854 / 0.767 / 0.693)
    if rho == 1:
        assert 0.55 < res["lowrank"] < 0.62


# ------------------------------------------------------------------ distribution=matched


def _skewed(n=300, m=200, seed=0):
    """Popularity-skewed implicit data: user activity and item popularity both heavy-tailed."""
    rng = np.random.default_rng(seed)
    pop = rng.pareto(1.5, m) + 0.05
    act = rng.pareto(2.0, n) + 0.3
    p = np.clip(0.03 * np.outer(act, pop) / pop.mean(), 0, 0.6)
    dense = (rng.random((n, m)) < p).astype(float)
    dense[np.arange(n), rng.integers(0, m, n)] = 1  # everyone rated something
    return sp.csr_matrix(dense * rng.integers(1, 6, (n, m)))


def test_water_fill_solves_capped_sizes():
    from privaudit.defenses.sampling import water_fill

    rng = np.random.default_rng(0)
    mask = rng.random((50, 30)) < 0.7
    w = rng.pareto(1.0, 30) + 0.01
    k = np.floor(rng.random(50) * mask.sum(1))
    lam = water_fill(mask, w, k)
    with np.errstate(invalid="ignore"):
        pi = np.minimum(1.0, np.nan_to_num(lam[:, None] * w[None, :], posinf=1.0)) * mask
    assert np.allclose(pi.sum(1), k)
    full = water_fill(mask, w, mask.sum(1).astype(float))  # everything allowed is taken
    with np.errstate(invalid="ignore"):
        pi = np.minimum(1.0, np.nan_to_num(full[:, None] * w[None, :], posinf=1.0))
    assert np.all(pi[mask] == 1.0)


def test_sample_with_probabilities_exact_sizes_and_frequencies():
    from privaudit.defenses.sampling import sample_with_probabilities, water_fill

    present = sp.csr_matrix(np.r_[[np.r_[np.ones(5), np.zeros(15)]]] * np.ones((400, 1)))
    w = np.r_[np.ones(5), np.linspace(0.1, 1.0, 14), 20.0]
    k = np.full(400, 6.0)
    s = sample_with_probabilities(present, w, k, np.random.default_rng(1))
    assert np.all(np.diff(s.indptr) == 6) and not s[:, :5].nnz
    lam = water_fill(np.r_[np.zeros(5, bool), np.ones(15, bool)][None, :], w, k[:1])
    pi = np.minimum(1.0, lam[0] * w[5:])
    freq = np.asarray(s[:, 5:].sum(0)).ravel() / 400
    assert np.max(np.abs(freq - pi)) < 0.08 and pi.max() == 1.0  # capped items always taken


def test_matched_expected_counts_follow_ratings_and_hide_popularity():
    R = _skewed()
    n_rated = np.diff(R.indptr)
    d = SamplingDefense(rho=1, distribution="matched", matched_groups=1)
    out = d.on_client_data(ClientData.from_ratings(R), np.random.default_rng(0))
    # exactly round(rho |I_u|) unrated items per user (capped at the unrated count)
    added = np.diff(out.ratings.indptr) - n_rated
    assert np.array_equal(added, np.minimum(n_rated, R.shape[1] - n_rated))
    assert np.all(out.ratings.data[out.virtual.data] == 0)
    info = d.matched_info
    assert info["groups"][0]["max_rel_error"] < 1e-3 and info["groups"][0]["users"] == R.shape[0]
    # realised sampler counts s_j track rho * n_j (Poisson-like noise around the fit)
    nj = np.bincount(R.indices, minlength=R.shape[1])
    sj = np.bincount(out.ratings.indices[out.virtual.data], minlength=R.shape[1])
    big = nj >= 20
    assert np.corrcoef(nj[big], sj[big])[0, 1] > 0.95
    uni = SamplingDefense(rho=1).on_client_data(ClientData.from_ratings(R), np.random.default_rng(0))
    pop_uniform = item_set_guess(_sets(uni.ratings), _sets(R), 1.0, "popularity")["precision"]
    pop_matched = item_set_guess(_sets(out.ratings), _sets(R), 1.0, "popularity")["precision"]
    assert pop_uniform > 0.65 and abs(pop_matched - 0.5) < 0.05


def test_item_set_guess_strategies():
    R = _ratings(200, 300, seed=5)
    out = SamplingDefense(rho=1).on_client_data(ClientData.from_ratings(R), np.random.default_rng(0))
    nj = np.bincount(R.indices, minlength=R.shape[1])
    for strategy in ("popularity", "rarity", "counts", "cooccurrence", "lowrank", "lowrank_centered"):
        res = item_set_guess(_sets(out.ratings), _sets(R), 1.0, strategy, item_counts=nj)
        assert 0.3 < res["precision"] < 0.7  # unstructured data: nothing to exploit
    with pytest.raises(ValueError, match="item_counts"):
        item_set_guess(_sets(out.ratings), _sets(R), 1.0, "counts")
    with pytest.raises(ValueError, match="strategy"):
        item_set_guess(_sets(out.ratings), _sets(R), 1.0, "oracle")


def test_invalid_matched_params():
    with pytest.raises(PrivauditError, match="matched_groups"):
        SamplingDefense(distribution="matched", matched_groups=0)
