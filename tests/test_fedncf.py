"""FedNCF: batched client training equals the per-client loop; aggregation; transcript; DP-SGD."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from privaudit.data import synthetic  # noqa: E402
from privaudit.errors import MissingDependencyError, PrivauditError  # noqa: E402
from privaudit.models import ncf  # noqa: E402
from privaudit.protocols.fedncf import FedNCF  # noqa: E402

LAYERS = [48, 24, 12, 6]


@pytest.fixture(scope="module")
def tiny():
    return synthetic(n_users=40, n_items=120, seed=3)


@pytest.mark.parametrize("arch", ncf.ARCHS)
def test_batched_training_equals_per_client_loop(arch):
    rng = np.random.default_rng(0)
    D, C, L = 12, 6, 25
    Dt = ncf.item_dim(arch, D)
    net = ncf.init_network(arch, D, LAYERS, rng)
    items = np.stack([ncf.init_embeddings(L, Dt, rng) for _ in range(C)])
    users = ncf.init_embeddings(C, Dt, rng)
    n = rng.integers(5, 70, size=C)  # unequal local data: clients stop at different steps
    inst_item = rng.integers(L, size=(C, n.max()))
    labels = (rng.random((C, n.max())) < 0.2).astype(np.float32)
    index, valid = ncf.make_batches(n, 2, 8, rng)
    with ncf.single_thread():
        a = ncf.train_clients(arch, D, LAYERS, net, items, users, inst_item, labels, n, index, valid)
        b = ncf.train_clients_loop(arch, D, LAYERS, net, items, users, inst_item, labels, n, index, valid)
    np.testing.assert_array_equal(a["steps"], b["steps"])
    np.testing.assert_array_equal(a["steps"], 2 * -(-n // 8))
    np.testing.assert_allclose(a["items"], b["items"], atol=1e-6, rtol=0)
    np.testing.assert_allclose(a["users"], b["users"], atol=1e-6, rtol=0)
    for k in a["net"]:
        np.testing.assert_allclose(a["net"][k], b["net"][k], atol=1e-5, rtol=0)
    assert np.abs(a["items"] - items).max() > 1e-4  # it trained


def test_network_shapes_follow_the_paper():
    shapes = ncf.network_shapes("neumf", 12, LAYERS)
    assert shapes["mlp.0.weight"] == (48, 24)  # input 2D x h1 (fedncf.txt §3.4 parameter count)
    assert shapes["mlp.3.weight"] == (6, 12)
    assert shapes["predict.weight"] == (18,)
    assert ncf.network_shapes("gmf", 12, LAYERS) == {"predict.weight": (12,), "predict.bias": (1,)}


def test_run_transcript_and_mf_fedavg_update(tiny):
    cfg = {"global_rounds": 1, "max_rounds": 2, "clients_per_round": 8, "record_rounds": 2}
    res = FedNCF().run(tiny, cfg, [], 0)
    t = res.transcript
    kinds = t.kinds()
    assert kinds["private"] == tiny.n_users
    assert kinds["cohort"] == 2 and kinds["state"] == 2 and kinds["aggregate"] == 2
    assert kinds["item_update"] == 16 and kinds["net_update"] == 16
    assert 0.0 <= res.utility["hr@10"] <= 1.0 and 0.0 <= res.utility["ndcg@10"] <= res.utility["hr@10"]
    # MF-FedAvg (Algorithm 1): item rows averaged over the clients that updated them
    s0, s1 = (m.payload["items"] for m in t.select("state"))
    ups = t.select("item_update", round=0)
    total = np.zeros_like(s0)
    counts = np.zeros(len(s0))
    for m in ups:
        total[m.payload["items"]] += m.payload["values"]
        counts[m.payload["items"]] += 1
    np.testing.assert_array_equal(counts, t.select("aggregate", round=0)[0].payload["counts"])
    upd = counts > 0
    expected = s0.copy()
    expected[upd] += total[upd] / counts[upd, None]
    np.testing.assert_allclose(s1, expected, atol=1e-6)
    np.testing.assert_array_equal(s1[~upd], s0[~upd])
    # every client's uploaded rows = its positives plus sampled negatives, never the held-out item
    for m in ups:
        priv = t.private(m.sender)
        assert set(priv["items"]) <= set(m.payload["items"])
        assert priv["test_item"][0] not in set(m.payload["items"])
        assert len(m.payload["items"]) > len(priv["items"])


def test_aggregations_differ_and_all_learn(tiny):
    out = {}
    for agg in ("mf-fedavg", "fedavg", "simpleavg"):
        out[agg] = FedNCF().run(tiny, {"global_rounds": 2, "clients_per_round": 10, "aggregation": agg, "record_rounds": 0}, [], 1).model["items"]
    assert np.abs(out["mf-fedavg"] - out["fedavg"]).max() > 1e-4
    # MF-FedAvg moves trained rows by the mean client change, FedAvg/SimpleAvg dilute it
    assert np.abs(out["mf-fedavg"]).mean() > np.abs(out["simpleavg"]).mean()


def test_adversarial_schedule(tiny):
    cfg = FedNCF.resolve_config({"selection": "adversarial", "manipulated_rounds": 3, "clients_per_round": 5, "global_rounds": 1, "target": 7})
    eligible = np.arange(tiny.n_users)
    cohorts, target = FedNCF.schedule(cfg, eligible, np.random.default_rng(0))
    assert target == 7
    for j in range(3):
        full, without = cohorts[2 * j], cohorts[2 * j + 1]
        assert 7 in full and len(full) == 5
        np.testing.assert_array_equal(full[full != 7], without)
    assert len(cohorts) == 6 + 8  # then one random pass of 40 clients in cohorts of 5


def test_config_errors():
    with pytest.raises(PrivauditError, match="aggregation must be one of"):
        FedNCF.resolve_config({"aggregation": "median"})
    with pytest.raises(PrivauditError, match="model must be one of"):
        FedNCF.resolve_config({"model": "svd"})
    assert 'pip install "privaudit[ncf]"' in str(MissingDependencyError("torch", "ncf"))


def test_dp_sgd_noises_every_row_and_reports_epsilon(tiny):
    from privaudit.defenses.dp_sgd import DPSGD, rdp_epsilon

    d = DPSGD(noise_multiplier=1.0, max_grad_norm=1.0)
    res = FedNCF().run(tiny, {"global_rounds": 1, "max_rounds": 2, "clients_per_round": 5}, [d], 0)
    for m in res.transcript.select("item_update"):
        assert len(m.payload["items"]) == tiny.n_items  # noise on all rows
        assert np.all(np.abs(m.payload["values"]).sum(1) > 0)
    eps = res.utility["epsilon"]
    assert np.isfinite(eps) and eps > 0
    assert d.privacy_spent(1)["epsilon"] == pytest.approx(eps)  # every client took part once
    assert rdp_epsilon(2.0, 0.1, 100, 1e-5) < rdp_epsilon(1.0, 0.1, 100, 1e-5)
