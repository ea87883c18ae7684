"""Crypto parameter checks: secagg layouts that can overflow, Paillier slot overflow, key lengths."""

from __future__ import annotations

import numpy as np
import pytest

from privaudit.defenses import _paillier_packing as pk
from privaudit.defenses.paillier import MIN_KEY_LENGTH, TEST_KEY_LENGTH, PaillierDefense
from privaudit.defenses.secagg import SecAgg
from privaudit.errors import PrivauditError
from privaudit.protocols.base import Channel
from privaudit.transcript import Transcript


def _dense_sum(defense, values):
    ch = Channel([defense], Transcript("p"), np.random.default_rng(0))
    senders = [f"client:{u}" for u in range(len(values))]
    return ch.sum(ch.send(0, "delta", senders, [{"delta": v} for v in values]))


def test_secagg_refuses_a_fraction_that_overflows_the_ring():
    # 16 integer bits + 30 fractional bits cannot fit a signed 32-bit ring even for 2 clients
    with pytest.raises(PrivauditError, match="ring_bits 32 with frac_bits 30 .* can overflow"):
        SecAgg(ring_bits=32, frac_bits=30)
    with pytest.raises(PrivauditError, match="frac_bits must be -1"):
        SecAgg(frac_bits=-3)


def test_secagg_layout_checked_against_the_cohort_size():
    # int_bits 8 + frac_bits 18 + ceil(log2 32) = 31 bits: 32 clients fit, 33 can overflow
    worst = np.full(4, 255.99)  # |x| < 2^8, the largest values the layout admits
    total = _dense_sum(SecAgg(ring_bits=32, int_bits=8, frac_bits=18), [worst] * 32)
    np.testing.assert_allclose(total["delta"], 32 * worst, atol=32 * 2.0**-18)
    with pytest.raises(PrivauditError, match="can overflow for 33 clients"):
        _dense_sum(SecAgg(ring_bits=32, int_bits=8, frac_bits=18), [worst] * 33)
    # the automatic fraction (frac_bits=-1) always fits: 33 worst-case values sum exactly
    total = _dense_sum(SecAgg(ring_bits=32, int_bits=8), [worst] * 33)
    np.testing.assert_allclose(total["delta"], 33 * worst, atol=33 * 2.0**-17)


def test_paillier_decode_raises_on_slot_overflow():
    layout = pk.make_layout(TEST_KEY_LENGTH, 16, 1.0, 2, True)
    pub, sec = pk.generate_keypair(TEST_KEY_LENGTH)
    n = pub.n
    q = pk.quantize(np.full((1, 3), 1.0), layout.precision, layout.bound)  # the largest admitted value
    ct = pk.encrypt(n, pk.encode_plaintexts(q, layout, n), layout.ciphertext_bytes)
    cts = pk.to_ints(np.repeat(ct, 3000, axis=0))
    total = pk.add_grouped(cts, np.zeros(3000, dtype=np.int64), 1, pub.nsquare)
    plain = pk.decrypt(n, sec.p, sec.q, total)
    # 3,000 summands on a 2-summand layout: refused, not decoded silently wrong
    with pytest.raises(ValueError, match="overflow"):
        pk.decode_sums(plain, np.array([3000]), layout, 3, n)
    # within the layout: exact
    two = pk.decrypt(n, sec.p, sec.q, pk.add_grouped(cts[:2], np.zeros(2, dtype=np.int64), 1, pub.nsquare))
    np.testing.assert_array_equal(pk.decode_sums(two, np.array([2]), layout, 3, n), 2 * q)
    # a slot above its bound (count x 2 x offset) is detected even with a plausible count
    bad = [two[0] + ((2 * 2 * layout.offset + 1) << (8 * layout.slot_bytes * (layout.slots - 1)))]  # slot 0
    with pytest.raises(ValueError, match="overflow"):
        pk.decode_sums(bad, np.array([2]), layout, 3, n)


def test_paillier_unpacked_decode_raises_on_overflow():
    layout = pk.make_layout(TEST_KEY_LENGTH, 16, 1.0, 2, False)
    n = 10**40 + 7
    big = 5 * layout.offset  # |sum| above 2 summands x offset
    with pytest.raises(ValueError, match="overflow"):
        pk.decode_sums([big], np.array([2]), layout, 1, n)
    np.testing.assert_array_equal(pk.decode_sums([n - 3], np.array([2]), layout, 1, n), [[-3]])


def test_paillier_key_length_minimum_outside_tests():
    assert MIN_KEY_LENGTH == 2048
    with pytest.raises(PrivauditError, match="key_length must be >= 2048"):
        PaillierDefense(key_length=512)
    with pytest.raises(PrivauditError, match="key_length must be >= 2048"):
        PaillierDefense(key_length=128)
    assert PaillierDefense(key_length=TEST_KEY_LENGTH, insecure_test_key=True).config["key_length"] == 512
    with pytest.raises(PrivauditError, match=r"key_length must be an integer in \[128, 16384\]"):
        PaillierDefense(key_length=100, insecure_test_key=True)
    assert PaillierDefense().config["key_length"] == 2048
