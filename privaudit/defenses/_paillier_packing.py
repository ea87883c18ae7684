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
Encryption is split into an offline phase, :func:`obfuscators` (``r^n`` as in
:meth:`phe.paillier.PaillierPublicKey.raw_encrypt`, or the Damgård–Jurik–Nielsen ``h_s^r`` with
a short ``r`` on a fixed-base table; ``r`` from :mod:`secrets`), and an online phase,
:func:`encrypt_online` (``(1 + m n) * obfuscator mod n^2``, phe's ciphertext form, so phe
decrypts it unchanged); :func:`encrypt` is phe's own ``raw_encrypt`` (the reference).
Decryption is :meth:`phe.paillier.PaillierPrivateKey.raw_decrypt` (CRT). Obfuscators and
decryption run in joblib workers when ``jobs != 1``; workers receive only integers (``n`` and
``h_s``, or ``p`` and ``q``) and rebuild what they need.
"""

from __future__ import annotations

import functools
import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

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
    if rows and int(counts.max()) > layout.max_summands:
        raise ValueError(
            f"slot overflow: a sum of {int(counts.max())} ciphertexts on a layout sized for "
            f"{layout.max_summands} summands"
        )
    if layout.slots == 1:
        half = n // 2
        signed = [(int(v) - n) if v > half else int(v) for v in plaintexts]
        limits = np.repeat(counts, length).tolist()
        for v, c in zip(signed, limits):
            if abs(v) > c * layout.offset:
                raise ValueError(f"overflow: a decrypted sum of {c} values exceeds {c} x the encoding bound")
        return np.array(signed, dtype=np.int64).reshape(rows, length)
    S, W = layout.slots, layout.slot_bytes
    C = layout.n_ciphertexts(length)
    try:
        raw = b"".join(int(v).to_bytes(S * W, "big") for v in plaintexts)
    except OverflowError:
        raise ValueError("overflow: a decrypted sum is wider than its slots") from None
    buf = np.frombuffer(raw, dtype=np.uint8).reshape(rows * C, S, W)
    # every slot holds at most count x 2 offset < 2**63 (make_layout keeps max_summands x offset
    # below 2**62): bytes above the low 8 must be zero, padding slots zero, the rest bounded
    if W > 8 and buf[:, :, : W - 8].any():
        raise ValueError("overflow: a decrypted slot exceeds its bound (count x 2 x offset)")
    low = np.ascontiguousarray(buf[:, :, W - 8 :]).view(">u8").reshape(rows, C * S).astype(np.uint64)
    bound = counts.astype(np.uint64)[:, None] * np.uint64(2 * layout.offset)
    if np.any(low[:, :length] > bound) or np.any(low[:, length:] != 0):
        raise ValueError("overflow: a decrypted slot exceeds its bound (count x 2 x offset)")
    correction = (counts.astype(np.uint64) * np.uint64(layout.offset))[:, None]
    return (low[:, :length] - correction).view(np.int64)


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


# ------------------------------------------------------------------ obfuscators (offline phase)

#: obfuscation schemes: ``standard`` r^n (r uniform in [1, n)), ``djn`` h_s^r (r of ceil(k/2) bits)
OBFUSCATIONS = ("standard", "djn")
_WINDOW = 8  # bits per window of the fixed-base table: one table row per byte of the exponent


def djn_base(n: int) -> int:
    """A public fixed base ``h_s = h^n mod n^2`` with ``h = -x^2 mod n``, ``x`` a uniform unit (``secrets``).

    ``h`` generates (with overwhelming probability) the subgroup of Z_n^* of Jacobi symbol 1
    (Damgård, Jurik, Nielsen, "A generalization of Paillier's public-key system with
    applications to electronic voting", International Journal of Information Security, 2010).
    """
    n = gmpy2.mpz(n)
    while True:
        x = gmpy2.mpz(secrets.randbelow(int(n) - 2) + 2)
        if gmpy2.gcd(x, n) == 1:
            break
    h = (-x * x) % n
    return int(gmpy2.powmod(h, n, n * n))


def djn_exponent_bits(n: int) -> int:
    """Bits of the short random exponent: ``ceil(k / 2)`` for a ``k``-bit modulus."""
    return -(-int(n).bit_length() // 2)


@functools.lru_cache(maxsize=2)
def _fixed_base_table(hs: int, nsquare: int, exp_bits: int) -> tuple:
    """``T[i][d] = h_s^(d * 2^(8 i)) mod n^2`` for every byte position ``i`` and byte value ``d``.

    ``ceil(exp_bits / 8) x 256`` entries (16 MiB at 2048 bits), built with 255 products per row;
    cached per process so joblib workers build it once.
    """
    nsq = gmpy2.mpz(nsquare)
    base = gmpy2.mpz(hs)
    rows = []
    for _ in range(-(-exp_bits // _WINDOW)):
        row = [gmpy2.mpz(1), base]
        for _ in range((1 << _WINDOW) - 2):
            row.append(gmpy2.f_mod(gmpy2.mul(row[-1], base), nsq))
        rows.append(tuple(row))
        base = gmpy2.f_mod(gmpy2.mul(row[-1], base), nsq)  # h_s^(256^(i+1))
    return tuple(rows)


def _obfuscators_chunk(n: int, hs: int | None, count: int, width: int) -> bytes:
    """``count`` obfuscators as fixed-width big-endian bytes; randomness from ``secrets`` only."""
    n_ = gmpy2.mpz(n)
    nsq = n_ * n_
    out = []
    if hs is None:  # standard: r^n mod n^2, r uniform in [1, n) (phe's raw_encrypt obfuscator)
        for _ in range(count):
            r = gmpy2.mpz(secrets.randbelow(n - 1) + 1)
            out.append(int(gmpy2.powmod(r, n_, nsq)).to_bytes(width, "big"))
        return b"".join(out)
    bits = djn_exponent_bits(n)
    table = _fixed_base_table(hs, int(nsq), bits)
    nbytes = len(table)
    mul, fmod = gmpy2.mul, gmpy2.f_mod
    for _ in range(count):
        r = secrets.randbits(bits).to_bytes(nbytes, "little")
        acc = gmpy2.mpz(1)
        for row, d in zip(table, r):
            if d:
                acc = fmod(mul(acc, row[d]), nsq)
        out.append(int(acc).to_bytes(width, "big"))
    return b"".join(out)


def obfuscators(n: int, count: int, hs: int | None = None, jobs: int = 1) -> list:
    """``count`` fresh obfuscators (gmpy2 integers): ``r^n`` (``hs`` None) or ``h_s^r`` (DJN).

    Independent of any message: the offline phase of an encryption. Parallel over joblib
    workers when ``jobs != 1``; workers receive only ``n`` and ``h_s``.
    """
    width = 2 * ((int(n).bit_length() + 7) // 8)
    workers = _n_workers(jobs)
    if workers == 1 or count < 64:
        raw = _obfuscators_chunk(n, hs, count, width)
    else:
        from joblib import Parallel, delayed

        sizes = [len(c) for c in _chunks(list(range(count)), 4 * workers)]
        raw = b"".join(Parallel(n_jobs=workers)(delayed(_obfuscators_chunk)(n, hs, k, width) for k in sizes))
    return [gmpy2.mpz(int.from_bytes(raw[i : i + width], "big")) for i in range(0, len(raw), width)]


def encrypt_online(n: int, plaintexts: Sequence[int], obfs: Sequence, width: int) -> np.ndarray:
    """The online phase: ``(1 + m n) * obf mod n^2`` per plaintext ``0 <= m < n`` (phe's ciphertext form).

    uint8 array (count x width), big-endian, as :func:`encrypt` returns.
    """
    if len(obfs) != len(plaintexts):
        raise ValueError(f"{len(plaintexts)} plaintexts but {len(obfs)} obfuscators")
    n_ = gmpy2.mpz(n)
    nsq = n_ * n_
    mul, fmod = gmpy2.mul, gmpy2.f_mod
    raw = b"".join(int(fmod(mul(mul(n_, m) + 1, r), nsq)).to_bytes(width, "big") for m, r in zip(plaintexts, obfs))
    return np.frombuffer(raw, dtype=np.uint8).reshape(len(plaintexts), width)


class ObfuscatorPool:
    """Obfuscators computed ahead of use (the offline phase); each is handed out once.

    Parameters
    ----------
    n : int                     public modulus
    hs : int or None            DJN fixed base ``h_s`` (None: standard ``r^n`` obfuscators)
    jobs : int                  joblib workers for :meth:`fill`

    Example
    -------
    >>> pool = ObfuscatorPool(n, djn_base(n))          # doctest: +SKIP
    >>> pool.fill(10_000)                               # offline, before the round
    >>> cts = encrypt_online(n, plaintexts, pool.take(len(plaintexts)), width)
    """

    def __init__(self, n: int, hs: int | None = None, jobs: int = 1) -> None:
        self.n, self.hs, self.jobs = int(n), hs, jobs
        self._items: list = []
        #: seconds spent computing obfuscators (wall clock) and how many were computed
        self.offline_seconds = 0.0
        self.computed = 0

    def __len__(self) -> int:
        return len(self._items)

    def fill(self, count: int) -> None:
        """Compute ``count`` more obfuscators."""
        if count <= 0:
            return
        t0 = time.perf_counter()
        self._items.extend(obfuscators(self.n, int(count), self.hs, self.jobs))
        self.offline_seconds += time.perf_counter() - t0
        self.computed += int(count)

    def take(self, count: int) -> list:
        """``count`` unused obfuscators (computing any shortfall first); never reused."""
        self.fill(count - len(self._items))
        out, self._items = self._items[:count], self._items[count:]
        return out


def generate_keypair(key_length: int) -> tuple[paillier.PaillierPublicKey, paillier.PaillierPrivateKey]:
    """phe key generation; primes come from ``random.SystemRandom`` (the OS CSPRNG), never numpy."""
    return paillier.generate_paillier_keypair(n_length=key_length)


def encrypt_fixed(
    public_key: paillier.PaillierPublicKey, values: np.ndarray, precision: int
) -> list[paillier.EncryptedNumber]:
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
