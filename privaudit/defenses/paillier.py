"""Defense ``paillier``: Paillier-encrypted uploads, decrypting clients, ciphertext packing.

PrivMVMF (PrivMVMF paper §5.1, Algorithm 2): one client makes the key pair and shares the secret
key with the decrypting clients; clients encrypt their uploads, the server adds ciphertexts per
item row (and per entry of dense uploads), and the decryptors return the plaintext sums, so the
server sees item ids, ciphertexts and per-cohort sums only. Values are fixed point with one
public exponent; several are packed per plaintext; the obfuscator is Paillier's ``r^n`` or
Damgård–Jurik–Nielsen's short-exponent ``h_s^r``. What each party sees, the cohorts, the
obfuscators' security assumptions and the departures from the paper: ``docs/paillier.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from privaudit.defenses import _paillier_packing as pk
from privaudit.defenses.base import AGGREGATION, UPLOAD, ChannelContext, Defense, RoundUploads, UploadBatch
from privaudit.errors import PrivauditError
from privaudit.params import Param
from privaudit.registry import register_defense
from privaudit.schema import ENCRYPTED, DefenseSchema, MessageSchema, PayloadField

PHASES = ("offline", "encrypt", "aggregate", "decrypt")
#: smallest modulus accepted outside tests (bits; NIST SP 800-57 deems 2048-bit factoring moduli acceptable)
MIN_KEY_LENGTH = 2048
#: largest modulus accepted (bits): key generation grows with the cube of the length
MAX_KEY_LENGTH = 16384
#: the key length tests use; needs ``insecure_test_key=True`` (breakable in minutes)
TEST_KEY_LENGTH = 512


def _int_bytes(value: int) -> np.ndarray:
    raw = int(value).to_bytes(max(1, (int(value).bit_length() + 7) // 8), "big")
    return np.frombuffer(raw, dtype=np.uint8).copy()


@dataclass(frozen=True)
class _KeySum:
    """One encrypted payload key being summed: its uploaded ``shape`` (indexed: (rows, *inner)),
    whether uploads are row-indexed, and the packing ``layout``."""

    key: str
    shape: tuple
    indexed: bool
    layout: Any

    @property
    def field(self) -> str:
        return "ciphertexts" if self.key == "values" else f"{self.key}_ciphertexts"

    @property
    def inner(self) -> tuple:
        return tuple(self.shape[1:]) if self.indexed else ()

    @property
    def length(self) -> int:
        return int(np.prod(self.inner)) if self.indexed else int(np.prod(self.shape))

    @property
    def width(self) -> int:
        return self.layout.ciphertext_bytes


@dataclass
class _CohortSum:
    """A cohort's ciphertext sums: ``sums`` (len(uniq) * n_ct,) per row ``uniq`` and
    ciphertext index, with how many clients uploaded each row (``counts``)."""

    uniq: np.ndarray
    counts: np.ndarray
    sums: list
    n_ct: int


@register_defense("paillier")
class PaillierDefense(Defense):
    """Paillier encryption of every upload; decrypting clients decrypt only the sums (PrivMVMF)."""

    description = "Paillier-encrypted uploads, server adds ciphertexts, decrypting clients decrypt sums (PrivMVMF)"
    parameters = (
        Param(
            "key_length",
            2048,
            f"bits of the Paillier modulus n (2048 default, at least {MIN_KEY_LENGTH}); a multiple of 8",
            ge=128,
            le=MAX_KEY_LENGTH,
        ),
        Param("decryptors", 1, "number of decrypting clients; the ciphertext sums are split among them", ge=1),
        Param("packing", True, "pack several fixed-point values per ciphertext (false: one value per ciphertext)"),
        Param(
            "precision", 32, "fractional bits of the fixed-point encoding (one public exponent -precision)", ge=0, le=52
        ),
        Param("bound", 1048576.0, "largest |value| a client may encrypt (sizes the packing slots)", gt=0),
        Param("cohort_size", 0, "server sums senders in cohorts of this size (0: all senders in one sum)", ge=0),
        Param("jobs", 1, "joblib workers for encryption/decryption (1: in process, -1: all cores); not 0"),
        Param(
            "obfuscation",
            "standard",
            "standard: r^n, r uniform mod n (Paillier); "
            "djn: h_s^r, r of half the modulus bits (Damgard-Jurik-Nielsen, faster)",
            choices=pk.OBFUSCATIONS,
        ),
        Param(
            "precompute",
            0,
            "obfuscators computed when the key is made, before round 0 (offline phase; more are made on demand)",
            ge=0,
        ),
        Param(
            "insecure_test_key", False, f"allow key_length below {MIN_KEY_LENGTH} (tests only: such keys are breakable)"
        ),
    )
    strength = None
    capabilities = frozenset({UPLOAD, AGGREGATION})
    acts_on = (("*", "*"),)  # every upload, encrypted
    #: protocols whose servers only add what clients upload (FedSplit's server reads per-client
    #: sums and FedProto's silo its prototypes in the clear: there the defense cannot run)
    applies_to = ("fedmvmf", "privmvmf", "fedrec")
    default_grid = ()
    #: encrypted uploads, the key holder's key material, the key distribution and the sums sent
    #: to and from the decryptors
    schema_contribution = DefenseSchema(
        messages=(
            MessageSchema(
                "private",
                "client",
                "self",
                (PayloadField("paillier_p", "uint8", (None,)), PayloadField("paillier_q", "uint8", (None,))),
            ),
            MessageSchema(
                "public_key",
                "client",
                "server",
                # djn_base: the Damgard-Jurik-Nielsen obfuscator's public base h_s (obfuscation=djn)
                (PayloadField("n", "uint8", (None,)), PayloadField("djn_base", "uint8", (None,), optional=True)),
            ),
            MessageSchema("secret_key", "client", "decryptor"),
            MessageSchema(
                "ciphertext_sum",
                "server",
                "decryptor",
                (
                    PayloadField("ciphertexts", "uint8", (None, None, None)),
                    PayloadField("items", "int", ("@r",), ids="m", unique=True, optional=True),
                    PayloadField("index", "int", (None,), optional=True),
                ),
            ),
            MessageSchema(
                "plaintext_sum",
                "decryptor",
                "server",
                (
                    PayloadField("values", "float", (None, None)),
                    PayloadField("items", "int", ("@r",), ids="m", unique=True, optional=True),
                    PayloadField("counts", "int", ("@r",), optional=True),
                    PayloadField("index", "int", (None,), optional=True),
                ),
            ),
        ),
        upload_forms=(ENCRYPTED,),
    )

    @property
    def short_key_warning(self) -> str | None:
        """One line when the key is shorter than :data:`MIN_KEY_LENGTH` (allowed by ``insecure_test_key``)."""
        bits = self.config["key_length"]
        if bits >= MIN_KEY_LENGTH:
            return None
        return f"paillier key_length = {bits} bits is below {MIN_KEY_LENGTH}: breakable, for tests only (insecure_test_key)"

    def validate(self) -> None:
        c = self.config
        if c["key_length"] % 8:
            raise PrivauditError(f"defense 'paillier': key_length must be a multiple of 8, got {c['key_length']!r}")
        if c["key_length"] < MIN_KEY_LENGTH and not c["insecure_test_key"]:
            raise PrivauditError(
                f"defense 'paillier': key_length must be >= {MIN_KEY_LENGTH} (got {c['key_length']}; "
                "insecure_test_key=true allows short keys in tests)"
            )
        if c["jobs"] == 0:
            raise PrivauditError("defense 'paillier': jobs must be non-zero")

    def __init__(self, **overrides: Any):
        super().__init__(**overrides)
        self._public = None
        self._secret = None
        self._pool: pk.ObfuscatorPool | None = None
        self.keyholder: str | None = None
        #: seconds spent per round and phase (encrypt / aggregate / decrypt; decrypt is the
        #: slowest decryptor's time, ``decrypt_total`` the sum over decryptors)
        self.timings: dict[int, dict[str, float]] = {}
        self.ciphertext_counts: dict[int, dict[str, int]] = {}
        #: clock used for :attr:`timings` (a benchmark may use ``time.process_time``)
        self.clock = time.perf_counter

    # ------------------------------------------------------------------ helpers

    def hides_plaintext(self) -> bool:
        return True

    @property
    def decryptor_ids(self) -> list[str]:
        return [f"decryptor:{k}" for k in range(self.config["decryptors"])]

    def _tick(self, round: int, phase: str, seconds: float) -> None:
        slot = self.timings.setdefault(int(round), {})
        slot[phase] = slot.get(phase, 0.0) + seconds

    def _count(self, round: int, what: str, n: int) -> None:
        slot = self.ciphertext_counts.setdefault(int(round), {})
        slot[what] = slot.get(what, 0) + int(n)

    def layout(self, max_summands: int) -> pk.SlotLayout:
        c = self.config
        try:
            return pk.make_layout(c["key_length"], c["precision"], c["bound"], max_summands, c["packing"])
        except ValueError as exc:
            raise PrivauditError(f"defense 'paillier': {exc}") from None

    def _ensure_keys(self, batch: UploadBatch, channel: ChannelContext) -> None:
        if self._public is not None:
            return
        self._public, self._secret = pk.generate_keypair(self.config["key_length"])
        n = self._public.n
        hs = pk.djn_base(n) if self.config["obfuscation"] == "djn" else None
        self._pool = pk.ObfuscatorPool(n, hs, self.config["jobs"])
        t0 = self.clock()
        self._pool.fill(self.config["precompute"])
        self._tick(-1, "offline", self.clock() - t0)  # before round 0
        self.keyholder = batch.senders[0] if batch.senders else "client:0"
        tr = channel.transcript
        for party in self.decryptor_ids:
            if tr.parties and party not in tr.parties:
                tr.parties.append(party)
        r = batch.round
        tr.add(
            r,
            self.keyholder,
            self.keyholder,
            "private",
            {"paillier_p": _int_bytes(self._secret.p), "paillier_q": _int_bytes(self._secret.q)},
            {"scheme": "paillier"},
        )
        public = {"n": _int_bytes(n)} if hs is None else {"n": _int_bytes(n), "djn_base": _int_bytes(hs)}
        tr.add(
            r,
            self.keyholder,
            batch.receiver,
            "public_key",
            public,
            {"scheme": "paillier", "key_length": self.config["key_length"], "obfuscation": self.config["obfuscation"]},
        )
        for party in self.decryptor_ids:
            tr.add(r, self.keyholder, party, "secret_key", {}, {"scheme": "paillier", "holder": self.keyholder})

    def _cohorts(self, n_senders: int) -> list[np.ndarray]:
        c = self.config["cohort_size"]
        if c <= 0 or c >= n_senders:
            return [np.arange(n_senders)]
        return [np.arange(s, min(s + c, n_senders)) for s in range(0, n_senders, c)]

    # ------------------------------------------------------------------ client side

    def process_uploads(
        self, uploads: RoundUploads, ctx: ChannelContext, call_next: Callable[[RoundUploads], RoundUploads]
    ) -> RoundUploads:
        """Encrypt every batch (one at a time); the receiver's sum is homomorphic, then decrypted (:meth:`sum_encrypted`)."""
        return call_next(uploads.map(lambda b: self.encrypt(b, ctx)))

    def encrypt(self, batch: UploadBatch, channel: ChannelContext) -> UploadBatch:
        """Encrypt every float entry of every payload (fixed point, one exponent), keep ``items`` clear."""
        if not batch.payloads:
            return batch
        self._ensure_keys(batch, channel)
        t0 = self.clock()
        n = self._public.n
        cohort = max(len(ix) for ix in self._cohorts(len(batch.senders)))
        layout = self.layout(cohort)
        width = layout.ciphertext_bytes
        float_keys = batch.float_keys(batch.payloads[0])
        plaintexts: list[int] = []
        plan = []  # per payload: list of (key, rows, length, n_ct, start)
        shapes: dict[str, list[int]] = {}
        for payload in batch.payloads:
            entries = []
            for key in float_keys:
                arr = np.asarray(payload[key], dtype=np.float64)
                if "items" in payload and key != "items":
                    rows = len(payload["items"])
                    q2 = arr.reshape(rows, -1)
                    shapes[key] = [-1] + list(arr.shape[1:])
                else:
                    q2 = arr.reshape(1, -1)
                    shapes[key] = list(arr.shape)
                try:
                    q = pk.quantize(q2, layout.precision, layout.bound)
                except ValueError as exc:
                    raise PrivauditError(f"defense 'paillier': {exc}") from None
                start = len(plaintexts)
                plaintexts.extend(pk.encode_plaintexts(q, layout, n))
                entries.append((key, q.shape[0], q.shape[1], layout.n_ciphertexts(q.shape[1]), start))
            plan.append(entries)
        t1 = self.clock()
        obfs = self._pool.take(len(plaintexts))  # offline phase (message-independent)
        offline = self.clock() - t1
        self._tick(batch.round, "offline", offline)
        cts = pk.encrypt_online(n, plaintexts, obfs, width)
        out_payloads = []
        for payload, entries in zip(batch.payloads, plan):
            new = {k: v for k, v in payload.items() if k not in float_keys}
            for key, rows, _length, n_ct, start in entries:
                name = "ciphertexts" if key == "values" else f"{key}_ciphertexts"
                new[name] = cts[start : start + rows * n_ct].reshape(rows, n_ct, width)
            out_payloads.append(new)
        meta = dict(batch.meta)
        meta.update(
            {
                "encrypted": True,
                "scheme": "paillier",
                "packing": bool(self.config["packing"]),
                "encrypted_keys": list(float_keys),
                "shapes": shapes,
                **layout.to_meta(),
            }
        )
        self._tick(batch.round, "encrypt", self.clock() - t0 - offline)
        self._count(batch.round, "encrypted", len(plaintexts))
        return UploadBatch(
            batch.round,
            batch.kind,
            list(batch.senders),
            out_payloads,
            batch.receiver,
            batch.noisy_keys,
            meta,
            batch.recorded,
            receiver_sum=self.sum_encrypted,
        )

    # ------------------------------------------------------------------ server + decryptors

    def sum_encrypted(self, batch: UploadBatch, channel: ChannelContext, rows: int | None) -> dict[str, np.ndarray]:
        """Homomorphic sums per item row / dense entry (per cohort), decrypted by the decryptors."""
        if not batch.payloads:
            return {}
        layout = self.layout(int(batch.meta["max_summands"]))
        shapes = batch.meta["shapes"]
        indexed = "items" in batch.payloads[0]
        if indexed and rows is None:
            raise ValueError("rows is required to sum row-indexed uploads")
        result: dict[str, np.ndarray] = {}
        if indexed:
            all_items = np.concatenate([np.asarray(p["items"], dtype=np.int64) for p in batch.payloads])
            result["counts"] = np.bincount(all_items, minlength=rows).astype(np.int64)
        for key in batch.meta["encrypted_keys"]:
            ks = _KeySum(key, tuple(shapes[key]), indexed, layout)
            total = None
            for ci, members in enumerate(self._cohorts(len(batch.senders))):
                cs = self._add_ciphertexts(batch, members, ks)
                cohort_sum = self._decrypt_cohort(batch, channel, ks, cs, ci, members)
                # ---- server: add the cohort's plaintext sum to the total
                if indexed:
                    if total is None:
                        total = np.zeros((rows, ks.length))
                    total[cs.uniq] += cohort_sum
                else:
                    total = cohort_sum[0] if total is None else total + cohort_sum[0]
            result[key] = total.reshape(((rows,) + ks.inner) if indexed else ks.shape)
        return result

    def _add_ciphertexts(self, batch: UploadBatch, members: list[int], ks: _KeySum) -> _CohortSum:
        """Server: the cohort's ciphertexts added per (row, ciphertext index)."""
        payloads = [batch.payloads[i] for i in members]
        t0 = self.clock()
        cts = [np.asarray(p[ks.field], dtype=np.uint8) for p in payloads]
        n_ct = cts[0].shape[1]
        if ks.indexed:
            items = np.concatenate([np.asarray(p["items"], dtype=np.int64) for p in payloads])
            uniq, inv = np.unique(items, return_inverse=True)
            counts = np.bincount(inv, minlength=len(uniq))
        else:
            uniq = np.zeros(1, dtype=np.int64)
            inv = np.zeros(len(payloads), dtype=np.int64)
            counts = np.array([len(payloads)], dtype=np.int64)
        flat = pk.to_ints(np.concatenate(cts, axis=0))
        groups = (inv[:, None] * n_ct + np.arange(n_ct)[None, :]).ravel()
        sums = pk.add_grouped(flat, groups, len(uniq) * n_ct, self._public.nsquare)
        self._tick(batch.round, "aggregate", self.clock() - t0)
        self._count(batch.round, "aggregated", len(flat))
        return _CohortSum(uniq, counts, sums, n_ct)

    def _decrypt_cohort(
        self, batch: UploadBatch, channel: ChannelContext, ks: _KeySum, cs: _CohortSum, ci: int, members: list[int]
    ) -> np.ndarray:
        """Decryptors: each decrypts a round-robin share of the cohort's rows -> (rows, length) sums."""
        cohort_sum = np.zeros((len(cs.uniq), ks.length))
        slowest = 0.0
        for k, party in enumerate(self.decryptor_ids):
            mine = np.arange(k, len(cs.uniq), self.config["decryptors"])
            if len(mine) == 0:
                continue
            my_cts = [cs.sums[r * cs.n_ct + j] for r in mine for j in range(cs.n_ct)]
            if batch.recorded:
                payload = {"ciphertexts": pk.from_ints(my_cts, ks.width).reshape(len(mine), cs.n_ct, ks.width)}
                payload["items" if ks.indexed else "index"] = cs.uniq[mine] if ks.indexed else mine
                meta = {"of_kind": batch.kind, "key": ks.key, "cohort": ci, "encrypted": True, "scheme": "paillier"}
                channel.transcript.add(batch.round, batch.receiver, party, "ciphertext_sum", payload, meta)
            t0 = self.clock()
            values = self._decrypt_values(my_cts, cs.counts[mine], ks)
            dt = self.clock() - t0
            slowest = max(slowest, dt)
            self._tick(batch.round, "decrypt_total", dt)
            self._count(batch.round, "decrypted", len(my_cts))
            cohort_sum[mine] = values
            if batch.recorded:
                if ks.indexed:
                    out = {
                        "items": cs.uniq[mine],
                        "counts": cs.counts[mine].astype(np.int64),
                        "values": values.reshape((len(mine),) + ks.inner),
                    }
                else:
                    out = {"index": mine, "values": values.reshape(ks.shape)}
                meta = {
                    "of_kind": batch.kind,
                    "key": ks.key,
                    "cohort": ci,
                    "members": [batch.senders[i] for i in members],
                }
                channel.transcript.add(batch.round, party, batch.receiver, "plaintext_sum", out, meta)
        self._tick(batch.round, "decrypt", slowest)
        return cohort_sum

    def _decrypt_values(self, cts: list, counts: np.ndarray, ks: _KeySum) -> np.ndarray:
        """Decrypt summed ciphertexts and decode them into (rows, length) float sums."""
        n = self._public.n
        plain = pk.decrypt(n, self._secret.p, self._secret.q, cts, self.config["jobs"])
        try:
            q = pk.decode_sums(plain, counts, ks.layout, ks.length, n)
        except ValueError as exc:
            raise PrivauditError(f"defense 'paillier': {exc}") from None
        return pk.dequantize(q, ks.layout.precision)

    def reset_timings(self) -> None:
        self.timings.clear()
        self.ciphertext_counts.clear()
