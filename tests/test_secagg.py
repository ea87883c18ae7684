"""Secure aggregation (MF-SecAvg): exact unmasking with and without dropouts, uniform masks, Shamir."""

from __future__ import annotations

import secrets

import numpy as np
import pytest
from scipy import stats

from privaudit.defenses import _secagg_crypto as sc
from privaudit.defenses.secagg import SecAgg
from privaudit.errors import PrivauditError
from privaudit.protocols.base import Channel
from privaudit.transcript import Transcript

M, W = 50, 4


def _payloads(n, rng, scale=1.0):
    out = []
    for _ in range(n):
        items = np.sort(rng.choice(M, size=int(rng.integers(3, 20)), replace=False))
        out.append({"items": items, "values": scale * rng.normal(size=(len(items), W))})
    return out


def _send(defense, payloads, rnd=0, kind="item_update"):
    t = Transcript("fedncf", {"n_items": M})
    ch = Channel([defense], t, np.random.default_rng(0))
    senders = [f"client:{u}" for u in range(len(payloads))]
    batch = ch.send(rnd, kind, senders, payloads, meta={"n_rows": M})
    return ch, batch, t


def _plain_ring_sum(payloads, keep, f, bits):
    vecs = []
    for i in keep:
        p = payloads[i]
        dense = np.zeros((M, W))
        dense[p["items"]] = p["values"]
        P = np.zeros(M)
        P[p["items"]] = 1
        vecs.append(sc.encode(np.concatenate([dense.ravel(), P]), f, bits))
    return sc.ring_sum(vecs, bits)


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("drop", [[], [2], [0, 5]])
def test_unmasked_sum_equals_plain_fixed_point_sum(bits, drop):
    rng = np.random.default_rng(1)
    payloads = _payloads(7, rng)
    d = SecAgg(ring_bits=bits, int_bits=8 if bits == 32 else 16, drop=drop)
    ch, batch, t = _send(d, payloads)
    keep = [i for i in range(7) if i not in drop]
    assert batch.senders == [f"client:{i}" for i in keep]  # dropped uploads never arrive
    assert batch.meta["dropped"] == [f"client:{i}" for i in drop]
    total = ch.sum(batch, rows=M)
    f = batch.meta["frac_bits"]
    np.testing.assert_array_equal(d.last_unmasked, _plain_ring_sum(payloads, keep, f, bits))  # exact
    counts = np.zeros(M, dtype=np.int64)
    plain = np.zeros((M, W))
    for i in keep:
        counts[payloads[i]["items"]] += 1
        plain[payloads[i]["items"]] += payloads[i]["values"]
    np.testing.assert_array_equal(total["counts"], counts)
    np.testing.assert_allclose(total["values"], plain, atol=len(keep) * 2.0**-f)
    # the recorded uploads are ring elements of identical shape for every client (no item ids)
    for m in t.select("item_update"):
        assert m.payload["values"].dtype == np.dtype(f"uint{bits}") and m.payload["values"].shape == (M, W)
        assert set(m.payload) == {"values", "P"} and m.meta["masked"] is True


def test_random_dropout_and_dense_payloads():
    rng = np.random.default_rng(2)
    payloads = [
        {"delta": rng.normal(size=30), "n_instances": np.array([float(rng.integers(10, 99))])} for _ in range(10)
    ]
    d = SecAgg(dropout=0.3)
    ch, batch, _ = _send(d, payloads, kind="net_update")
    keep = [int(s.split(":")[1]) for s in batch.senders]
    assert len(keep) == 7
    total = ch.sum(batch)
    np.testing.assert_allclose(total["delta"], sum(payloads[i]["delta"] for i in keep), atol=1e-9)
    assert total["n_instances"][0] == sum(payloads[i]["n_instances"][0] for i in keep)


def test_too_many_dropouts_abort():
    d = SecAgg(drop=[0, 1, 2, 3], threshold=0.5)
    ch, batch, _ = _send(d, _payloads(6, np.random.default_rng(3)))
    with pytest.raises(PrivauditError, match="are needed to unmask"):
        ch.sum(batch, rows=M)


def test_out_of_range_values_refused():
    with pytest.raises(PrivauditError, match="fixed-point range"):
        _send(SecAgg(int_bits=4), _payloads(3, np.random.default_rng(4), scale=100.0))


@pytest.mark.parametrize("bits", [32, 64])
def test_masked_uploads_uniform_and_independent_of_data(bits):
    """Chi-square: one client's masked ring values are uniform (top byte in 256 bins) whatever the
    data (all zeros or large structured values), and their bins are independent of the data's."""
    rng = np.random.default_rng(5)
    n_items = 4000
    zeros = [{"delta": np.zeros(n_items)} for _ in range(3)]
    ramp = np.linspace(-100, 100, n_items)
    structured = [{"delta": ramp.copy()} for _ in range(3)]
    shift = bits - 8
    for payloads in (zeros, structured):
        _, batch, _ = _send(SecAgg(ring_bits=bits, int_bits=8 if bits == 32 else 16), payloads, kind="net_update")
        top = (batch.payloads[0]["delta"] >> np.array(shift, dtype=batch.payloads[0]["delta"].dtype)).astype(np.int64)
        counts = np.bincount(top, minlength=256)
        assert stats.chisquare(counts).pvalue > 1e-5
    data_bin = np.digitize(ramp, np.linspace(-100, 100, 9)[1:-1])  # 8 data bins
    mask_bin = (top // 32).astype(np.int64)  # 8 ring bins
    table = np.zeros((8, 8))
    np.add.at(table, (data_bin, mask_bin), 1)
    assert stats.chi2_contingency(table).pvalue > 1e-5
    assert abs(np.corrcoef(ramp, top)[0, 1]) < 0.1
    del rng


def test_shamir_threshold():
    secret = secrets.randbits(256)
    shares = sc.shamir_split(secret, 7, 4)
    assert sc.shamir_combine(shares[:4]) == secret
    assert sc.shamir_combine([shares[6], shares[1], shares[3], shares[0]]) == secret
    assert sc.shamir_combine(shares[:3]) != secret  # below the threshold: a wrong value


def test_pair_seeds_agree_and_prg_is_deterministic():
    a, pa = sc.keypair()
    b, pb = sc.keypair()
    s1, s2 = sc.pair_seed(a, pb, b"x"), sc.pair_seed(b, pa, b"x")
    assert s1 == s2 and sc.pair_seed(a, pb, b"y") != s1
    np.testing.assert_array_equal(sc.expand(s1, b"k", 100, 64), sc.expand(s2, b"k", 100, 64))
    x = np.array([-1.5, 0.0, 3.25, -1e-6])
    np.testing.assert_allclose(sc.decode(sc.encode(x, 20, 32), 20, 32), x, atol=2.0**-20)


def test_fedncf_with_secagg_equals_plain_and_blocks_update_leak():
    pytest.importorskip("torch")
    from privaudit.attacks.ncf.update_leak import NCFUpdateLeak
    from privaudit.data import synthetic
    from privaudit.protocols.fedncf import FedNCF

    ds = synthetic(n_users=30, n_items=80, seed=0)
    cfg = {"global_rounds": 1, "clients_per_round": 10, "max_rounds": 2}
    plain = FedNCF().run(ds, cfg, [], 0)
    masked = FedNCF().run(ds, cfg, [SecAgg()], 0)
    np.testing.assert_allclose(plain.model["items"], masked.model["items"], atol=1e-6)
    out = NCFUpdateLeak().evaluate(masked.transcript, np.random.default_rng(0))
    assert not out.reconstruction.supported and "masked" in out.reconstruction.reason
    assert out.metrics == out.baseline
