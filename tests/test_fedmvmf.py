"""FedMVMF protocol: transcript contract, gradient identities, training, utility, save/load."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from privaudit.data import synthetic
from privaudit.errors import PrivauditError
from privaudit.metrics import ranking_metrics_at_k
from privaudit.models import mvmf
from privaudit.protocols.fedmvmf import FedMVMF
from privaudit.registry import get
from privaudit.transcript import load

SCENARIOS = [(u, c) for u in ("semials", "sgd") for c in ("obsonly", "inclunc")]


@pytest.fixture(scope="module")
def small():
    return synthetic(n_users=60, n_items=80, min_ratings=10, density=0.15, seed=3)


@pytest.fixture(scope="module")
def runs(small):
    out = {}
    for update, unrated in SCENARIOS:
        cfg = {"update": update, "unrated": unrated, "epochs": 3, "record_rounds": -1, "K": 4}
        out[update, unrated] = FedMVMF().run(small, cfg, rng=7)
    return out


def _client_arrays(transcript, party):
    priv = transcript.private(party)
    return priv["items"], priv["ratings"], priv["attributes"]


def _uploads(transcript, party, rnd):
    gv = transcript.select("grad_V", sender=party, round=rnd)
    gp = transcript.select("grad_P", sender=party, round=rnd)
    assert len(gv) == 1 and len(gp) == 1
    return gv[0].payload, gp[0].payload["values"]


def test_registered():
    cls = get("protocol", "fedmvmf")
    assert cls is FedMVMF
    assert cls.default_attack == "mvmf-analytic"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_transcript_contract(runs, small, scenario):
    res = runs[scenario]
    tr = res.transcript
    cfg = tr.config
    n = cfg["n_users"]
    m, K = cfg["n_items"], cfg["K"]
    p = len(cfg["attribute_names"])
    assert p == small.user_attributes.shape[1]
    assert m == len(res.model["train_items"]) and n == len(res.model["train_users"])
    for key in (
        "K",
        "alpha",
        "lam",
        "w",
        "eta",
        "update",
        "unrated",
        "n_items",
        "attribute_names",
        "rating_min",
        "rating_max",
        "defenses",
    ):
        assert key in cfg
    assert (cfg["update"], cfg["unrated"]) == scenario
    assert cfg["defenses"] == []
    assert tr.parties[:2] == ["server", "item-server"] and len(tr.parties) == n + 2
    kinds = tr.kinds()
    assert kinds["private"] == n
    assert kinds["state"] == 3 and kinds["grad_V_item"] == 3
    assert kinds["grad_V"] == 3 * n and kinds["grad_P"] == 3 * n
    for msg in tr.select("state"):
        assert msg.sender == msg.receiver == "server"
        assert msg.payload["V"].shape == (m, K) and msg.payload["P"].shape == (p, K)
    train = res.model["train"]
    for u in range(n):
        party = f"client:{u}"
        items, ratings, attrs = _client_arrays(tr, party)
        assert items.dtype == np.int64 and ratings.dtype == np.float64 and attrs.dtype == np.float64
        assert np.array_equal(items, train.indices[train.indptr[u] : train.indptr[u + 1]])
        assert attrs.shape == (p,) and set(np.unique(attrs)) <= {0.0, 1.0}
        for rnd in range(3):
            gv, gp = _uploads(tr, party, rnd)
            assert gv["items"].dtype == np.int64 and np.all(np.diff(gv["items"]) > 0)
            expected_items = items if scenario[1] == "obsonly" else np.arange(m)
            assert np.array_equal(gv["items"], expected_items)
            assert gv["values"].shape == (len(expected_items), K)
            assert gp.shape == (p, K)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_uploads_are_rank_one(runs, scenario):
    tr = runs[scenario].transcript
    for u in range(0, tr.config["n_users"], 7):
        for rnd in (0, 1):
            gv, gp = _uploads(tr, f"client:{u}", rnd)
            stacked = np.vstack([gv["values"], gp])
            s = np.linalg.svd(stacked, compute_uv=False)
            assert s[1] <= 1e-10 * s[0]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gradient_identities(runs, scenario):
    """Recompute every client's u and uploads from its private data and the recorded state."""
    res = runs[scenario]
    tr, cfg, model = res.transcript, res.transcript.config, res.model
    alpha, lam, w, eta = cfg["alpha"], cfg["lam"], cfg["w"], cfg["eta"]
    n, m, K = cfg["n_users"], cfg["n_items"], cfg["K"]
    states = {msg.round: msg.payload for msg in tr.select("state")}
    for u in range(n):
        items, ratings, x = _client_arrays(tr, f"client:{u}")
        c = np.full(m, w if cfg["unrated"] == "inclunc" else 0.0)
        c[items] = 1.0
        r = np.zeros(m)
        r[items] = ratings
        uu = model["U_init"][u].copy()
        for rnd in sorted(states):
            V, P = states[rnd]["V"], states[rnd]["P"]
            A = (V * c[:, None]).T @ V + alpha * P.T @ P + lam * np.eye(K)
            b = V.T @ (c * r) + alpha * P.T @ x
            uu = np.linalg.solve(A, b) if cfg["update"] == "semials" else uu - eta * 2 * (A @ uu - b)
            gv, gp = _uploads(tr, f"client:{u}", rnd)
            sent = gv["items"]
            expect_v = (-2 * c[sent] * (r[sent] - V[sent] @ uu))[:, None] * uu[None, :]
            expect_p = -2 * alpha * np.outer(x - P @ uu, uu)
            np.testing.assert_allclose(gv["values"], expect_v, rtol=1e-9, atol=1e-11)
            np.testing.assert_allclose(gp, expect_p, rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(model["U"][u], uu, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_item_server_gradient_and_server_step(runs, small, scenario):
    """grad_V_item = -2 alpha (Y - V Q^T) Q and V_{t+1} = Adam(V_t; sum grads + g_item + 2 lam V)."""
    res = runs[scenario]
    tr, cfg = res.transcript, res.transcript.config
    alpha, lam, m, p, K = cfg["alpha"], cfg["lam"], cfg["n_items"], len(cfg["attribute_names"]), cfg["K"]
    Y = small.item_features[res.model["train_items"]]
    states = {msg.round: msg.payload for msg in tr.select("state")}
    g_items = {msg.round: msg.payload["values"] for msg in tr.select("grad_V_item")}
    if cfg["update"] == "semials":
        Q = mvmf.solve_Q(states[0]["V"], Y, alpha, lam)
        np.testing.assert_allclose(g_items[0], mvmf.item_grad_V(states[0]["V"], Q, Y, alpha), rtol=1e-9, atol=1e-12)
    adam = mvmf.Adam(lr=cfg["lr"])
    for rnd in (0, 1):
        sum_V = np.zeros((m, K))
        sum_P = np.zeros((p, K))
        for msg in tr.select("grad_V", round=rnd):
            np.add.at(sum_V, msg.payload["items"], msg.payload["values"])
        for msg in tr.select("grad_P", round=rnd):
            sum_P += msg.payload["values"]
        V, P = states[rnd]["V"], states[rnd]["P"]
        new = adam.step({"V": V, "P": P}, {"V": sum_V + g_items[rnd] + 2 * lam * V, "P": sum_P + 2 * lam * P})
        np.testing.assert_allclose(new["V"], states[rnd + 1]["V"], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(new["P"], states[rnd + 1]["P"], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s[0] == "semials"])
def test_semials_solves_normal_equations(runs, scenario):
    res = runs[scenario]
    tr, cfg, model = res.transcript, res.transcript.config, res.model
    last = max(msg.round for msg in tr.select("state"))
    state = tr.select("state", round=last)[0].payload
    X = np.stack([tr.private(f"client:{u}")["attributes"] for u in range(cfg["n_users"])])
    train = model["train"]
    weights = train.copy()
    weights.data[:] = 1.0
    A, b = mvmf.normal_equations(
        state["V"], state["P"], X, train, weights, cfg["alpha"], cfg["lam"], cfg["w"], cfg["unrated"]
    )
    resid = np.einsum("nij,nj->ni", A, model["U"]) - b
    assert np.abs(resid).max() < 1e-8 * max(1.0, np.abs(b).max())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_training_loss_decreases(small, scenario):
    res = FedMVMF().run(
        small, {"update": scenario[0], "unrated": scenario[1], "record_rounds": 0, "track_loss": True}, rng=1
    )
    loss = res.model["loss"]
    assert loss[-1] < 0.8 * loss[0]
    assert loss[-1] < loss[: len(loss) // 2].min()
    assert np.all(np.isfinite(loss))
    assert len(res.transcript.select("state")) == 0 and len(res.transcript.select("grad_V")) == 0


def test_default_record_rounds_is_two(small):
    tr = FedMVMF().run(small, {"epochs": 4}, rng=0).transcript
    assert tr.rounds("grad_V") == [0, 1] and tr.rounds("state") == [0, 1]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_utility_beats_random_scores(scenario):
    ds = synthetic()
    res = FedMVMF().run(ds, {"update": scenario[0], "unrated": scenario[1], "record_rounds": 0}, rng=0)
    util = res.utility
    for prefix in ("", "cold_user_", "cold_item_"):
        for key in ("ndcg", "precision", "recall", "f1"):
            assert 0.0 <= util[f"{prefix}{key}@10"] <= 1.0
    model = res.model
    rng = np.random.default_rng(0)
    test = model["test"]
    random = ranking_metrics_at_k(
        rng.random(test.shape), sp.csr_matrix(test >= 4), k=10, exclude=model["train"].astype(bool)
    )
    assert util["ndcg@10"] > 1.5 * random["ndcg"]


def test_rng_and_seed(small):
    a = FedMVMF().run(small, {"epochs": 2}, rng=5)
    b = FedMVMF().run(small, {"epochs": 2}, rng=np.random.default_rng(123))
    c = FedMVMF().run(small, {"epochs": 2}, rng=b.transcript.seed)
    assert a.transcript.seed == 5
    np.testing.assert_array_equal(b.model["V"], c.model["V"])
    assert not np.array_equal(a.model["V"], b.model["V"])


def test_save_load_round_trip(runs, tmp_path):
    tr = runs["sgd", "inclunc"].transcript
    path = tr.save(tmp_path / "run.ptx")
    back = load(path)
    assert back.protocol == "fedmvmf" and back.seed == tr.seed
    assert back.config == tr.config and back.dataset == tr.dataset and back.parties == tr.parties
    assert len(back.messages) == len(tr.messages)
    for a, b in zip(tr.messages, back.messages):
        assert (a.seq, a.round, a.sender, a.receiver, a.kind, a.meta) == (
            b.seq,
            b.round,
            b.sender,
            b.receiver,
            b.kind,
            b.meta,
        )
        assert a.payload.keys() == b.payload.keys()
        for key in a.payload:
            assert a.payload[key].dtype == b.payload[key].dtype
            np.testing.assert_array_equal(a.payload[key], b.payload[key])


@pytest.mark.parametrize(
    "override, message",
    [
        ({"update": "als"}, "update must be one of semials, sgd, got 'als'"),
        ({"unrated": "all"}, "unrated must be one of obsonly, inclunc, got 'all'"),
        ({"K": 0}, "K must be an integer >= 1, got 0"),
        ({"lam": 0.0}, "lam must be a number > 0, got 0.0"),
        ({"epochs": 0}, "epochs must be an integer >= 1, got 0"),
        ({"record_rounds": -2}, "record_rounds must be -1 or an integer >= 0, got -2"),
        ({"test_fraction": 1.0}, "test_fraction must be a number in [0, 1), got 1.0"),
        ({"w": -1}, "w must be a number >= 0, got -1"),
        ({"K": "ten"}, "K must be an integer >= 1, got 'ten'"),
        ({"K": 2.5}, "K must be an integer >= 1, got 2.5"),
        ({"bogus": 1}, "unknown parameter 'bogus'"),
    ],
)
def test_config_validation(override, message):
    with pytest.raises(
        PrivauditError, match=".*" + message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    ):
        FedMVMF.resolve_config(override)


def test_derived_keys_are_ignored_on_resolve(runs):
    cfg = runs["semials", "obsonly"].transcript.config
    again = FedMVMF.resolve_config(cfg)
    assert again == {k: cfg[k] for k in FedMVMF.default_config}


@pytest.mark.slow
def test_ml100k_utility_three_scenarios(ml100k_path):
    """ML-100K, all 943 users, default config: utility for existing users, cold users, cold items."""
    from privaudit.data import load_dataset

    ds = load_dataset(ml100k_path)
    res = FedMVMF().run(ds, {"record_rounds": 0}, rng=0)
    util = res.utility
    print({k: round(v, 4) for k, v in util.items()})
    model = res.model
    rng = np.random.default_rng(0)
    random = ranking_metrics_at_k(
        rng.random(model["test"].shape), sp.csr_matrix(model["test"] >= 4), k=10, exclude=model["train"].astype(bool)
    )
    assert util["ndcg@10"] > 3 * random["ndcg"]
    assert util["cold_user_ndcg@10"] > 3 * random["ndcg"]
    assert util["cold_item_ndcg@10"] > 0.05


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_unrecorded_rounds_train_identically(small, scenario):
    """Unobserved rounds without defenses skip the per-client payloads; the model is the same."""
    cfg = {"update": scenario[0], "unrated": scenario[1], "epochs": 4, "K": 4}
    a = FedMVMF().run(small, {**cfg, "record_rounds": 0}, rng=2).model
    b = FedMVMF().run(small, {**cfg, "record_rounds": -1}, rng=2).model
    for key in ("U", "V", "P", "Q"):
        np.testing.assert_allclose(a[key], b[key], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-12)


def test_plain_sum_matches_scatter_add():
    """Channel's plain sum (used for FedMVMF's grad_V) equals np.add.at, bit for bit."""
    from privaudit.protocols.base import plain_sum

    rng = np.random.default_rng(0)
    m, K = 40, 3
    cases = [
        [{"items": np.arange(m), "values": rng.normal(size=(m, K))} for _ in range(30)],
        [
            {"items": np.sort(rng.choice(m, size, replace=False)), "values": rng.normal(size=(size, K))}
            for size in rng.integers(0, m, 50)
        ],
        [
            {"items": np.array([3, 1, 3]), "values": rng.normal(size=(3, K))},
            {"items": np.array([0]), "values": np.ones((1, K))},
        ],
    ]
    for payloads in cases:
        index = np.concatenate([p["items"] for p in payloads])
        values = np.concatenate([p["values"] for p in payloads])
        expected = np.zeros((m, K))
        np.add.at(expected, index, values)
        out = plain_sum(payloads, m)
        np.testing.assert_array_equal(out["values"], expected)
        np.testing.assert_array_equal(out["counts"], np.bincount(index, minlength=m))
