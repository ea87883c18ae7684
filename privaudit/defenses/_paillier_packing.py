"""Fixed-point encoding, ciphertext packing and batched Paillier operations (phe + gmpy2).

Used by the ``paillier`` defense (:mod:`privaudit.defenses.paillier`) and its benchmark.

Fixed-point encoding
--------------------
Every float ``x`` is encoded with ONE public exponent ``-f`` (``f = precision`` fractional
bits): ``q = rint(x * 2**f)`` (int64). phe's own :meth:`phe.EncodedNumber.encode` chooses the
exponent per value from the float's binary exponent, and the exponent travels in the clear
beside the ciphertext, which leaks every value's magnitude; here the exponent is a public
constant of the run, so a ciphertext reveals nothing but its length. Multiplying by a power of
two and rounding is exact in binary floating point, so ``q`` is the exact fixed-point value
and sums of ``q`` are exact integers.

Packing (``slots > 1``)
-----------------------
``S`` values share one plaintext. Each slot is ``W`` bytes wide (``W >= 8``); slot ``k`` holds
the non-negative integer ``s = q + o`` (offset ``o = ceil(bound * 2**f)`` maps negatives into
``[0, 2o]``) in its low 8 bytes; the high bytes and the unused high bits of the low 8 bytes are
headroom, sized so that the sum of ``max_summands`` slots never carries into the next slot:
``max_summands * 2o < 2**(8W)``. Slots are laid out big-endian (slot 0 most significant) and
the whole plaintext stays below ``2**(key_length - 1) < n``. Adding ciphertexts adds every slot
at once. A decrypted sum is split back into slots; the low 64 bits of slot ``k`` minus
``count * o`` (mod ``2**64``, read as int64) is exactly ``sum(q)`` whenever that sum fits in
int64 (checked when the layout is made). With ``slots == 1`` (``packing=False``) each value is
its own plaintext in phe's signed convention (``q mod n``; values above ``n/2`` are negative).

Homomorphic addition of two ciphertexts is their product modulo ``n**2`` (what phe's
``EncryptedNumber._raw_add`` computes); it is done here on gmpy2 integers in bulk.
Encryption is :meth:`phe.paillier.PaillierPublicKey.raw_encrypt` (fresh obfuscator from
``random.SystemRandom``, i.e. the OS CSPRNG), decryption
:meth:`phe.paillier.PaillierPrivateKey.raw_decrypt` (CRT). Both run in joblib workers when
``jobs != 1``; workers receive only integers (``n``, or ``p`` and ``q``) and rebuild the keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import gmpy2
import numpy as np
from phe import paillier
from phe.encoding import EncodedNumber


class FixedPointEncoding(EncodedNumber):
    """phe encoding with base 2, so that the exponent ``-f`` means ``f`` fractional bits."""

    BASE = 2
    LOG2_BASE = 1.0


@dataclass(frozen=True)
class SlotLayout:
    """How values are laid out in Paillier plaintexts.

    Attributes
    ----------
    key_length : int            bits of the modulus n
    precision : int             fractional bits f (public exponent is -f)
    bound : float               every encoded value satisfies |x| <= bound
    max_summands : int          most ciphertexts ever added into one sum
    slots : int                 values per plaintext (1 = no packing)
    slot_bytes : int            bytes per slot W (packing only)
    offset : int                o = ceil(bound * 2**f) (packing only)
    """

    key_length: int
    precision: int
    bound: float
    max_summands: int
    slots: int
    slot_bytes: int
    offset: int

    @property
    def exponent(self) -> int:
        return -self.precision

    @property
    def ciphertext_bytes(self) -> int:
        """Fixed width of one serialized ciphertext (n**2 < 2**(2 * key_length))."""
        return 2 * ((self.key_length + 7) // 8)

    def n_ciphertexts(self, length: int) -> int:
        """Ciphertexts needed for a row of ``length`` values."""
        return -(-length // self.slots)

    def to_meta(self) -> dict:
        return {
            "key_length": self.key_length,
            "precision": self.precision,
            "exponent": self.exponent,
            "bound": self.bound,
            "max_summands": self.max_summands,
            "slots": self.slots,
            "slot_bytes": self.slot_bytes,
            "offset": str(self.offset),
        }


def make_layout(key_length: int, precision: int, bound: float, max_summands: int, packing: bool = True) -> SlotLayout:
    """The slot layout for values ``|x| <= bound`` summed at most ``max_summands`` times.

    Raises ValueError when the exact integer sums would not fit in int64 or no slot fits the key.
    """
    max_summands = max(int(max_summands), 1)
    offset = math.ceil(bound * 2.0**precision)
    if max_summands * offset >= 2**62:
        raise ValueError(
            f"fixed-point sums overflow int64: {max_summands} summands of |x| <= {bound} with {precision} "
            "fractional bits; lower precision or bound"
        )
    if not packing:
        return SlotLayout(key_length, precision, bound, max_summands, 1, 0, offset)
    needed_bits = (max_summands * (2 * offset + 1)).bit_length()
    slot_bytes = max(8, -(-needed_bits // 8))
    slots = (key_length - 1) // (8 * slot_bytes)
    if slots < 1:
        raise ValueError(f"a {key_length}-bit key cannot hold one {8 * slot_bytes}-bit slot")
    return SlotLayout(key_length, precision, bound, max_summands, slots, slot_bytes, offset)


def quantize(values: np.ndarray, precision: int, bound: float) -> np.ndarray:
    """Fixed-point values ``rint(x * 2**precision)`` as int64 (exact); |x| must be <= bound."""
    x = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("cannot encrypt non-finite values")
    if x.size and float(np.max(np.abs(x))) > bound:
        raise ValueError(f"value {float(np.max(np.abs(x))):.6g} exceeds the Paillier encoding bound {bound:g}")
    return np.rint(np.ldexp(x, precision)).astype(np.int64)


def encode_plaintexts(q: np.ndarray, layout: SlotLayout, n: int) -> list[int]:
    """Plaintext integers for the int64 rows ``q`` (rows x L): ``rows * ceil(L / S)`` of them, row-major."""
    q = np.asarray(q, dtype=np.int64)
    if q.ndim != 2:
        raise ValueError("q must be 2-D (rows x values)")
    rows, length = q.shape
    if layout.slots == 1:
        return [int(v) % n for v in q.ravel().tolist()]
    S, W = layout.slots, layout.slot_bytes
    C = layout.n_ciphertexts(length)
    s = np.zeros((rows, C * S), dtype=">u8")
    s[:, :length] = (q + layout.offset).astype(np.uint64)
    buf = np.zeros((rows * C, S, W), dtype=np.uint8)
    buf[:, :, W - 8 :] = s.reshape(rows * C, S).view(np.uint8).reshape(rows * C, S, 8)
    raw = buf.tobytes()
    step = S * W
    return [int.from_bytes(raw[i : i + step], "big") for i in range(0, len(raw), step)]


def decode_sums(plaintexts: Sequence[int], counts: np.ndarray, layout: SlotLayout, length: int, n: int) -> np.ndarray:
    """Exact int64 sums of q from decrypted sums.

    Parameters
    ----------
    plaintexts : ``rows * ceil(length / S)`` decrypted integers, row-major.
    counts : int (rows,) number of summands in each row's sums (the offset is removed per summand).
    """
    counts = np.asarray(counts, dtype=np.int64)
    rows = len(counts)
    if layout.slots == 1:
        vals = np.array([(v - n) if v > n // 2 else v for v in plaintexts], dtype=np.int64)
        return vals.reshape(rows, length)
    S, W = layout.slots, layout.slot_bytes
    C = layout.n_ciphertexts(length)
    raw = b"".join(int(v).to_bytes(S * W, "big") for v in plaintexts)
    buf = np.frombuffer(raw, dtype=np.uint8).reshape(rows * C, S, W)
    low = np.ascontiguousarray(buf[:, :, W - 8 :]).view(">u8").reshape(rows, C * S)[:, :length].astype(np.uint64)
    correction = (counts.astype(np.uint64) * np.uint64(layout.offset))[:, None]
    return (low - correction).view(np.int64)


def dequantize(q_sums: np.ndarray, precision: int) -> np.ndarray:
    """float64 ``q / 2**precision``."""
    return np.ldexp(np.asarray(q_sums, dtype=np.float64), -precision)


# ------------------------------------------------------------------ crypto in bulk


def _encrypt_chunk(n: int, plaintexts: list[int], width: int) -> bytes:
    pk = paillier.PaillierPublicKey(n)
    return b"".join(pk.raw_encrypt(m).to_bytes(width, "big") for m in plaintexts)


def _decrypt_chunk(n: int, p: int, q: int, ciphertexts: list[int]) -> list[int]:
    sk = paillier.PaillierPrivateKey(paillier.PaillierPublicKey(n), p, q)
    return [int(sk.raw_decrypt(int(c))) for c in ciphertexts]


def _chunks(seq: list, parts: int) -> list[list]:
    size = -(-len(seq) // max(parts, 1))
    return [seq[i : i + size] for i in range(0, len(seq), size)] if seq else []


def _n_workers(jobs: int) -> int:
    import os

    if jobs is None or jobs == 1:
        return 1
    cpus = os.cpu_count() or 1
    return cpus if jobs < 0 else min(jobs, cpus)


def encrypt(n: int, plaintexts: list[int], width: int, jobs: int = 1) -> np.ndarray:
    """Encrypt each plaintext under public modulus ``n``: uint8 array (count x width), big-endian."""
    workers = _n_workers(jobs)
    if workers == 1 or len(plaintexts) < 64:
        raw = _encrypt_chunk(n, plaintexts, width)
    else:
        from joblib import Parallel, delayed

        parts = Parallel(n_jobs=workers)(
            delayed(_encrypt_chunk)(n, chunk, width) for chunk in _chunks(plaintexts, 4 * workers)
        )
        raw = b"".join(parts)
    return np.frombuffer(raw, dtype=np.uint8).reshape(len(plaintexts), width)


def to_ints(ciphertexts: np.ndarray) -> list:
    """gmpy2 integers of fixed-width big-endian ciphertext rows (any leading shape, flattened)."""
    arr = np.ascontiguousarray(ciphertexts, dtype=np.uint8)
    width = arr.shape[-1]
    raw = arr.tobytes()
    return [gmpy2.mpz(int.from_bytes(raw[i : i + width], "big")) for i in range(0, len(raw), width)]


def from_ints(values: Sequence, width: int) -> np.ndarray:
    """Inverse of :func:`to_ints`: uint8 (count x width)."""
    raw = b"".join(int(v).to_bytes(width, "big") for v in values)
    return np.frombuffer(raw, dtype=np.uint8).reshape(len(values), width)


def add_grouped(ciphertexts: list, groups: np.ndarray, n_groups: int, nsquare: int) -> list:
    """Homomorphic sums: the product mod n**2 of the ciphertexts of each group.

    Groups without a member get ``None``.
    """
    groups = np.asarray(groups, dtype=np.int64)
    nsq = gmpy2.mpz(nsquare)
    out: list = [None] * n_groups
    order = np.argsort(groups, kind="stable").tolist()
    g_sorted = groups[order].tolist()
    for pos, g in zip(order, g_sorted):
        c = ciphertexts[pos]
        acc = out[g]
        out[g] = c if acc is None else gmpy2.f_mod(gmpy2.mul(acc, c), nsq)
    return out


def decrypt(n: int, p: int, q: int, ciphertexts: list, jobs: int = 1) -> list[int]:
    """Decrypt ciphertext integers with the secret primes (CRT)."""
    workers = _n_workers(jobs)
    plain = [int(c) for c in ciphertexts]
    if workers == 1 or len(plain) < 64:
        return _decrypt_chunk(n, p, q, plain)
    from joblib import Parallel, delayed

    parts = Parallel(n_jobs=workers)(delayed(_decrypt_chunk)(n, p, q, chunk) for chunk in _chunks(plain, 4 * workers))
    return [v for part in parts for v in part]


def generate_keypair(key_length: int) -> tuple[paillier.PaillierPublicKey, paillier.PaillierPrivateKey]:
    """phe key generation; primes come from ``random.SystemRandom`` (the OS CSPRNG), never numpy."""
    return paillier.generate_paillier_keypair(n_length=key_length)


def encrypt_fixed(public_key: paillier.PaillierPublicKey, values: np.ndarray, precision: int) -> list[paillier.EncryptedNumber]:
    """phe :class:`EncryptedNumber` objects of ``values``, all with the exponent ``-precision``.

    The reference (unpacked) form of the wire encoding, for checks and interoperability with phe:
    ``private_key.decrypt_encoded(e, FixedPointEncoding).decode()`` returns the fixed-point value.
    """
    q = quantize(values, precision, float("inf")).ravel().tolist()
    out = []
    for v in q:
        enc = FixedPointEncoding(public_key, int(v) % public_key.n, -precision)
        out.append(public_key.encrypt_encoded(enc, None))
    return out
