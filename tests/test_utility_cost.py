"""A defense's utility cost from a paired bootstrap over users (issue 35, item 6): the per-user
contributions the protocols return, the bootstrap against hand-computed values, the pooling over
seeds, the labels, and one seed carrying an interval end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privaudit import metrics
from privaudit import results as rs
from privaudit.results.stats import combine_seeds
from privaudit.results.utility import UTILITY_RUN_INFLATION, UserUtility, cost_label, interval_labels, paired_bootstrap

Z95 = 1.959963984540054


def test_paired_bootstrap_of_a_mean_matches_the_hand_computed_standard_error():
    # NDCG per user: the defense loses users 2, 3, 4 (1 -> 0), the others unchanged.
    ref = UserUtility.means([1, 1, 1, 1, 1, 0, 0, 0, 0, 0])
    dfd = UserUtility.means([1, 1, 0, 0, 0, 0, 0, 0, 0, 0])
    out = paired_bootstrap(ref, dfd, higher_is_better=True, replicates=20_000)
    # cost = mean of the paired differences d = (0,0,1,1,1,0,0,0,0,0) = 0.3; the bootstrap SE of a
    # mean of n values is sqrt(sum (d - mean)^2 / n^2) = sqrt(10 * 0.21 / 100) = 0.14491
    assert out["cost"] == pytest.approx(0.3, abs=1e-12) and out["n"] == 10 and out["over"] == "users"
    assert out["se"] == pytest.approx(math.sqrt(0.021), rel=0.03)
    # unpaired arms would see sqrt(var_ref/n + var_def/n) = sqrt(0.025 + 0.016) = 0.2025: pairing matters
    assert out["se"] < 0.17
    # lower is better (an error metric): the sign flips
    assert paired_bootstrap(ref, dfd, higher_is_better=False)["cost"] == pytest.approx(-0.3)


def test_paired_bootstrap_of_an_rmse_is_the_ratio_of_sums_with_its_delta_method_error():
    rng = np.random.default_rng(3)
    n = 400
    counts = rng.integers(1, 30, n).astype(float)
    sq_ref = counts * rng.gamma(2.0, 0.5, n)
    sq_def = sq_ref + counts * rng.gamma(2.0, 0.1, n)  # the defense adds error
    ref = UserUtility.sums(sq_ref, counts, root=True)
    dfd = UserUtility.sums(sq_def, counts, root=True)
    out = paired_bootstrap(ref, dfd, higher_is_better=False, replicates=4000)
    r_ref, r_def = math.sqrt(sq_ref.sum() / counts.sum()), math.sqrt(sq_def.sum() / counts.sum())
    assert ref.value() == pytest.approx(r_ref) and out["cost"] == pytest.approx(r_def - r_ref, abs=1e-12)
    # delta method: RMSE = sqrt(S / C); user i's influence on it is (s_i - R c_i) / (2 RMSE c_bar)
    cbar = counts.mean()
    infl = (sq_def - r_def**2 * counts) / (2 * r_def * cbar) - (sq_ref - r_ref**2 * counts) / (2 * r_ref * cbar)
    assert out["se"] == pytest.approx(infl.std() / math.sqrt(n), rel=0.1)


def test_pairing_needs_the_same_units_and_enough_of_them():
    a = UserUtility.means(np.linspace(0, 1, 12))
    assert paired_bootstrap(a, UserUtility.means(np.linspace(0, 1, 11))) is None  # not the same users
    assert paired_bootstrap(a, UserUtility.sums(np.ones(12), np.ones(12), root=True)) is None  # not the same metric
    few = UserUtility.means([0.1, 0.2, np.nan, np.nan, 0.3, 0.4, 0.5, 0.6, 0.7, np.nan, np.nan, 0.8])
    assert few.units == 8 and paired_bootstrap(few, few) is None  # fewer than MIN_UTILITY_UNITS (10)


def test_stored_contributions_round_trip_and_malformed_ones_cost_only_the_interval():
    mean = UserUtility.means([0.5, np.nan, 0.25])
    assert mean.to_json() == {"values": [0.5, None, 0.25], "over": "users"}
    back = UserUtility.from_json(mean.to_json())
    assert back.value() == pytest.approx(0.375) and back.units == 2
    ratio = UserUtility.sums([2.0, 8.0], [1, 3], root=True, over="groups")
    assert UserUtility.from_json(ratio.to_json()).value() == pytest.approx(math.sqrt(10 / 4))
    for bad in (None, [], {"values": "x"}, {"num": [1.0], "den": [1.0, 2.0]}, {"num": [1.0], "den": [-1.0]}):
        assert UserUtility.from_json(bad) is None
    ref, val = {"0": 0.30}, {"0": 0.20}
    cost = rs.utility_cost_interval(ref, val, "ndcg@10", None, {"0": {"values": "broken"}}, {"0": None})
    assert cost["cost"] == pytest.approx(0.1) and math.isnan(cost["low"])
    assert cost["method"] == "no interval: one seed without per-user utility"
    few = {"values": [0.3] * 8}  # 8 users: fewer than 10
    cost = rs.utility_cost_interval(ref, val, "ndcg@10", None, {"0": few}, {"0": few})
    assert cost["method"] == "no interval: one seed, 8 users (fewer than 10)" and cost_label(cost) == "no interval"


def _seed_users(rng, shift):
    base = rng.uniform(0, 1, 60)
    return UserUtility.means(base), UserUtility.means(np.clip(base - shift + rng.normal(0, 0.05, 60), 0, 1))


def test_one_seed_gets_an_interval_and_seeds_pool_like_the_attack_advantages():
    rng = np.random.default_rng(0)
    (r0, d0), (r1, d1) = _seed_users(rng, 0.10), _seed_users(rng, 0.02)
    ref = {"0": r0.value(), "1": r1.value()}
    val = {"0": d0.value(), "1": d1.value()}
    one = rs.utility_cost_interval({"0": ref["0"]}, {"0": val["0"]}, "ndcg@10", None, {"0": r0}, {"0": d0})
    b0 = paired_bootstrap(r0, d0)
    assert one["seeds"] == 1 and one["n"] == 60
    assert one["method"] == "paired bootstrap over 60 users, SE x2.1 for run-level variance, 1 seed"
    # one seed: the bootstrap SE times the run-level inflation (the run is not resampled)
    assert one["low"] == pytest.approx(b0["cost"] - Z95 * UTILITY_RUN_INFLATION * b0["se"]) and one["high"] > one["low"]
    assert one["resolved"] and cost_label(one) == "costs"  # 0.10 lost: resolved from one seed
    two = rs.utility_cost_interval(ref, val, "ndcg@10", None, {"0": r0, "1": r1}, {"0": d0, "1": d1})
    b1 = paired_bootstrap(r1, d1)
    k = UTILITY_RUN_INFLATION
    mean, se = combine_seeds([b0["cost"], b1["cost"]], [k * b0["se"], k * b1["se"]])
    assert two["cost"] == pytest.approx(mean) and two["se"] == pytest.approx(se)
    assert two["low"] == pytest.approx(mean - Z95 * se) and two["high"] == pytest.approx(mean + Z95 * se)
    assert two["method"] == "paired bootstrap over 60 users and between seeds, SE x2.1 for run-level variance, 2 seeds"
    # the seeds differ (0.10 vs 0.02 lost): the between-seed term widens the interval beyond the within part
    assert se > k * math.sqrt((b0["se"] ** 2 + b1["se"] ** 2) / 4)


def test_labels_within_noise_only_when_the_whole_interval_is_inside_the_margin():
    def cost(low, high, margin=0.01):
        return interval_labels({"cost": (low + high) / 2, "low": low, "high": high, "margin": margin})

    assert cost_label(cost(-0.005, 0.008)) == "within noise"
    assert cost_label(cost(0.002, 0.008)) == "within noise"  # resolved but negligible: inside the margin
    assert cost_label(cost(0.004, 0.03)) == "costs"  # excludes 0, reaches beyond the margin
    assert cost_label(cost(-0.03, -0.02)) == "costs"  # a gain is resolved too (negative cost)
    assert cost_label(cost(-0.005, 0.03)) == "not resolved"  # holds 0, wider than the margin
    assert cost_label({"cost": 0.1, "low": math.nan, "high": math.nan}) == "no interval"


def test_metric_functions_return_the_per_user_values_of_their_mean():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(30, 40))
    rel = rng.random((30, 40)) < 0.1
    rel[3] = False  # a user without relevant items: NaN, left out of the mean
    out, users = metrics.ranking_metrics_at_k(scores, rel, k=5, by_user=True)
    assert out == metrics.ranking_metrics_at_k(scores, rel, k=5)
    assert math.isnan(users["ndcg"][3]) and np.nanmean(users["ndcg"]) == pytest.approx(out["ndcg"])
    assert np.nanmean(users["recall"]) == pytest.approx(out["recall"])
    value, ap = metrics.map_at_k(scores, rel, k=5, by_user=True)
    assert np.nanmean(ap) == pytest.approx(value) and value == metrics.map_at_k(scores, rel, k=5)
    weights = rel * rng.uniform(1, 5, rel.shape)
    value, (num, den) = metrics.mean_rank(scores, weights, by_user=True)
    assert num.sum() / den.sum() == pytest.approx(value) and den[3] == 0
    target = rng.integers(0, 40, 30)
    hr, hits = metrics.hit_ratio_at_k(scores, target, 10, by_user=True)
    ndcg, gains = metrics.ndcg_at_k_loo(scores, target, 10, by_user=True)
    assert hits.mean() == hr == metrics.hit_ratio_at_k(scores, target, 10) and gains.mean() == ndcg
    y, p = rng.integers(1, 6, 50).astype(float), rng.uniform(1, 5, 50)
    who = rng.integers(0, 7, 50)
    sq, ab, count = metrics.error_sums_by_user(y, p, who, 8)
    assert count[7] == 0 and count.sum() == 50
    assert math.sqrt(sq.sum() / count.sum()) == pytest.approx(metrics.rmse(y, p))
    assert ab.sum() / count.sum() == pytest.approx(metrics.mae(y, p))
    with pytest.raises(ValueError, match="users out of range"):
        metrics.error_sums_by_user(y, p, who, 5)
    with pytest.raises(ValueError, match="one entry per rating"):
        metrics.error_sums_by_user(y, p, who[:3], 8)


@pytest.mark.parametrize(
    "name, config, metric, over",
    [
        ("fedmvmf", {"epochs": 2}, "ndcg@10", "users"),
        ("fedrec", {"T": 2}, "rmse", "users"),
        ("fedncf", {"global_rounds": 1}, "hr@10", "users"),
        ("fedsplit", {"n_iter": 10, "centralized": False}, "rmse", "groups"),
    ],
)
def test_protocols_return_contributions_that_make_their_reported_utility(name, config, metric, over):
    from privaudit import registry
    from privaudit.data import synthetic

    result = registry.get("protocol", name)().run(synthetic(n_users=60, n_items=80, seed=1), config, (), 0)
    per = result.user_utility[metric]
    assert per.over == over and per.units >= 4
    assert per.value() == pytest.approx(result.utility[metric], rel=1e-12)


def test_fedproto_contributions_make_map_rmse_and_mean_rank():
    from privaudit.protocols.fedproto import recommendation_metrics

    rng = np.random.default_rng(2)
    import scipy.sparse as sp

    train = sp.csr_matrix((rng.random((12, 20)) < 0.3) * rng.integers(1, 6, (12, 20)).astype(float))
    test = sp.csr_matrix((rng.random((12, 20)) < 0.15) * rng.integers(1, 6, (12, 20)).astype(float))
    test = test - test.multiply(train != 0)
    test.eliminate_zeros()
    per: dict = {}
    out = recommendation_metrics(rng.uniform(1, 5, (12, 20)), train, test, 5, per)
    for m in ("rmse", "mean_rank", "map@5"):
        assert per[m].value() == pytest.approx(out[m], rel=1e-12)


def test_one_seed_of_a_dp_sweep_carries_a_utility_interval_end_to_end(tmp_path):
    from privaudit import experiment as ex
    from privaudit.reports import write_report

    res = ex.build_experiment(
        protocol="fedmvmf",
        defenses=["dp-gaussian"],
        sweep="dp-gaussian.noise_multiplier=1",
        users=120,
        seeds=1,
    ).run()
    point, ref = res["points"][0], res["reference"][0]
    assert set(point["utility_users"]) == {"ndcg@10"} and "values" in point["utility_users"]["ndcg@10"]
    row = res["verdicts"][0]["rows"][0]
    cost = row["utility_cost"]
    assert cost["cost"] == pytest.approx(ref["utility"]["ndcg@10"] - point["utility"]["ndcg@10"])
    assert math.isfinite(cost["low"]) and cost["low"] < cost["cost"] < cost["high"]
    assert cost["method"].startswith("paired bootstrap over ") and cost["method"].endswith("variance, 1 seed")
    assert cost["label"] in ("within noise", "costs", "not resolved")
    assert f"Utility (ndcg@10) cost {rs.fmt(cost['cost'], 4)} [" in res["verdicts"][0]["detail"]
    write_report(res, tmp_path / "out")  # results.json validates against schema 2 (conftest)
