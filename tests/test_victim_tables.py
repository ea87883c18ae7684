"""Per-victim tables (``Attack.victim_table``) and ``Decisions.groups`` of the non-MVMF attacks:
the table's ratios equal what ``score`` and ``prior_baseline`` report."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privaudit.attacks.generic._uploads import cross_fit, loo_counts
from privaudit.attacks.ncf.update_leak import popularity_strategies
from privaudit.data import synthetic
from privaudit.registry import get
from privaudit.transcript import Transcript

ATTRIBUTES = ["gender=f", "gender=m", "age=young", "age=mid", "age=old"]


def plain_mf_transcript(n_clients: int = 16, m: int = 40, k: int = 4, seed: int = 0) -> Transcript:
    """Clients that take one plain-MF gradient step (lr 0.05, lam 0.01) on their rated items
    in each of two rounds and upload the row deltas (``item_update``), as a recorder writes it.
    Items 0-9 are rated by most clients (shared popularity), the rest sparsely."""
    rng = np.random.default_rng(seed)
    lr, lam = 0.05, 0.01
    clients = [f"client:{c}" for c in range(n_clients)]
    t = Transcript("flower", {"lr": lr, "lam": lam, "n_items": m, "attribute_names": ATTRIBUTES}, seed, {}, ["server"])
    t.parties += clients
    V = rng.normal(0, 0.5, (m, k))
    item_level = rng.integers(1, 6, m)
    truth = {}
    for c, party in enumerate(clients):
        popular = np.flatnonzero(rng.random(10) < 0.8)
        rare = 10 + rng.choice(m - 10, size=4, replace=False)
        items = np.sort(np.concatenate([popular, rare]))
        noise = rng.integers(-1, 2, items.size) * (rng.random(items.size) < 0.4)
        ratings = np.clip(item_level[items] + noise, 1, 5).astype(float)
        attrs = np.zeros(len(ATTRIBUTES))
        attrs[c % 2] = 1.0  # gender alternates
        attrs[2 + (0 if c % 4 < 3 else 1 + c % 2)] = 1.0  # age: mostly "young"
        truth[party] = (items, ratings, rng.normal(0, 0.5, k))
        t.add(0, party, party, "private", {"items": items, "ratings": ratings, "attributes": attrs})
    for rnd in range(2):
        t.add(rnd, "server", "server", "state", {"V": V.copy()}, {"of": "model", "to": clients})
        new = V.copy()
        for party in clients:
            items, ratings, u = truth[party]
            err = ratings - V[items] @ u
            delta = lr * (err[:, None] * u[None, :] - lam * V[items])
            t.add(rnd, party, "server", "item_update", {"items": items, "values": delta})
            new[items] += delta / n_clients
        V = new
    return t


@pytest.fixture(scope="module")
def plain_mf():
    return plain_mf_transcript()


def _check(out) -> None:
    table = out.victims
    assert table is not None and len(table.victims) == len(set(table.victims)) >= 1
    for metric in [*table.weight, *table.harmonic]:
        for which, ref in (("attack", out.metrics), ("prior", out.baseline_prior)):
            got, want = table.value(metric, which), ref[metric]
            assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-12), (metric, which)
    for dec in out.decisions.values():
        assert dec.groups is not None and dec.groups.min() >= 0 and dec.groups.max() < len(table.victims)


def _fedrec():
    sampling = get("defense", "sampling")(rho=2, filling="ua")
    return get("protocol", "fedrec")().run(synthetic(60, 80, seed=2), {"T": 4}, [sampling], 0).transcript


def _fedncf():
    pytest.importorskip("torch")
    cfg = {"global_rounds": 2, "clients_per_round": 20, "record_rounds": -1}
    return get("protocol", "fedncf")().run(synthetic(n_users=20, n_items=60, seed=1), cfg, [], 0).transcript


def _fedncf_adversarial():
    pytest.importorskip("torch")
    cfg = {"global_rounds": 0, "selection": "adversarial", "manipulated_rounds": 2, "clients_per_round": 6}
    cfg["target"] = 3
    ds = synthetic(n_users=20, n_items=60, seed=1)
    return get("protocol", "fedncf")().run(ds, cfg, [get("defense", "secagg")()], 0).transcript


def _fedsplit():
    return get("protocol", "fedsplit")().run(synthetic(n_users=60, n_items=50, seed=1), {}, [], 0).transcript


def _fedproto():
    cfg = {"prototypes": "random", "latent_dim": 5, "max_iter": 50}
    return get("protocol", "fedproto")().run(synthetic(n_users=90, n_items=60, seed=3), cfg, [], 0).transcript


RUNS = {
    "fedrec-rated-items": (_fedrec, {}),
    "ncf-update-leak": (_fedncf, {"rounds": 2}),
    "ncf-kanon-linking": (_fedncf_adversarial, {}),
    "fedsplit-inference": (_fedsplit, {"aux_fraction": 0.5, "n_iter": 10}),
    "proto-membership": (_fedproto, {"n_members": 20, "n_calibration": 20}),
    "generic-trained-items": (plain_mf_transcript, {}),
    "generic-mf-ratings": (plain_mf_transcript, {}),
    "generic-attribute-inference": (plain_mf_transcript, {}),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_victim_table_agrees_with_score_and_prior(name):
    make, params = RUNS[name]
    out = get("attack", name)(**params).evaluate(make(), np.random.default_rng(0))
    assert out.reconstruction.supported, out.reconstruction.reason
    _check(out)


def test_cross_fit_scores_each_half_with_the_other_halfs_choice():
    weight = np.ones(4)
    strategies = {"a": {"hit": np.array([1.0, 0.0, 1.0, 0.0])}, "b": {"hit": np.array([0.0, 1.0, 0.0, 1.0])}}
    num, chosen = cross_fit(strategies, "hit", weight)
    # "a" wins on the even victims, so the odd ones are scored with it (and vice versa): 0 hits
    assert chosen == {"even": "b", "odd": "a"} and num["hit"].tolist() == [0.0, 0.0, 0.0, 0.0]
    num, chosen = cross_fit({"a": {"hit": np.ones(3)}, "b": {"hit": np.ones(3)}}, "hit", np.ones(3))
    assert chosen == {"even": "a", "odd": "a"}  # ties: the first listed


def test_loo_counts_leave_the_owner_out():
    keys = np.array([0, 0, 0, 1])
    levels = np.array([2, 2, 1, 0])
    owner = np.array([0, 1, 2, 0])
    counts = loo_counts(keys, levels, owner, np.array([0, 0, 1]), np.array([0, 2, 0]), 3)
    # owner 0 on key 0: owners 1, 2 gave levels 2 and 1; owner 2: owners 0, 1 gave 2, 2; key 1 had only owner 0
    assert counts.tolist() == [[0, 1, 1], [0, 0, 2], [0, 0, 0]]


def _majority(values: list[float]) -> float:
    levels, counts = np.unique(values, return_counts=True)
    return float(levels[np.argmax(counts)])  # ties: the lowest rating


def test_generic_mf_prior_is_the_per_item_majority_on_shared_items(plain_mf):
    """Items share a typical rating: the other clients' per-item majority (their overall one for
    an item nobody else rated) beats the overall majority; the one-step decode is exact."""
    out = get("attack", "generic-mf-ratings")().evaluate(plain_mf, np.random.default_rng(0))
    assert out.metrics["accuracy"] == 1.0 and out.metrics["claimed"] == 1.0
    rated = {
        p: dict(zip(plain_mf.private(p)["items"].tolist(), plain_mf.private(p)["ratings"].tolist()))
        for p in plain_mf.parties
        if p.startswith("client:")
    }
    hits = n = 0
    for p, mine in rated.items():
        others = [r for q, theirs in rated.items() if q != p for r in theirs.values()]
        for item, rating in mine.items():
            same_item = [theirs[item] for q, theirs in rated.items() if q != p and item in theirs]
            hits += _majority(same_item or others) == rating
            n += 1
    assert out.baseline_prior["accuracy"] == pytest.approx(hits / n, abs=1e-12)  # chosen on both halves
    overall = [r for theirs in rated.values() for r in theirs.values()]
    assert out.baseline_prior["accuracy"] > np.mean(np.asarray(overall) == _majority(overall)) + 0.1


def test_popularity_strategies_leave_the_client_out():
    t = Transcript("fedncf", {"n_items": 4}, 0, {}, ["server", "client:0", "client:1", "client:2"])
    for c, items in enumerate(([0, 1], [0, 2], [0, 1, 3])):
        t.add(0, f"client:{c}", f"client:{c}", "private", {"items": np.array(items)})
    s = popularity_strategies(t, ["client:0", "client:1", "client:2"])
    own, median = s["popularity top-k, own k"], s["popularity top-k, median k"]
    # client:1's others rated 0 twice, 1 twice, 3 once: its top 2 = {0, 1}, one hit of two
    # client:2's others rated 0 twice, 1 and 2 once: top 3 = {0, 1, 2} (own k), top 2 = {0, 1} (median of 2, 2)
    assert own["precision"].tolist() == pytest.approx([1.0, 0.5, 2 / 3])
    assert own["recall"].tolist() == pytest.approx([1.0, 0.5, 2 / 3])
    assert median["precision"].tolist() == pytest.approx([1.0, 0.5, 1.0])
    assert median["f1"].tolist() == pytest.approx([1.0, 0.5, 0.8])
