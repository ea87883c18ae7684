"""ncf-interaction-inference: positives told from sampled negatives in FedNCF uploads."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from privaudit.attacks.ncf.interaction_inference import (  # noqa: E402
    NCFInteractionInference,
    implied_positives,
    upload_scores,
)
from privaudit.attacks.ncf.update_leak import NCFUpdateLeak  # noqa: E402
from privaudit.data import synthetic  # noqa: E402
from privaudit.metrics import roc_summary  # noqa: E402
from privaudit.protocols.fedncf import FedNCF  # noqa: E402
from privaudit.registry import get  # noqa: E402


@pytest.fixture(scope="module")
def ds():
    return synthetic(n_users=30, n_items=150, seed=1)


@pytest.fixture(scope="module", params=["gmf", "mlp"])
def run(ds, request):
    cfg = {"model": request.param, "global_rounds": 2, "clients_per_round": 30, "record_rounds": -1}
    return FedNCF().run(ds, cfg, [], 0)


@pytest.fixture(scope="module")
def outcome(run):
    return NCFInteractionInference().evaluate(run.transcript, np.random.default_rng(0))


def test_implied_positives_matches_simulated_uploads():
    rng = np.random.default_rng(0)
    m, neg = 150, 4
    for k in (5, 12, 25):
        rows = [k + np.unique(rng.integers(0, m - k - 1, neg * k)).size for _ in range(200)]
        assert abs(implied_positives(round(float(np.mean(rows))), neg, m) - k) <= 1
    assert implied_positives(7, 0, m) == 7  # no negatives: every row is a positive


def test_upload_scores_split_a_rank_one_upload_and_orient_by_the_recipe():
    rng = np.random.default_rng(1)
    w = rng.standard_normal(12)
    label = np.zeros(50, dtype=bool)
    label[:10] = True  # 10 positives, 40 sampled negatives (negatives = 4)
    V = np.where(label[:, None], 1.0, -1.0) * rng.uniform(0.5, 2.0, (50, 1)) * w + 0.05 * rng.standard_normal((50, 12))
    s = upload_scores(V, 4, 1000)
    assert ((s > 0) == label).all()
    # the sign of the singular vector is arbitrary: the recipe (about a fifth of the rows are
    # positives) orients it, so the same upload with every row flipped gets the same split
    assert ((upload_scores(-V, 4, 1000) > 0) == label).all()
    assert (upload_scores(V, 0, 1000) == 1).all()


def test_beats_popularity_prior_and_update_leak(run, outcome):
    out = outcome
    leak = NCFUpdateLeak().evaluate(run.transcript, np.random.default_rng(0))
    m, prior = out.metrics, out.baseline_prior
    assert m["victims"] == 30
    # the strongest trivial guess from one upload is "everything uploaded" (ncf-update-leak, F1 ~0.37);
    # the popularity prior reaches F1 ~0.3 here
    assert m["f1"] - max(prior["f1"], leak.metrics["f1"]) > 0.4
    d = out.decisions["positive"]
    assert d.groups is not None and d.groups.max() == 29 and d.scores.size == 30 * 150
    roc = roc_summary(d.labels, d.scores)
    assert roc["auc"] > 0.97 and roc["tpr@0.01"] > 0.8


def test_victim_table_agrees_with_score_and_prior(outcome):
    out = outcome
    vt = out.victims
    for metric in ("precision", "recall"):
        assert vt.value(metric) == pytest.approx(out.metrics[metric])
        assert vt.value(metric, "prior") == pytest.approx(out.baseline_prior[metric])


def test_more_uploads_do_not_hurt_and_unsupported_under_secagg(ds, run):
    t = run.transcript
    one = NCFInteractionInference(rounds=1, candidates=0).evaluate(t, np.random.default_rng(0)).metrics["f1"]
    both = NCFInteractionInference(rounds=-1, candidates=0).evaluate(t, np.random.default_rng(0)).metrics["f1"]
    assert both >= one - 0.01
    masked = FedNCF().run(ds, {"global_rounds": 1, "clients_per_round": 30}, [get("defense", "secagg")()], 0)
    out = NCFInteractionInference().evaluate(masked.transcript, np.random.default_rng(0))
    assert not out.reconstruction.supported and out.metrics == out.baseline


@pytest.mark.slow
def test_ml100k_fedgmf_one_upload_per_client(ml100k_path):
    from privaudit.data import load_dataset

    ds = load_dataset(ml100k_path)
    # the first 10 cohorts of 20 users (200 clients, one upload each), lr 1e-3 as in the paper
    cfg = {"lr": 1e-3, "global_rounds": 1, "max_rounds": 10, "record_rounds": 10}
    t = FedNCF().run(ds, cfg, [], 0).transcript
    out = NCFInteractionInference().evaluate(t, np.random.default_rng(0))
    assert out.metrics["victims"] == 200
    assert out.metrics["f1"] - out.baseline_prior["f1"] > 0.5
    d = out.decisions["positive"]
    assert roc_summary(d.labels, d.scores)["tpr@0.01"] > 0.95


def test_ldp_defense_clips_and_noises_only_item_rows():
    from privaudit.defenses.base import UploadBatch

    class Channel:
        rng = np.random.default_rng(0)
        transcript = None

    ldp = get("defense", "ldp-interactions")(sigma=0.0, clip=1.0)
    rows = {"items": np.array([3, 7]), "values": np.array([[3.0, 4.0], [0.3, 0.4]])}
    net = {"delta": np.array([5.0, 5.0]), "n_instances": np.array([10.0])}
    out = ldp.on_upload(UploadBatch(0, "item_update", ["client:0"], [rows]), Channel())
    assert np.allclose(out.payloads[0]["values"], [[0.6, 0.8], [0.3, 0.4]])  # norm 5 -> 1, norm 0.5 kept
    assert ldp.on_upload(UploadBatch(0, "net_update", ["client:0"], [net]), Channel()).payloads[0] is net
    noisy = get("defense", "ldp-interactions")(sigma=0.1).on_upload(
        UploadBatch(0, "item_update", ["client:0"], [{"items": np.arange(2000), "values": np.zeros((2000, 4))}]),
        Channel(),
    )
    assert np.std(noisy.payloads[0]["values"]) == pytest.approx(0.1, rel=0.05)


def test_ldp_noise_trades_the_attack_for_utility():
    ds = synthetic(n_users=100, n_items=200, seed=1)
    cfg = {"model": "gmf", "lr": 0.01, "global_rounds": 4, "record_rounds": 5}
    f1, hr = {}, {}
    for sigma in (0.0, 0.3):
        res = FedNCF().run(ds, cfg, [get("defense", "ldp-interactions")(sigma=sigma)], 0)
        out = NCFInteractionInference().evaluate(res.transcript, np.random.default_rng(0))
        f1[sigma] = out.metrics["f1"] - out.baseline_prior["f1"]
        hr[sigma] = res.utility["hr@10"]
    assert f1[0.0] > 0.4 and f1[0.3] < 0.1  # the noise hides the direction of the rows
    assert hr[0.3] < hr[0.0] - 0.15  # measured 0.36 -> 0.11 (100 held-out items)


def test_mlp_gradient_directions_beat_the_svd_direction():
    ds = synthetic(n_users=60, n_items=200, seed=1)
    t = FedNCF().run(ds, {"model": "mlp", "lr": 1e-3, "global_rounds": 1}, [], 0).transcript
    grad = NCFInteractionInference().evaluate(t, np.random.default_rng(0))
    svd = NCFInteractionInference(candidates=0).evaluate(t, np.random.default_rng(0))
    assert svd.reconstruction.meta["gradient_uploads"] == 0 < grad.reconstruction.meta["gradient_uploads"]
    tpr = {}
    for key, out in (("grad", grad), ("svd", svd)):
        tpr[key] = roc_summary(out.decisions["positive"].labels, out.decisions["positive"].scores)["tpr@0.01"]
    # measured: F1 0.865 -> 0.891, TPR at 1 % FPR 0.83 -> 0.89
    assert grad.metrics["f1"] > svd.metrics["f1"] + 0.01 and tpr["grad"] > tpr["svd"] + 0.03


def test_support_only_baseline_and_both_tpr_conventions(run, outcome):
    """Two leaks, separated: which rows were uploaded (ranked by popularity: the support-only
    guess) and how they moved (the attack's gain over it); TPR at low FPR over all items (the
    never-uploaded items are trivial negatives) and over the uploaded rows only."""
    m, prior = outcome.metrics, outcome.baseline_prior
    # the uploads hold every positive: ranking them by popularity beats the message-free prior
    assert m["support_f1"] > prior["f1"] + 0.05 and m["support_precision"] > prior["precision"]
    assert m["f1_over_support"] == pytest.approx(m["f1"] - m["support_f1"])
    assert m["f1_over_support"] > 0.2  # the direction of the rows adds to the support
    every, uploaded = outcome.decisions["positive"], outcome.decisions["uploaded"]
    assert "all items" in every.positive and "uploaded rows" in uploaded.positive
    assert uploaded.labels.size < every.labels.size and uploaded.labels.sum() == every.labels.sum()
    roc_all, roc_up = (roc_summary(d.labels, d.scores) for d in (every, uploaded))
    assert roc_all["tpr@0.01"] >= roc_up["tpr@0.01"] - 1e-12  # the easy negatives only help
    assert roc_up["auc"] > 0.9
