"""Malicious server against PrivMVMF's Paillier aggregation: the ``isolate`` plan, the
``privmvmf-isolated-decryption`` attack and the ``model-consistency`` decryption check.

Keys are 512 bits (``insecure_test_key``: fast, breakable); data is tiny synthetic, 2 epochs.
"""

from __future__ import annotations

import numpy as np
import pytest

from privaudit.attacks.mvmf.aggregate import MVMFAggregate
from privaudit.attacks.mvmf.privmvmf_isolation import PrivMVMFIsolatedDecryption
from privaudit.data import synthetic
from privaudit.defenses.consistency import ModelConsistency
from privaudit.defenses.paillier import TEST_KEY_LENGTH
from privaudit.errors import PrivauditError
from privaudit.protocols.privmvmf import PrivMVMF
from privaudit.registry import get

CFG = {"epochs": 2, "K": 4, "record_rounds": 1}


def _paillier(**kw):
    return get("defense", "paillier")(key_length=TEST_KEY_LENGTH, insecure_test_key=True, **kw)


@pytest.fixture(scope="module")
def data():
    return synthetic(n_users=50, n_items=70, min_ratings=10, density=0.15, seed=3)


@pytest.fixture(scope="module")
def runs(data):
    def run(cfg, extra=()):
        return PrivMVMF().run(data, {**CFG, **cfg}, [_paillier(), *extra], rng=7)

    return {
        "honest": run({}),
        "honest_checked": run({}, [ModelConsistency()]),
        "isolate": run({"server": "isolate"}),
        "isolate_checked": run({"server": "isolate"}, [ModelConsistency()]),
    }


def _sums(tr, cohort=None):
    return [
        (m.round, m.meta["of_kind"], m.payload["values"].tobytes())
        for m in tr.view("server").select("plaintext_sum")
        if cohort is None or m.meta["cohort"] == cohort
    ]


def test_honest_plan_and_check_leave_the_run_unchanged(runs):
    ref = runs["honest"]
    for name in ("honest_checked", "isolate", "isolate_checked"):
        run = runs[name]
        # training is the honest one: same model, same decrypted cohort sums (ciphertexts differ:
        # Paillier's randomness is cryptographic)
        assert np.array_equal(run.model["V"], ref.model["V"]), name
        assert run.utility["ndcg@10"] == ref.utility["ndcg@10"]
        assert _sums(run.transcript, cohort=0) == _sums(ref.transcript), name
    assert ref.transcript.config["target"] == -1 and ref.transcript.config["server"] == "honest"
    # the honest-but-curious aggregate attack reads the protocol's cohort sums only
    a = MVMFAggregate().evaluate(ref.transcript, np.random.default_rng(0)).metrics
    b = MVMFAggregate().evaluate(runs["isolate"].transcript, np.random.default_rng(0)).metrics
    assert a == b


def test_isolated_decryption_is_recorded_on_the_server_messages(runs):
    tr = runs["isolate"].transcript
    target = tr.config["target"]
    states = [m for m in tr.view("server").select("state") if m.meta.get("deviation")]
    assert [(m.round, m.meta["deviation"], m.meta["target"]) for m in states] == [(0, "isolate", target)]
    requests = [m for m in tr.messages if m.kind == "ciphertext_sum" and m.meta.get("deviation")]
    assert sorted(m.meta["of_kind"] for m in requests) == ["grad_P", "grad_V"]
    assert {m.meta["cohort"] for m in requests} == {-1}
    replies = [m for m in tr.view("server").select("plaintext_sum") if m.meta["cohort"] == -1]
    assert {tuple(m.meta["members"]) for m in replies} == {(f"client:{target}",)}
    # the decrypted "sum" is the target's upload: one count per uploaded item
    (gv,) = [m for m in replies if m.meta["of_kind"] == "grad_V"]
    assert set(gv.payload["counts"].tolist()) == {1}


def test_attack_recovers_the_target_ratings_from_one_round(runs):
    out = PrivMVMFIsolatedDecryption().evaluate(runs["isolate"].transcript, np.random.default_rng(0))
    assert out.reconstruction.supported, out.reconstruction.reason
    m, prior, rand = out.metrics, out.baseline_prior, out.baseline
    assert m["rounds_used"] == 1 and m["sybils"] == 0 and m["victims"] == 1
    assert m["precision"] >= 0.9 and m["recall"] >= 0.9
    assert m["rating_accuracy"] == 1.0 and m["rated_detection_accuracy"] == 1.0
    # far above the prior library's message-free guess of the same target and the uniform guess
    assert m["rating_accuracy"] > prior["rating_accuracy"] + 0.3
    assert m["f1"] > prior["f1"] + 0.3 and m["f1"] > rand["f1"] + 0.3
    victim = f"client:{runs['isolate'].transcript.config['target']}"
    assert out.victims is not None and out.victims.victims == [victim]
    assert out.victims.value("rating_accuracy") == m["rating_accuracy"]
    assert out.victims.value("rating_accuracy", "prior") == prior["rating_accuracy"]
    rated = out.decisions["rated"]  # per uploaded item: really rated vs sampling's virtual item
    assert len(rated.labels) == len(out.reconstruction.victims[victim]["items"])
    assert 0.3 < rated.labels.mean() < 0.7


def test_model_consistency_closes_the_isolation(runs):
    attack = PrivMVMFIsolatedDecryption()
    ok, why = attack.applicable(runs["isolate_checked"].transcript.view("server"))
    assert not ok and "model-consistency" in why
    out = attack.evaluate(runs["isolate_checked"].transcript, np.random.default_rng(0))
    assert not out.reconstruction.supported and out.metrics == out.baseline
    assert not attack.applicable(runs["honest"].transcript.view("server"))[0]  # honest server
    check = ModelConsistency(min_cohort=2)
    assert check.check_decryption(0, "grad_V", ["client:1"], [["client:0", "client:1"]]) is not None
    assert check.check_decryption(0, "grad_V", ["client:1", "client:0"], [["client:0", "client:1"]]) is None
    # a posted cohort of one is still below min_cohort: the decryptor refuses it
    assert "below min_cohort 2" in check.check_decryption(0, "grad_V", ["client:1"], [["client:1"]])


def test_plan_settings_are_checked(data):
    with pytest.raises(PrivauditError, match="record_rounds"):
        PrivMVMF.resolve_config({"server": "isolate", "record_rounds": 1, "deviation_rounds": 2})
    with pytest.raises(PrivauditError, match="epochs"):
        PrivMVMF.resolve_config({"server": "isolate", "epochs": 2, "deviation_start": 2})
    with pytest.raises(PrivauditError, match="target"):
        PrivMVMF().run(data, {**CFG, "server": "isolate", "target": 999}, [_paillier()], rng=0)


@pytest.mark.slow
def test_ml100k_isolated_decryption(ml100k_path):
    """ML-100K, 60 random users, 512-bit test key: the attack recovers the target's rated items."""
    from privaudit.data import load_dataset

    ds = load_dataset(ml100k_path)
    ds = ds.subset_users(np.sort(np.random.default_rng(0).choice(ds.n_users, 60, replace=False)))
    tr = PrivMVMF().run(ds, {"server": "isolate", "epochs": 1, "record_rounds": 1}, [_paillier()], rng=0).transcript
    out = PrivMVMFIsolatedDecryption().evaluate(tr, np.random.default_rng(0))
    assert out.metrics["precision"] >= 0.9 and out.metrics["recall"] >= 0.9
    assert out.metrics["f1"] > out.baseline_prior["f1"] + 0.2
