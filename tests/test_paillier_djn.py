"""DJN short-exponent obfuscation and obfuscator pools: phe (the reference implementation) decrypts
every ciphertext unchanged, sums equal the plaintext sums, pools never reuse an obfuscator.

Keys are TEST_KEY_LENGTH (512) bits with insecure_test_key=True, except one 1024-bit check.
"""

from __future__ import annotations

import numpy as np
import pytest
from phe import paillier

from privaudit.defenses import _paillier_packing as pp
from privaudit.defenses.paillier import TEST_KEY_LENGTH, PaillierDefense
from privaudit.protocols.base import Channel, plain_sum
from privaudit.transcript import Transcript


@pytest.fixture(scope="module")
def keys():
    return pp.generate_keypair(TEST_KEY_LENGTH)


def _lam(sk) -> int:
    return (sk.p - 1) * (sk.q - 1)


@pytest.mark.parametrize("djn", [True, False])
def test_phe_decrypts_pooled_ciphertexts_and_their_sums(keys, djn):
    pk, sk = keys
    n = pk.n
    hs = pp.djn_base(n) if djn else None
    msgs = [0, 1, 12345, n - 1, n // 2, 2**400 + 17]
    obfs = pp.ObfuscatorPool(n, hs).take(len(msgs))
    cts = pp.encrypt_online(n, msgs, obfs, 2 * TEST_KEY_LENGTH // 8)
    ints = pp.to_ints(cts)
    assert [sk.raw_decrypt(int(c)) for c in ints] == msgs  # phe's own CRT decryption
    # through phe's EncryptedNumber: homomorphic addition and the fixed-point encoding
    a = paillier.EncryptedNumber(pk, int(ints[2]), 0)
    b = paillier.EncryptedNumber(pk, int(ints[1]), 0)
    assert sk.decrypt(a + b) == 12346
    # every obfuscator is an n-th residue mod n^2 (so the ciphertext has Paillier's form)
    nsq = n * n
    assert all(pow(int(o), _lam(sk), nsq) == 1 for o in obfs)
    assert len({int(o) for o in obfs}) == len(obfs)


def test_djn_fixed_base_and_exponent_length(keys):
    pk, sk = keys
    n = pk.n
    hs = pp.djn_base(n)
    assert pow(hs, _lam(sk), n * n) == 1 and hs != 1
    assert pp.djn_exponent_bits(n) == TEST_KEY_LENGTH // 2
    # the table reproduces h_s^r for a known exponent
    r = 0x1234_5678_9ABC_DEF0
    table = pp._fixed_base_table(hs, n * n, pp.djn_exponent_bits(n))
    acc = 1
    for i, d in enumerate(r.to_bytes(len(table), "little")):
        acc = acc * int(table[i][d]) % (n * n)
    assert acc == pow(hs, r, n * n)
    # two bases from the same key differ (x is random, from secrets)
    assert pp.djn_base(n) != hs


def test_djn_at_1024_bits_with_joblib_workers():
    pk, sk = pp.generate_keypair(1024)
    hs = pp.djn_base(pk.n)
    obfs = pp.obfuscators(pk.n, 80, hs, jobs=2)
    msgs = list(range(80))
    cts = pp.to_ints(pp.encrypt_online(pk.n, msgs, obfs, 256))
    assert [sk.raw_decrypt(int(c)) for c in cts] == msgs
    assert len({int(o) for o in obfs}) == 80


def test_pool_hands_out_each_obfuscator_once(keys):
    pk, _ = keys
    pool = pp.ObfuscatorPool(pk.n, pp.djn_base(pk.n))
    pool.fill(6)
    first, second = pool.take(4), pool.take(5)  # 2 left, 3 computed on demand
    assert len(pool) == 0 and pool.computed == 9 and pool.offline_seconds > 0
    assert len({int(o) for o in first + second}) == 9


@pytest.mark.parametrize("packing", [True, False])
def test_djn_defense_sums_equal_standard_and_plain(packing):
    rng = np.random.default_rng(5)
    senders = [f"client:{i}" for i in range(5)]
    m, K = 15, 3
    pays = [{"items": np.sort(rng.choice(m, 4, replace=False)), "values": rng.normal(0, 2, (4, K))} for _ in senders]
    dense = [{"values": rng.normal(0, 2, (6, K))} for _ in senders]
    sums = {}
    for obf in ("standard", "djn"):
        d = PaillierDefense(
            key_length=TEST_KEY_LENGTH, insecure_test_key=True, packing=packing, obfuscation=obf, precompute=8
        )
        tr = Transcript("test", parties=["server", *senders])
        ch = Channel([d], tr, np.random.default_rng(0))
        sums[obf] = (ch.sum(ch.send(0, "grad_V", senders, pays), rows=m), ch.sum(ch.send(0, "grad_P", senders, dense)))
        key_msg = tr.select("public_key")[0]
        assert ("djn_base" in key_msg.payload) == (obf == "djn") and key_msg.meta["obfuscation"] == obf
        # offline (obfuscators) and online (encrypt) timed apart; precomputed ones before round 0
        assert d.timings[-1]["offline"] > 0 and d.timings[0]["offline"] > 0 and d.timings[0]["encrypt"] > 0
        assert d._pool.computed == d.ciphertext_counts[0]["encrypted"]
    ref_v, ref_p = plain_sum(pays, m), plain_sum(dense, None)
    for got_v, got_p in sums.values():
        assert np.array_equal(got_v["counts"], ref_v["counts"])
        assert np.max(np.abs(got_v["values"] - ref_v["values"])) <= 5 * 2.0**-33
        assert np.max(np.abs(got_p["values"] - ref_p["values"])) <= 5 * 2.0**-33
    # exact fixed-point sums: identical whichever obfuscation
    assert np.array_equal(sums["djn"][0]["values"], sums["standard"][0]["values"])
    assert np.array_equal(sums["djn"][1]["values"], sums["standard"][1]["values"])
