"""Cryptographic helpers of secure aggregation (Bonawitz et al. 2017; FedNCF paper §3.4).

* X25519 key agreement and HKDF-SHA256 (``cryptography``) derive a 32-byte pair seed;
* a ChaCha20 keystream (``cryptography``) expands a seed into uniform ring elements
  (bytes -> ``np.frombuffer`` as uint32/uint64: every element uniform on Z_2^b);
* fixed-point encoding of floats into Z_2^b (two's complement) and back;
* t-of-n Shamir secret sharing over the prime field GF(2^521 - 1), randomness from ``secrets``.

Nothing here uses numpy's random generators: all key material, seeds and masks come from
``secrets`` / ``os.urandom`` (through ``cryptography``).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: Mersenne prime 2^521 - 1: the Shamir field (larger than any 256-bit secret).
PRIME = (1 << 521) - 1
_NONCE = bytes(16)  # a fresh key per (pair, round, kind), so a fixed nonce is safe


def ring_dtype(ring_bits: int) -> np.dtype:
    if ring_bits == 32:
        return np.dtype(np.uint32)
    if ring_bits == 64:
        return np.dtype(np.uint64)
    raise ValueError(f"ring_bits must be 32 or 64, got {ring_bits}")


def signed_dtype(ring_bits: int) -> np.dtype:
    return np.dtype(np.int32) if ring_bits == 32 else np.dtype(np.int64)


# ------------------------------------------------------------------------------ keys and seeds
def keypair() -> tuple[X25519PrivateKey, X25519PublicKey]:
    sk = X25519PrivateKey.generate()
    return sk, sk.public_key()


def private_bytes(sk: X25519PrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return sk.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())


def private_from_bytes(raw: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(raw)


def pair_seed(sk: X25519PrivateKey, peer: X25519PublicKey, info: bytes) -> bytes:
    """32-byte seed shared by two parties: HKDF-SHA256 of their X25519 shared secret."""
    shared = sk.exchange(peer)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def expand(seed: bytes, info: bytes, count: int, ring_bits: int) -> np.ndarray:
    """``count`` uniform elements of Z_2^ring_bits from a ChaCha20 keystream keyed by HKDF(seed, info)."""
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"prg|" + info).derive(seed)
    dtype = ring_dtype(ring_bits)
    enc = Cipher(algorithms.ChaCha20(key, _NONCE), mode=None).encryptor()
    stream = enc.update(bytes(count * dtype.itemsize))
    return np.frombuffer(stream, dtype=dtype).copy()


# ------------------------------------------------------------------------------ fixed point
def encode(x: np.ndarray, frac_bits: int, ring_bits: int) -> np.ndarray:
    """round(x * 2^frac_bits) as a two's-complement element of Z_2^ring_bits."""
    q = np.rint(np.asarray(x, dtype=np.float64) * float(2**frac_bits)).astype(np.int64)
    return q.astype(signed_dtype(ring_bits)).view(ring_dtype(ring_bits))


def decode(r: np.ndarray, frac_bits: int, ring_bits: int) -> np.ndarray:
    """Inverse of :func:`encode` (values in [-2^(b-1), 2^(b-1)) / 2^frac_bits)."""
    return np.asarray(r, dtype=ring_dtype(ring_bits)).view(signed_dtype(ring_bits)).astype(np.float64) / float(
        2**frac_bits
    )


def ring_sum(vectors: Sequence[np.ndarray], ring_bits: int) -> np.ndarray:
    """Sum modulo 2^ring_bits (numpy unsigned overflow wraps)."""
    dtype = ring_dtype(ring_bits)
    if not len(vectors):
        raise ValueError("nothing to sum")
    return np.sum(np.stack([np.asarray(v, dtype=dtype) for v in vectors]), axis=0, dtype=dtype)


# ------------------------------------------------------------------------------ Shamir
def shamir_split(secret: int, n: int, t: int) -> list[tuple[int, int]]:
    """``n`` shares (x = 1..n, y) of ``secret`` (< PRIME); any ``t`` reconstruct it."""
    if not 1 <= t <= n:
        raise ValueError(f"need 1 <= t <= n, got t={t}, n={n}")
    if not 0 <= secret < PRIME:
        raise ValueError("secret out of the field")
    coeffs = [secret] + [secrets.randbelow(PRIME) for _ in range(t - 1)]
    shares = []
    for x in range(1, n + 1):
        y = 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % PRIME
        shares.append((x, y))
    return shares


def shamir_combine(shares: Sequence[tuple[int, int]]) -> int:
    """Lagrange interpolation at 0 of ``shares`` (at least t distinct points)."""
    xs = [x for x, _ in shares]
    if len(set(xs)) != len(xs):
        raise ValueError("duplicate share points")
    secret = 0
    for j, (xj, yj) in enumerate(shares):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num = (num * -xm) % PRIME
                den = (den * (xj - xm)) % PRIME
        secret = (secret + yj * num * pow(den, -1, PRIME)) % PRIME
    return secret
