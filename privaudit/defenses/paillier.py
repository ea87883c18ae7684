"""Defense ``paillier``: Paillier-encrypted uploads, decrypting clients, ciphertext packing.

PrivMVMF (privmvmf.txt §5.1, Algorithm 2): one client generates the key pair and shares the
secret key with the decrypting clients; every client encrypts its uploads with the public key;
the server multiplies ciphertexts (= adds plaintexts) per item row and per entry of dense
uploads such as grad_P, sends the ciphertext sums to the decrypting clients, which decrypt them
and return the plaintext sums; the server updates its model with those sums only.

What each party sees (and the transcript records):

- keyholder (the first sender, ``client:<k>``): its own ``private`` message carries the secret
  primes ``paillier_p``, ``paillier_q`` (dropped by ``--no-private``); it sends ``public_key``
  (``n``, big-endian uint8) to the server and ``secret_key`` (meta only, the key itself is not
  copied into the transcript again) to every ``decryptor:<k>``;
- server: per client and upload kind, ``items`` in the clear (it must sum per item; with
  sampling this is the set I_u ∪ S_u, privmvmf.txt eq. 37) and ``ciphertexts``, a
  fixed-width big-endian uint8 array (rows x ciphertexts per row x 2*key_bytes; dense uploads
  are one row); meta ``{"encrypted": True, "scheme": "paillier", "exponent": -precision, ...}``
  is the same for every upload of a run. Then ``plaintext_sum`` messages from each decryptor:
  the decrypted sums of its share of the rows (``items``, ``counts``, ``values``; a dense
  upload is one row, decrypted whole by one decryptor: ``index`` = [0] and ``values`` of the
  upload's shape), with meta ``of_kind``, ``cohort`` and ``members`` (the senders summed);
- decryptor ``k``: ``ciphertext_sum`` messages (server -> decryptor:k) with the ciphertext sums
  of its share of the rows (round-robin split of rows among ``decryptors``) and nothing else.

The protocol receives exactly what :func:`~privaudit.protocols.base.plain_sum` would return
(``counts`` per item included), up to fixed-point rounding of each summand to
``2**-precision``: sums are exact sums of the fixed-point values.

Cohorts: with ``cohort_size = c > 0`` the server aggregates (and has decrypted) the senders of
a batch in consecutive cohorts of ``c`` (in sender order), so the decryptors return one sum per
cohort; the protocol still gets the total. ``c = 0`` (default) sums all senders at once as in
the paper. Small cohorts are what the ``mvmf-aggregate`` attack exploits.

Departures from the paper: the paper follows Chai et al.'s number encoding (phe's float
encoding); phe chooses an exponent per value and sends it in the clear, which leaks each
value's magnitude, so here every value uses one public exponent ``-precision`` (fixed point).
Packing several values per plaintext (``packing=True``, default) is an addition of this
toolkit; ``packing=False`` is one value per ciphertext as in the paper.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from privaudit.defenses import _paillier_packing as pk
from privaudit.defenses.base import ChannelContext, Defense, UploadBatch
from privaudit.errors import PrivauditError
from privaudit.params import Param
from privaudit.registry import register_defense

PHASES = ("encrypt", "aggregate", "decrypt")


def _int_bytes(value: int) -> np.ndarray:
    raw = int(value).to_bytes(max(1, (int(value).bit_length() + 7) // 8), "big")
    return np.frombuffer(raw, dtype=np.uint8).copy()


@register_defense("paillier")
class PaillierDefense(Defense):
    """Paillier encryption of every upload; decrypting clients decrypt only the sums (PrivMVMF)."""

    description = "Paillier-encrypted uploads, server adds ciphertexts, decrypting clients decrypt sums (PrivMVMF)"
    parameters = (
        Param("key_length", 2048, "bits of the Paillier modulus n (2048 default; tests use 512); a multiple of 8",
              ge=128),
        Param("decryptors", 1, "number of decrypting clients; the ciphertext sums are split among them", ge=1),
        Param("packing", True, "pack several fixed-point values per ciphertext (false: one value per ciphertext)"),
        Param("precision", 32, "fractional bits of the fixed-point encoding (one public exponent -precision)",
              ge=0, le=52),
        Param("bound", 1048576.0, "largest |value| a client may encrypt (sizes the packing slots)", gt=0),
        Param("cohort_size", 0, "server sums senders in cohorts of this size (0: all senders in one sum)", ge=0),
        Param("jobs", 1, "joblib workers for encryption/decryption (1: in process, -1: all cores); not 0"),
    )
    strength = None
    default_grid = ()

    def validate(self) -> None:
        if self.config["key_length"] % 8:
            raise PrivauditError(f"defense 'paillier': key_length must be a multiple of 8, got {self.config['key_length']!r}")
        if self.config["jobs"] == 0:
            raise PrivauditError("defense 'paillier': jobs must be non-zero")

    def __init__(self, **overrides: Any):
        super().__init__(**overrides)
        self._public = None
        self._secret = None
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
        self.keyholder = batch.senders[0] if batch.senders else "client:0"
        tr = channel.transcript
        for party in self.decryptor_ids:
            if tr.parties and party not in tr.parties:
                tr.parties.append(party)
        r = batch.round
        tr.add(r, self.keyholder, self.keyholder, "private",
               {"paillier_p": _int_bytes(self._secret.p), "paillier_q": _int_bytes(self._secret.q)},
               {"scheme": "paillier"})
        tr.add(r, self.keyholder, batch.receiver, "public_key", {"n": _int_bytes(self._public.n)},
               {"scheme": "paillier", "key_length": self.config["key_length"]})
        for party in self.decryptor_ids:
            tr.add(r, self.keyholder, party, "secret_key", {}, {"scheme": "paillier", "holder": self.keyholder})

    def _cohorts(self, n_senders: int) -> list[np.ndarray]:
        c = self.config["cohort_size"]
        if c <= 0 or c >= n_senders:
            return [np.arange(n_senders)]
        return [np.arange(s, min(s + c, n_senders)) for s in range(0, n_senders, c)]

    # ------------------------------------------------------------------ client side

    def on_upload(self, batch: UploadBatch, channel: ChannelContext) -> UploadBatch:
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
        cts = pk.encrypt(n, plaintexts, width, self.config["jobs"])
        out_payloads = []
        for payload, entries in zip(batch.payloads, plan):
            new = {k: v for k, v in payload.items() if k not in float_keys}
            for key, rows, length, n_ct, start in entries:
                name = "ciphertexts" if key == "values" else f"{key}_ciphertexts"
                new[name] = cts[start : start + rows * n_ct].reshape(rows, n_ct, width)
            out_payloads.append(new)
        meta = dict(batch.meta)
        meta.update({"encrypted": True, "scheme": "paillier", "packing": bool(self.config["packing"]),
                     "encrypted_keys": list(float_keys), "shapes": shapes, **layout.to_meta()})
        self._tick(batch.round, "encrypt", self.clock() - t0)
        self._count(batch.round, "encrypted", len(plaintexts))
        return UploadBatch(batch.round, batch.kind, list(batch.senders), out_payloads, batch.receiver,
                           batch.noisy_keys, meta, batch.recorded)

    # ------------------------------------------------------------------ server + decryptors

    def aggregate(self, batch: UploadBatch, channel: ChannelContext, rows: int | None) -> dict[str, np.ndarray] | None:
        """Homomorphic sums per item row / dense entry (per cohort), decrypted by the decryptors."""
        if batch.meta.get("scheme") != "paillier":
            return None
        if not batch.payloads:
            return {}
        n = self._public.n
        nsq = self._public.nsquare
        layout = self.layout(int(batch.meta["max_summands"]))
        width = layout.ciphertext_bytes
        keys = list(batch.meta["encrypted_keys"])
        shapes = batch.meta["shapes"]
        indexed = "items" in batch.payloads[0]
        if indexed and rows is None:
            raise ValueError("rows is required to sum row-indexed uploads")
        record = batch.recorded
        tr = channel.transcript
        result: dict[str, np.ndarray] = {}
        if indexed:
            all_items = np.concatenate([np.asarray(p["items"], dtype=np.int64) for p in batch.payloads])
            result["counts"] = np.bincount(all_items, minlength=rows).astype(np.int64)
        for key in keys:
            name = "ciphertexts" if key == "values" else f"{key}_ciphertexts"
            inner = tuple(shapes[key][1:]) if indexed else ()
            length = int(np.prod(inner)) if indexed else int(np.prod(shapes[key]))
            total = None
            for ci, members in enumerate(self._cohorts(len(batch.senders))):
                payloads = [batch.payloads[i] for i in members]
                # ---- server: add ciphertexts per (row, ciphertext index)
                t0 = self.clock()
                cts = [np.asarray(p[name], dtype=np.uint8) for p in payloads]
                n_ct = cts[0].shape[1]
                if indexed:
                    items = np.concatenate([np.asarray(p["items"], dtype=np.int64) for p in payloads])
                    uniq, inv = np.unique(items, return_inverse=True)
                    counts = np.bincount(inv, minlength=len(uniq))
                else:
                    uniq = np.zeros(1, dtype=np.int64)
                    inv = np.zeros(len(payloads), dtype=np.int64)
                    counts = np.array([len(payloads)], dtype=np.int64)
                flat = pk.to_ints(np.concatenate(cts, axis=0))
                groups = (inv[:, None] * n_ct + np.arange(n_ct)[None, :]).ravel()
                sums = pk.add_grouped(flat, groups, len(uniq) * n_ct, nsq)
                self._tick(batch.round, "aggregate", self.clock() - t0)
                self._count(batch.round, "aggregated", len(flat))
                # ---- decryptors: each gets a round-robin share of the rows
                share_values = []
                slowest = 0.0
                for k, party in enumerate(self.decryptor_ids):
                    mine = np.arange(k, len(uniq), self.config["decryptors"])
                    if len(mine) == 0:
                        continue
                    my_cts = [sums[r * n_ct + j] for r in mine for j in range(n_ct)]
                    if record:
                        payload = {"ciphertexts": pk.from_ints(my_cts, width).reshape(len(mine), n_ct, width)}
                        payload["items" if indexed else "index"] = uniq[mine] if indexed else mine
                        tr.add(batch.round, batch.receiver, party, "ciphertext_sum", payload,
                               {"of_kind": batch.kind, "key": key, "cohort": ci, "encrypted": True, "scheme": "paillier"})
                    t0 = self.clock()
                    plain = pk.decrypt(n, self._secret.p, self._secret.q, my_cts, self.config["jobs"])
                    q = pk.decode_sums(plain, counts[mine], layout, length, n)
                    values = pk.dequantize(q, layout.precision)
                    dt = self.clock() - t0
                    slowest = max(slowest, dt)
                    self._tick(batch.round, "decrypt_total", dt)
                    self._count(batch.round, "decrypted", len(my_cts))
                    share_values.append((mine, values))
                    if record:
                        if indexed:
                            out = {"items": uniq[mine], "counts": counts[mine].astype(np.int64),
                                   "values": values.reshape((len(mine),) + inner)}
                        else:
                            out = {"index": mine, "values": values.reshape(tuple(shapes[key]))}
                        tr.add(batch.round, party, batch.receiver, "plaintext_sum", out,
                               {"of_kind": batch.kind, "key": key, "cohort": ci,
                                "members": [batch.senders[i] for i in members]})
                self._tick(batch.round, "decrypt", slowest)
                # ---- server: assemble the cohort's plaintext sum, add to the total
                cohort_sum = np.zeros((len(uniq), length))
                for mine, values in share_values:
                    cohort_sum[mine] = values
                if indexed:
                    if total is None:
                        total = np.zeros((rows, length))
                    total[uniq] += cohort_sum
                else:
                    total = cohort_sum[0] if total is None else total + cohort_sum[0]
            if indexed:
                result[key] = total.reshape((rows,) + inner)
            else:
                result[key] = total.reshape(tuple(shapes[key]))
        return result

    def reset_timings(self) -> None:
        self.timings.clear()
        self.ciphertext_counts.clear()
