"""PrivMVMF: protocol alias, lossless utility, what the server sees, attacks at the baseline,
and the aggregate-only attack against cohort size.

Keys are 512 bits (fast; the default is 2048); data is tiny synthetic, 2 epochs.
"""

from __future__ import annotations

import numpy as np
import pytest

from privaudit.attacks.mvmf.aggregate import MVMFAggregate
from privaudit.data import synthetic
from privaudit.defenses.paillier import TEST_KEY_LENGTH
from privaudit.protocols.privmvmf import PrivMVMF, privmvmf_defenses
from privaudit.registry import available, get

KEY = TEST_KEY_LENGTH  # insecure_test_key=True: fast, breakable
CFG = {"epochs": 2, "K": 4, "record_rounds": 1}
UTILITY_KEYS = [f"{p}{m}@10" for p in ("", "cold_user_", "cold_item_") for m in ("ndcg", "precision", "recall", "f1")]


@pytest.fixture(scope="module")
def data():
    return synthetic(n_users=50, n_items=70, min_ratings=10, density=0.15, seed=3)


@pytest.fixture(scope="module")
def runs(data):
    sampling, paillier = get("defense", "sampling"), get("defense", "paillier")
    # the same sampling as privmvmf's default (rho = 1, distribution = matched)
    fed = get("protocol", "fedmvmf")().run(data, CFG, [sampling(rho=1.0, distribution="matched")], rng=7)
    fed_plain = get("protocol", "fedmvmf")().run(data, CFG, [], rng=7)
    priv = PrivMVMF().run(data, CFG, [paillier(key_length=KEY, insecure_test_key=True, decryptors=2)], rng=7)
    priv_c1 = PrivMVMF().run(data, CFG, [paillier(key_length=KEY, insecure_test_key=True, cohort_size=1)], rng=7)
    return {"fed": fed, "fed_plain": fed_plain, "priv": priv, "priv_c1": priv_c1}


def test_registered_alias_adds_defenses():
    assert get("protocol", "privmvmf") is PrivMVMF
    # FedMVMF's config; only the epochs differ (2: a first run with a 2048-bit key stays under a minute)
    # plus the malicious server's plan (default honest; tests/test_malicious_privmvmf.py)
    plan = {"server": "honest", "deviation_rounds": 1, "deviation_start": 0, "target": -1}
    assert PrivMVMF.default_config == {**get("protocol", "fedmvmf").default_config, "epochs": 2, **plan}
    assert PrivMVMF.default_config["update"] == "semials"
    defs = privmvmf_defenses([], 0.25)
    assert [d.name for d in defs] == ["sampling", "paillier"]
    assert defs[0].config["w"] == 0.25 and defs[1].config["key_length"] == 2048
    assert defs[1].config["obfuscation"] == "djn"  # the protocol's default; the defense's own is standard
    assert get("defense", "paillier")().config["obfuscation"] == "standard"
    assert PrivMVMF.estimate_seconds(10, {}, ["paillier"]) > 5 * PrivMVMF.estimate_seconds(10, {})
    assert defs[0].config["rho"] == 1.0 and defs[0].config["distribution"] == "matched"
    # a caller's sampling without w gets the protocol's w; paillier is moved last
    paillier, sampling = (
        get("defense", "paillier")(key_length=KEY, insecure_test_key=True),
        get("defense", "sampling")(rho=2),
    )
    defs = privmvmf_defenses([paillier, sampling], 0.3)
    assert [d.name for d in defs] == ["sampling", "paillier"]
    assert defs[0].config["rho"] == 2 and defs[0].config["w"] == 0.3


def test_lossless_against_fedmvmf_with_same_sampling(runs):
    fed, priv = runs["fed"].utility, runs["priv"].utility
    # docs: "lossless" measured as identical metrics (0.0000 %); the models differ only by the
    # 2^-32 fixed-point rounding of each summand
    for key in UTILITY_KEYS:
        assert priv[key] == fed[key], key
    assert np.max(np.abs(runs["fed"].model["V"] - runs["priv"].model["V"])) < 1e-8


def test_server_sees_ciphertexts_item_sets_and_sums_only(runs):
    tr = runs["priv"].transcript
    names = [d["name"] for d in tr.config["defenses"]]
    assert names == ["sampling", "paillier"]
    server = tr.view("server")
    ups = server.select("grad_V") + server.select("grad_P")
    assert ups
    for m in ups:
        assert m.meta["encrypted"] and set(m.payload) <= {"items", "ciphertexts"}
        assert m.payload["ciphertexts"].dtype == np.uint8
    assert {m.meta["exponent"] for m in ups} == {-32}  # one public exponent for every upload
    # I_u ∪ S_u: |I_u| + round(rho |I_u|) items per client (rho = 1)
    for m in server.select("grad_V"):
        rated = tr.private(m.sender)["items"]
        assert len(m.payload["items"]) == 2 * len(rated)
        assert np.isin(rated, m.payload["items"]).all()
    assert server.select("plaintext_sum")
    for k in range(2):
        assert set(tr.view(f"decryptor:{k}").kinds()) <= {"ciphertext_sum", "secret_key"}


@pytest.mark.parametrize("attack", ["mvmf-analytic", "mvmf-nonlinear"])
def test_plain_attacks_score_baseline_on_privmvmf(runs, attack):
    if attack not in available("attack"):
        pytest.skip(f"{attack} not available")
    cls = get("attack", attack)
    out = cls().evaluate(runs["priv"].transcript, np.random.default_rng(0))
    assert not out.reconstruction.supported
    assert "ciphertexts" in out.reconstruction.reason
    assert out.metrics == out.baseline
    # ... while the same attack reads FedMVMF with the same sampling exactly
    plain = cls().evaluate(runs["fed"].transcript, np.random.default_rng(0))
    assert plain.metrics["rating_accuracy"] > 0.95


def test_aggregate_attack_cohort_one_equals_plain_attack(runs):
    if "mvmf-analytic" not in available("attack"):
        pytest.skip("mvmf-analytic not available")
    tr = runs["fed_plain"].transcript
    ref = get("attack", "mvmf-analytic")().evaluate(tr, np.random.default_rng(0)).metrics
    got = MVMFAggregate(cohort_size=1).evaluate(tr, np.random.default_rng(0)).metrics
    assert got == ref and got["rating_accuracy"] == 1.0 and got["attribute_accuracy"] == 1.0


def test_aggregate_attack_against_cohort_size(runs):
    if "mvmf-analytic" not in available("attack"):
        pytest.skip("mvmf-analytic not available")
    tr = runs["fed_plain"].transcript
    acc = {}
    for c in (1, 2, 45):
        out = MVMFAggregate(cohort_size=c).evaluate(tr, np.random.default_rng(0))
        acc[c] = out.metrics["rating_accuracy"]
        base = out.baseline
    # a cohort of 2 (< K) is separated exactly: item ids in the clear + rank-1 rows
    assert acc[1] == acc[2] == 1.0
    # one big cohort (>> K = 4) leaves little beyond an uninformed guess
    assert acc[45] < 0.6 and acc[45] < acc[2] - 0.4
    assert base["rating_accuracy"] == pytest.approx(0.2)


def test_aggregate_attack_on_privmvmf_views(runs):
    if "mvmf-analytic" not in available("attack"):
        pytest.skip("mvmf-analytic not available")
    # decryptors return one sum per client when cohort_size=1: nothing is hidden
    c1 = MVMFAggregate().evaluate(runs["priv_c1"].transcript, np.random.default_rng(0))
    assert c1.reconstruction.supported and c1.metrics["rating_accuracy"] == 1.0
    # the paper's setting: one sum over all clients, with sampling: no direction is identifiable
    full = MVMFAggregate().evaluate(runs["priv"].transcript, np.random.default_rng(0))
    assert full.reconstruction.supported
    # (matched sampling, privmvmf's default, leaves a few rarely rated items uploaded by one
    # client only — 4 of 45 here; that client's direction alone does not give its ratings)
    assert full.reconstruction.meta["with_direction"] <= 0.1
    assert full.metrics["rated_detection_accuracy"] < 0.55
    # nothing beyond the prior-only guess (per-column attribute majority, majority rating 0)
    prior = full.baseline_prior
    assert abs(full.metrics["attribute_accuracy"] - prior["attribute_accuracy"]) < 0.03
    assert full.metrics["rating_accuracy"] <= prior["rating_accuracy"] + 0.02
    assert full.metrics["rating_accuracy"] <= full.baseline["rating_accuracy_majority"]


@pytest.mark.slow
def test_ml100k_lossless_subsample(ml100k_path):
    """ML-100K, 100 random users (for speed), 2 epochs: PrivMVMF's metrics equal FedMVMF + sampling's.

    The full-data 5-epoch comparison is ``benchmarks/privmvmf_utility.py`` (docs/reproduction.md).
    """
    from privaudit.data import load_dataset

    ds = load_dataset(ml100k_path)
    ds = ds.subset_users(np.sort(np.random.default_rng(0).choice(ds.n_users, 100, replace=False)))
    cfg = {"epochs": 2, "record_rounds": 0}
    sampling, paillier = get("defense", "sampling"), get("defense", "paillier")
    fed = get("protocol", "fedmvmf")().run(ds, cfg, [sampling(rho=1.0)], rng=0).utility
    priv = PrivMVMF().run(ds, cfg, [sampling(rho=1.0), paillier(key_length=KEY, insecure_test_key=True)], rng=0).utility
    for key in UTILITY_KEYS:
        assert priv[key] == fed[key], key
