"""Every built-in attack against its prior-only baseline; metric specs; per-record decisions."""

from __future__ import annotations

import numpy as np
import pytest

from privaudit.attacks.mvmf._core import prior_baselines, prior_table
from privaudit.data import synthetic
from privaudit.metrics import roc_summary
from privaudit.registry import available, get
from privaudit.results import Decisions, MetricSpec
from privaudit.transcript import Transcript

BUILT_IN = (
    "mvmf-analytic",
    "mvmf-nonlinear",
    "mvmf-aggregate",
    "fedsplit-inference",
    "ncf-update-leak",
    "ncf-kanon-linking",
    "fedrec-rated-items",
    "proto-membership",
)


@pytest.fixture(scope="module")
def mvmf_ds():
    return synthetic(n_users=60, n_items=80, seed=4)


@pytest.fixture(scope="module")
def plain(mvmf_ds):
    return get("protocol", "fedmvmf")().run(mvmf_ds, {"K": 6, "epochs": 3}, [], 0).transcript


def test_every_built_in_attack_declares_its_metrics(plain):
    assert set(BUILT_IN) <= set(available("attack"))
    for name in BUILT_IN:
        specs = get("attack", name).metric_specs
        assert specs and all(isinstance(s, MetricSpec) and s.description for s in specs.values()), name
        assert get("attack", name).primary_metric in specs, name
    specs = get("attack", "fedsplit-inference").metric_specs
    assert specs["relative_error"].higher_is_better is False and specs["n_groups"].plotted is False
    assert get("attack", "mvmf-analytic").metric_specs["victims"].plotted is False
    # every metric mvmf-analytic returns is declared
    out = get("attack", "mvmf-analytic")().evaluate(plain, np.random.default_rng(0))
    assert set(out.metrics) <= set(get("attack", "mvmf-analytic").metric_specs)
    assert set(out.baseline_prior) == set(out.metrics)


def _tiny_mvmf(ratings: dict[int, dict[int, float]], attributes: dict[int, list[float]]) -> Transcript:
    """A FedMVMF-shaped transcript: client k uploads the items of ``ratings[k]`` (ObsOnly, scale 1..3)."""
    t = Transcript("fedmvmf", {"rating_min": 1, "rating_max": 3, "unrated": "obsonly"})
    t.parties = ["server"] + [f"client:{k}" for k in ratings]
    for k, r in ratings.items():
        party = f"client:{k}"
        items = np.array(sorted(r), dtype=np.int64)
        payload = {"items": items, "ratings": np.array([r[i] for i in items]), "attributes": np.array(attributes[k])}
        t.add(0, party, party, "private", payload)
        t.add(0, party, "server", "grad_V", {"items": items, "values": np.zeros((len(items), 2))})
    return t


def test_mvmf_prior_library_is_chosen_on_held_out_victims():
    """Hand-checked: clients 0-2 rate item 0 a 3 and item 1 a 1; client 3 rates them 2, 2 and item 2 a 3.

    Leave-victim-out global majority: 3 for clients 0-2 (1 hit of 2 each), a 1/3 tie for client 3
    (lower value: 0 hits of 3). Per-item majority of the other users: 2 hits for clients 0-2, 0 for
    client 3 (its items' others say 3, 1; item 2 has no other rater: the marginal's 1; the same for
    any number of pseudo-ratings from the others' marginal up to 4, the fitted one). Folds {0, 2}
    and {1, 3}: each chooses "item" on the other (2 > 1 and 4 > 2), so 6 / 9.
    """
    ratings = {0: {0: 3, 1: 1}, 1: {0: 3, 1: 1}, 2: {0: 3, 1: 1}, 3: {0: 2, 1: 2, 2: 3}}
    attributes = {0: [1, 0], 1: [1, 0], 2: [1, 1], 3: [0, 0]}
    t = _tiny_mvmf(ratings, attributes)
    table = prior_table(t)
    assert table.victims == [f"client:{k}" for k in range(4)]
    assert table.pseudo["rating_accuracy"] <= 4.0
    assert table.choice["rating_accuracy"] == ("item", "item")
    assert table.hits["rating_accuracy"].tolist() == [2, 2, 2, 0]
    prior = prior_baselines(t)
    assert prior["rating_accuracy"] == pytest.approx(6 / 9)  # the global majority alone: 3 / 9
    assert prior["rated_detection_accuracy"] == 1.0  # ObsOnly: every uploaded item is rated
    # attributes: per column, the other users' majority gives 2, 2, 1, 1 hits; one dummy value for
    # all columns 1, 1, 0, 0: each fold picks "column" on the other (3 > 1)
    assert table.choice["attribute_accuracy"] == ("column", "column")
    assert prior["attribute_accuracy"] == pytest.approx(6 / 8)
    # the decoder's prior for client 3 (fold 1, "item"): the other users' value on items 0, 1,
    # and the other users' marginal (1 and 3 tied, the lower first) on item 2
    pred = table.predictive("rating_accuracy", np.array([3, 3, 3]), np.array([0, 1, 2]))
    assert np.argmax(pred, axis=1).tolist() == [2, 0, 0]  # 3, 1, and the marginal's 1 (values 1..3)


def test_mvmf_prior_beats_the_global_majority_on_synthetic(plain):
    prior = prior_baselines(plain)
    ratings = np.concatenate([plain.private(p)["ratings"] for p in plain.parties if p.startswith("client:")])
    _, counts = np.unique(ratings, return_counts=True)
    assert prior["rating_accuracy"] > counts.max() / counts.sum() + 0.02  # per-item marginals help
    X = np.stack([plain.private(p)["attributes"] for p in plain.parties if p.startswith("client:")])
    share = X.mean(axis=0)
    assert prior["attribute_accuracy"] == pytest.approx(np.mean(np.maximum(share, 1 - share)), abs=0.01)
    out = get("attack", "mvmf-analytic")().evaluate(plain, np.random.default_rng(0))
    assert out.baseline["rating_accuracy"] == 0.2 < prior["rating_accuracy"]
    assert out.metrics["rating_accuracy"] == 1.0 and out.metrics["attribute_accuracy"] == 1.0  # noise-free: exact


def test_sums_of_a_whole_round_leak_nothing_beyond_the_prior(plain):
    """One cohort of every client (PrivMVMF's sum over all senders): the attack falls back to the
    prior library's guesses for the members it cannot separate, which score exactly as the prior."""
    out = get("attack", "mvmf-aggregate")(cohort_size=10_000).evaluate(plain, np.random.default_rng(0))
    assert out.reconstruction.meta["uninformed_guesses"] >= 50  # a few members have an item of their own
    vt = out.victims
    same = np.flatnonzero(
        [out.reconstruction.victims[p].get("rated") is not None for p in vt.victims]
    )  # the members given the prior's guesses
    assert len(same) == out.reconstruction.meta["uninformed_guesses"]
    for m in ("rating_accuracy", "attribute_accuracy"):
        assert np.array_equal(vt.attack[m][same], vt.prior[m][same]), m
        assert abs(out.metrics[m] - out.baseline_prior[m]) <= 0.03, m
    assert out.metrics["attribute_accuracy"] > out.baseline["attribute_accuracy"]  # above the random 0.5


def test_inclunc_rated_decisions_are_exact_without_noise(mvmf_ds):
    t = get("protocol", "fedmvmf")().run(mvmf_ds, {"K": 6, "epochs": 3, "unrated": "inclunc"}, [], 0).transcript
    out = get("attack", "mvmf-analytic")().evaluate(t, np.random.default_rng(0))
    dec = out.decisions["rated"]
    assert isinstance(dec, Decisions) and dec.labels.sum() > 0 and (~dec.labels).sum() > 0
    assert roc_summary(dec.labels, dec.scores)["auc"] == 1.0
    prior = out.baseline_prior
    # "unrated" is the majority; per-item popularity does a little better than that constant
    assert 1.0 - dec.labels.mean() <= prior["rated_detection_accuracy"] < 1.0 - dec.labels.mean() + 0.03
    assert out.metrics["rated_detection_accuracy"] == 1.0 > prior["rated_detection_accuracy"]


def test_mvmf_attack_beats_its_prior_under_dp_laplace_epsilon_100():
    """Default synthetic fedmvmf at dp-laplace epsilon = 100 per round: nearly every grad_V row is
    clipped (censored); the clipping-aware decoder stays above the majority rating."""
    ds = synthetic()
    t = (
        get("protocol", "fedmvmf")()
        .run(ds, {}, [get("defense", "dp-laplace")(epsilon=100.0, clip_per="row")], 0)
        .transcript
    )
    out = get("attack", "mvmf-analytic")().evaluate(t, np.random.default_rng(0))
    meta = out.reconstruction.meta
    assert meta["clipping"] == "dp-laplace" and meta["clipped_row_share"] > 0.9
    assert out.metrics["rating_accuracy"] > out.baseline_prior["rating_accuracy"] + 0.05
    assert out.metrics["attribute_accuracy"] > out.baseline_prior["attribute_accuracy"] + 0.1


def test_fedsplit_prior_uses_the_auxiliary_ratings():
    ds = synthetic(n_users=80, n_items=60, seed=1)
    t = get("protocol", "fedsplit")().run(ds, {}, [], 0).transcript
    out = get("attack", "fedsplit-inference")(aux_fraction=0.5).evaluate(t, np.random.default_rng(0))
    prior = out.baseline_prior
    assert set(prior) == set(out.metrics)
    assert prior["relative_error"] < prior["relative_error_unknown"]  # the known half is exact
    assert out.metrics["relative_error_unknown"] < prior["relative_error_unknown"]


@pytest.fixture(scope="module")
def ncf_run():
    pytest.importorskip("torch")
    ds = synthetic(n_users=30, n_items=150, seed=1)
    cfg = {"global_rounds": 4, "clients_per_round": 30, "record_rounds": -1}
    return get("protocol", "fedncf")().run(ds, cfg, [], 0)


def test_ncf_update_leak_beats_popularity_and_has_decisions(ncf_run):
    out = get("attack", "ncf-update-leak")(rounds=4).evaluate(ncf_run.transcript, np.random.default_rng(0))
    prior = out.baseline_prior
    assert 0 < prior["precision"] < 1 and prior["victims"] == 30
    assert out.metrics["precision"] > prior["precision"] + 0.3
    dec = out.decisions["positive"]
    assert dec.labels.size == 30 * 150
    assert roc_summary(dec.labels, dec.scores)["auc"] > 0.95


def _leave_one_out_top_share(t, rho: float) -> float:
    """Accuracy of marking each client's round(n / (1 + rho)) uploads with the most other raters."""
    raters = {p: set(t.private(p)["items"].tolist()) for p in t.parties if p.startswith("client:")}
    last = max(m.round for m in t.select("grad_V"))
    hits = total = 0
    for m in t.select("grad_V", round=last):
        items = m.payload["items"].tolist()
        pop = [sum(i in s for q, s in raters.items() if q != m.sender) for i in items]
        order = sorted(range(len(items)), key=lambda j: -pop[j])  # stable: ties keep upload order
        marked = set(order[: int(len(items) / (1 + rho) + 0.5)])
        hits += sum((j in marked) == (items[j] in raters[m.sender]) for j in range(len(items)))
        total += len(items)
    return hits / total


def test_fedrec_prior_is_the_popularity_top_share():
    ds = synthetic(120, 150, seed=3)
    t = get("protocol", "fedrec")().run(ds, {"T": 6}, [get("defense", "sampling")(rho=2, filling="ua")], 1).transcript
    out = get("attack", "fedrec-rated-items")().evaluate(t, np.random.default_rng(0))
    prior = out.baseline_prior
    top = _leave_one_out_top_share(t, 2.0)
    assert top > 2 / 3 + 0.03  # beats the better constant ("all virtual")
    assert prior["accuracy"] == pytest.approx(top, abs=1e-12)  # chosen on both halves
    assert 0.5 < prior["auc"] < 0.8  # uniform sampling: popular items are more often real
    assert out.metrics["auc"] > prior["auc"] + 0.15
    dec = out.decisions["rated"]
    assert roc_summary(dec.labels, dec.scores)["auc"] == pytest.approx(out.metrics["auc"])
    assert dec.groups.max() + 1 == len(out.victims.victims)


@pytest.mark.parametrize("rho, accuracy", [(1, 0.699), (2, 0.740), (3, 0.777)])
def test_fedrec_prior_accuracy_on_the_default_synthetic_run(rho, accuracy):
    """docs/verdicts.md's rows: the constant prior said 0.500 / 0.667 / 0.750; marking each
    client's top 1/(1+rho) uploads by leave-one-out popularity is stronger (tolerance: the
    3 decimals the docs print)."""
    sampling = get("defense", "sampling")(rho=rho, filling="ua")
    t = get("protocol", "fedrec")().run(synthetic(), {}, [sampling], 0).transcript
    prior = get("attack", "fedrec-rated-items")().prior_baseline(t, {})
    assert prior["accuracy"] == pytest.approx(accuracy, abs=5e-4)
    assert prior["accuracy"] > max(1 / (1 + rho), rho / (1 + rho))


def test_proto_membership_prior_without_prototypes():
    ds = synthetic(n_users=150, n_items=80, seed=3)
    cfg = {"prototypes": "random", "latent_dim": 5, "max_iter": 100}
    t = get("protocol", "fedproto")().run(ds, cfg, [], 0).transcript
    out = get("attack", "proto-membership")().evaluate(t, np.random.default_rng(7))
    prior = out.baseline_prior
    assert set(prior) == set(out.metrics)
    assert 0.3 < prior["auc"] < 0.75
    assert out.metrics["auc"] > prior["auc"] + 0.2  # random rows as prototypes: members are found
    dec = out.decisions["member"]
    assert dec.labels.any() and (~dec.labels).any()
