"""Paillier defense: fixed-point encoding, packing, homomorphic sums, what each party sees.

All keys here are TEST_KEY_LENGTH = 512 bits (insecure_test_key=True: fast and breakable; the
default is 2048) -- the arithmetic checked does not depend on the key length beyond the number
of slots per ciphertext.
"""

from __future__ import annotations

import numpy as np
import pytest
from phe import paillier

from privaudit.defenses import _paillier_packing as pp
from privaudit.defenses.paillier import TEST_KEY_LENGTH, PaillierDefense
from privaudit.errors import PrivauditError
from privaudit.protocols.base import Channel, plain_sum
from privaudit.registry import get
from privaudit.transcript import Transcript, load

KEY = TEST_KEY_LENGTH  # needs insecure_test_key=True; production default is 2048


@pytest.fixture(scope="module")
def keys():
    return pp.generate_keypair(KEY)


def _channel(defense, n_clients=6):
    tr = Transcript("test", parties=["server"] + [f"client:{i}" for i in range(n_clients)])
    return Channel([defense], tr, np.random.default_rng(0)), tr


def _item_payloads(rng, n_clients, m, K, per_client=5, scale=3.0):
    return [
        {
            "items": np.sort(rng.choice(m, per_client, replace=False)).astype(np.int64),
            "values": rng.normal(0, scale, (per_client, K)),
        }
        for _ in range(n_clients)
    ]


def test_registered_and_hides_plaintext():
    cls = get("defense", "paillier")
    assert cls is PaillierDefense
    d = cls(key_length=KEY, insecure_test_key=True)
    assert d.hides_plaintext()
    assert d.config["key_length"] == KEY and cls().config["key_length"] == 2048


@pytest.mark.parametrize(
    "params, message",
    [
        ({"key_length": 100}, "key_length"),
        ({"decryptors": 0}, "decryptors"),
        ({"precision": 60}, "precision"),
        ({"bound": 0.0}, "bound"),
        ({"cohort_size": -1}, "cohort_size"),
        ({"jobs": 0}, "jobs"),
    ],
)
def test_invalid_parameters(params, message):
    with pytest.raises(PrivauditError, match=message):
        PaillierDefense(**params)


def test_fixed_exponent_hides_magnitudes(keys):
    pk, sk = keys
    values = np.array([1e-6, -0.5, 3.25, -1234.5678, 7e3])
    # phe's own float encoding picks an exponent per value: it leaks each value's magnitude
    leaky = [pk.encrypt(float(v)).exponent for v in values]
    assert len(set(leaky)) > 1
    # fixed point: one public exponent for every value
    enc = pp.encrypt_fixed(pk, values, 32)
    assert {e.exponent for e in enc} == {-32}
    decoded = np.array([sk.decrypt_encoded(e, pp.FixedPointEncoding).decode() for e in enc])
    assert np.array_equal(decoded, np.rint(values * 2.0**32) / 2.0**32)


@pytest.mark.parametrize("packing", [True, False])
def test_packed_sums_are_bit_exact(keys, packing):
    pk, sk = keys
    rng = np.random.default_rng(1)
    n_summands, rows, L = 9, 4, 13
    bound = 2.0**20
    lay = pp.make_layout(KEY, 32, bound, n_summands, packing)
    xs = rng.normal(0, 100, size=(n_summands, rows, L))
    xs[0, 0, 0], xs[1, 0, 0] = bound, -bound  # extremes of the encodable range
    qs = np.stack([pp.quantize(x, 32, bound) for x in xs])
    cts = [pp.encrypt(pk.n, pp.encode_plaintexts(q, lay, pk.n), lay.ciphertext_bytes) for q in qs]
    C = lay.n_ciphertexts(L)
    assert all(c.shape == (rows * C, 2 * KEY // 8) for c in cts)
    flat = pp.to_ints(np.concatenate(cts))
    sums = pp.add_grouped(flat, np.tile(np.arange(rows * C), n_summands), rows * C, pk.nsquare)
    plain = pp.decrypt(pk.n, sk.p, sk.q, sums)
    got = pp.decode_sums(plain, np.full(rows, n_summands), lay, L, pk.n)
    assert np.array_equal(got, qs.sum(axis=0))  # exact integer sums of the fixed-point values
    if packing:
        assert lay.slots == (KEY - 1) // 64 and C == -(-L // lay.slots)


def test_layout_refuses_overflow():
    with pytest.raises(ValueError, match="overflow"):
        pp.make_layout(KEY, 40, 2.0**20, 10_000)
    with pytest.raises(ValueError, match="bound"):
        pp.quantize(np.array([2.0**21]), 32, 2.0**20)


@pytest.mark.parametrize("packing", [True, False])
def test_defense_sums_match_plain_sum(packing):
    rng = np.random.default_rng(2)
    d = PaillierDefense(key_length=KEY, insecure_test_key=True, decryptors=2, packing=packing)
    ch, tr = _channel(d)
    senders = [f"client:{i}" for i in range(6)]
    m, K = 20, 4
    pays = _item_payloads(rng, 6, m, K)
    batch = ch.send(0, "grad_V", senders, pays)
    got = ch.sum(batch, rows=m)
    ref = plain_sum(pays, m)
    assert np.array_equal(got["counts"], ref["counts"])
    assert np.max(np.abs(got["values"] - ref["values"])) <= 6 * 2.0**-33
    dense = [{"values": rng.normal(0, 3, (7, K))} for _ in senders]
    bP = ch.send(0, "grad_P", senders, dense)
    gotP = ch.sum(bP)
    assert gotP["values"].shape == (7, K)
    assert np.max(np.abs(gotP["values"] - plain_sum(dense, None)["values"])) <= 6 * 2.0**-33
    # the server sees fixed-width uint8 ciphertexts, item ids in the clear, one exponent
    ups = tr.select("grad_V") + tr.select("grad_P")
    assert len(ups) == 12
    width = 2 * KEY // 8
    for msg in ups:
        assert msg.meta["encrypted"] and msg.meta["scheme"] == "paillier"
        assert msg.meta["exponent"] == -32
        assert set(msg.payload) <= {"items", "ciphertexts"}
        ct = msg.payload["ciphertexts"]
        assert ct.dtype == np.uint8 and ct.ndim == 3 and ct.shape[2] == width
    assert {m.meta["exponent"] for m in ups} == {-32}
    for msg, p in zip(tr.select("grad_V"), pays):
        assert np.array_equal(msg.payload["items"], p["items"])
    # fewer ciphertexts with packing
    n_ct = d.ciphertext_counts[0]["encrypted"]
    slots = (KEY - 1) // 64 if packing else 1  # 7 slots of 64 bits in a 512-bit plaintext
    assert n_ct == 6 * 5 * -(-K // slots) + 6 * -(-7 * K // slots)


def test_decryptors_see_only_ciphertext_sums():
    rng = np.random.default_rng(3)
    d = PaillierDefense(key_length=KEY, insecure_test_key=True, decryptors=3)
    ch, tr = _channel(d)
    senders = [f"client:{i}" for i in range(6)]
    pays = _item_payloads(rng, 6, 12, 3)
    ch.sum(ch.send(0, "grad_V", senders, pays), rows=12)
    assert {f"decryptor:{k}" for k in range(3)} <= set(tr.parties)
    seen_items = []
    for k in range(3):
        view = tr.view(f"decryptor:{k}")
        assert set(view.kinds()) <= {"ciphertext_sum", "secret_key"}
        for msg in view.select("ciphertext_sum"):
            assert msg.payload["ciphertexts"].dtype == np.uint8
            seen_items.append(msg.payload["items"])
    # the rows are shared among the decryptors, each row decrypted once
    all_items = np.sort(np.concatenate(seen_items))
    assert np.array_equal(all_items, np.unique(np.concatenate([p["items"] for p in pays])))
    server = tr.view("server")
    sums = server.select("plaintext_sum")
    assert {m.sender for m in sums} == {f"decryptor:{k}" for k in range(3)}
    assert server.select("public_key") and not server.select("ciphertext_sum")
    # the secret key is only in the keyholder's private message
    assert "paillier_p" in tr.private(d.keyholder)


def test_cohorts_and_transcript_round_trip(tmp_path):
    rng = np.random.default_rng(4)
    d = PaillierDefense(key_length=KEY, insecure_test_key=True, cohort_size=2)
    ch, tr = _channel(d)
    senders = [f"client:{i}" for i in range(6)]
    m, K = 10, 3
    pays = _item_payloads(rng, 6, m, K, per_client=4)
    got = ch.sum(ch.send(0, "grad_V", senders, pays), rows=m)
    sums = tr.select("plaintext_sum")
    assert sorted(m_.meta["cohort"] for m_ in sums) == [0, 1, 2]
    for msg in sums:
        members = msg.meta["members"]
        idx = [senders.index(s) for s in members]
        ref = plain_sum([pays[i] for i in idx], m)
        assert np.allclose(msg.payload["values"], ref["values"][msg.payload["items"]], atol=1e-8)
        assert np.array_equal(msg.payload["counts"], ref["counts"][msg.payload["items"]])
    assert np.allclose(got["values"], plain_sum(pays, m)["values"], atol=1e-8)
    path = tr.save(tmp_path / "he.ptx")
    back = load(path)
    assert np.array_equal(
        back.select("grad_V")[0].payload["ciphertexts"], tr.select("grad_V")[0].payload["ciphertexts"]
    )
    assert not back.without_private().private(d.keyholder)


def test_unrecorded_batch_records_nothing_extra():
    rng = np.random.default_rng(5)
    d = PaillierDefense(key_length=KEY, insecure_test_key=True)
    ch, tr = _channel(d)
    senders = [f"client:{i}" for i in range(3)]
    pays = _item_payloads(rng, 3, 8, 2, per_client=3)
    got = ch.sum(ch.send(1, "grad_V", senders, pays, record=False), rows=8)
    assert np.allclose(got["values"], plain_sum(pays, 8)["values"], atol=1e-8)
    assert not tr.select("grad_V") and not tr.select("plaintext_sum") and not tr.select("ciphertext_sum")


def test_value_beyond_bound_is_a_user_error():
    d = PaillierDefense(key_length=KEY, insecure_test_key=True, bound=1.0)
    ch, _ = _channel(d, 1)
    with pytest.raises(PrivauditError, match="bound"):
        ch.send(0, "grad_P", ["client:0"], [{"values": np.array([[2.0]])}])


def test_keys_come_from_the_os_csprng():
    import inspect

    from phe import util

    # phe draws primes and obfuscators from random.SystemRandom (os.urandom), never numpy
    assert "SystemRandom" in inspect.getsource(util.getprimeover)
    assert "SystemRandom" in inspect.getsource(paillier.PaillierPublicKey.get_random_lt_n)
    # two encryptions of the same value differ (fresh obfuscator each time)
    pk, _ = pp.generate_keypair(KEY)
    a = pp.encrypt(pk.n, [5, 5], 2 * KEY // 8)
    assert not np.array_equal(a[0], a[1])
