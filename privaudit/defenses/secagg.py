"""Secure aggregation with pairwise masks (MF-SecAvg, FedNCF paper §3.4; Bonawitz et al. 2017).

Per round, every client of the cohort

1. makes a fresh X25519 key pair and a 32-byte self-mask seed b_i (``secrets``), and gives every
   other cohort member a t-of-n Shamir share of its private key and of b_i (the share messages
   are encrypted client-to-client in the real protocol; they are held by the simulation and not
   recorded);
2. agrees with every peer j on ``s_ij = HKDF(X25519(sk_i, pk_j), round|kind)``;
3. encodes its upload in fixed point into the ring Z_2^b (``ring_bits`` 32 or 64;
   ``frac_bits`` fractional bits, by default ``b - 1 - int_bits - ceil(log2 n)`` so that the sum of
   n values of magnitude < 2^int_bits cannot overflow) and adds
   ``PRG(b_i) + sum_{j > i} PRG(s_ij) - sum_{j < i} PRG(s_ij)`` (eq. 2; PRG = ChaCha20 keystream
   read as uint32/uint64, uniform on the ring).

Row-indexed uploads (``items`` + ``values``, FedNCF's item update) are first densified to all
``n_rows`` rows (zeros elsewhere) plus the observation vector P (1 on the updated rows), so the
masked upload has the same size for every client and reveals nothing about which rows it
updated; the server learns the sums and the per-item counts sum P (Algorithm 1). Dense uploads
(network weights, instance counts) are masked entry by entry.

Dropouts: ``dropout`` (fraction of the cohort, drawn with the simulation rng) and/or ``drop``
(user ids) drop *after masking*: their uploads never arrive. The server asks the survivors
for their shares: with at least t = floor(threshold * n) + 1 survivors it reconstructs each
dropped client's private key (and removes that client's pair masks from the survivors' sum)
and each survivor's b_i (and removes the self masks), as in Bonawitz et al.; with fewer it
aborts with an error. The unmasked sum equals the plain fixed-point sum of the survivors'
encodings exactly (tests/test_secagg.py).

What the server sees (recorded): per client the masked ring vectors (``values``, ``P`` or the
dense keys, uint32/uint64) with meta ``{"masked": True, "ring_bits", "frac_bits",
"dropped": [...]}``; plaintext attacks then refuse the view (:meth:`Attack.applicable`).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from typing import Any

import numpy as np

from privaudit.defenses import _secagg_crypto as sc
from privaudit.defenses.base import AGGREGATION, UPLOAD, ChannelContext, Defense, RoundUploads, UploadBatch
from privaudit.errors import PrivauditError
from privaudit.params import Param
from privaudit.registry import register_defense
from privaudit.schema import MASKED, DefenseSchema


def _uid(party: str) -> int | None:
    try:
        return int(party.split(":", 1)[1])
    except (IndexError, ValueError):
        return None


@register_defense("secagg")
class SecAgg(Defense):
    """Pairwise-masked secure aggregation in Z_2^32 / Z_2^64 with Shamir dropout recovery."""

    description = (
        "Secure aggregation (MF-SecAvg / Bonawitz et al.): X25519 pair seeds, ChaCha20 ring masks, Shamir recovery"
    )
    parameters = (
        Param("ring_bits", 64, "ring Z_2^b of the masked fixed-point values: 32 or 64", choices=(32, 64)),
        Param(
            "frac_bits",
            -1,
            "fractional bits of the fixed-point encoding (-1: b - 1 - int_bits - ceil(log2 n); "
            "a larger value that can overflow for the cohort is refused)",
        ),
        Param(
            "int_bits",
            16,
            "every uploaded value must satisfy |x| < 2^int_bits (headroom for the cohort sum); below ring_bits - 2",
            ge=1,
        ),
        Param(
            "dropout", 0.0, "fraction of each cohort that drops after masking (recovered by Shamir shares)", ge=0, lt=1
        ),
        Param("drop", [], "user ids that drop after masking whenever they are selected", item=int),
        Param("threshold", 0.5, "Shamir threshold t = floor(threshold * n) + 1 of n cohort members", gt=0, lt=1),
    )
    strength = "dropout"
    capabilities = frozenset({UPLOAD, AGGREGATION})
    acts_on = (("*", "*"),)  # every upload, masked
    #: uploads hold unsigned ring elements (meta ``masked``) instead of floats
    schema_contribution = DefenseSchema(upload_forms=(MASKED,))
    default_grid = (0.0, 0.1, 0.2, 0.3)

    def validate(self) -> None:
        if not self.int_bits < self.ring_bits - 2:
            raise PrivauditError(f"defense 'secagg': int_bits must be an integer in 1..{self.ring_bits - 3}")
        if not isinstance(self.frac_bits, int) or self.frac_bits < -1:
            raise PrivauditError(
                f"defense 'secagg': frac_bits must be -1 (automatic) or an integer >= 0, got {self.frac_bits!r}"
            )
        if self.frac_bits >= 0:
            self._check_layout(int(self.frac_bits), 2)  # the smallest cohort that sums anything
        self._rounds: dict[tuple, dict[str, Any]] = {}
        self._batches: dict[tuple, dict[str, Any]] = {}
        self.last_unmasked: np.ndarray | None = None

    def hides_plaintext(self) -> bool:
        return True

    # ------------------------------------------------------------------ round setup
    def _round_state(self, rnd: int, senders: list[str], rng: np.random.Generator) -> dict[str, Any]:
        key = (rnd, tuple(senders))
        st = self._rounds.get(key)
        if st is not None:
            return st
        self._rounds = {k: v for k, v in self._rounds.items() if k[0] >= rnd - 1}  # keep memory flat
        n = len(senders)
        t = min(n, int(math.floor(self.threshold * n)) + 1)
        sks, pks, selfseeds = [], [], []
        for _ in senders:
            sk, pk = sc.keypair()
            sks.append(sk)
            pks.append(pk)
            selfseeds.append(secrets.token_bytes(32))
        # shares[i][j] = (x, y): holder j's shares of client i's secrets
        share_sk = [sc.shamir_split(int.from_bytes(sc.private_bytes(sk), "big"), n, t) for sk in sks]
        share_b = [sc.shamir_split(int.from_bytes(b, "big"), n, t) for b in selfseeds]
        explicit = {int(u) for u in (self.drop or [])}
        dropped = {i for i, s in enumerate(senders) if _uid(s) in explicit}
        n_rand = int(round(self.dropout * n))
        rest = [i for i in range(n) if i not in dropped]
        if n_rand and rest:
            dropped |= set(int(i) for i in rng.choice(rest, size=min(n_rand, len(rest)), replace=False))
        st = {
            "n": n,
            "t": t,
            "sks": sks,
            "pks": pks,
            "self": selfseeds,
            "share_sk": share_sk,
            "share_b": share_b,
            "dropped": sorted(dropped),
        }
        self._rounds[key] = st
        return st

    def _check_layout(self, frac_bits: int, n: int) -> None:
        """Refuse a ring/fraction layout whose sum over ``n`` clients can overflow.

        Values satisfy |x| < 2^int_bits, so |sum of n encodings| <= n 2^(int_bits + frac_bits),
        which the signed ring holds iff int_bits + frac_bits + ceil(log2 n) <= ring_bits - 1.
        """
        need = self.int_bits + frac_bits + max(1, math.ceil(math.log2(max(n, 2))))
        if need > self.ring_bits - 1:
            raise PrivauditError(
                f"defense 'secagg': ring_bits {self.ring_bits} with frac_bits {frac_bits} and int_bits {self.int_bits} "
                f"can overflow for {n} clients (needs int_bits + frac_bits + ceil(log2 n) <= {self.ring_bits - 1}); "
                "lower frac_bits or int_bits, or use ring_bits 64"
            )

    def _frac_bits(self, n: int) -> int:
        if self.frac_bits >= 0:
            self._check_layout(int(self.frac_bits), n)
            return int(self.frac_bits)
        f = self.ring_bits - 1 - self.int_bits - max(1, math.ceil(math.log2(max(n, 2))))
        if f < 1:
            raise PrivauditError(
                f"defense 'secagg': no fractional bits left in a {self.ring_bits}-bit ring for {n} clients; lower int_bits"
            )
        return f

    # ------------------------------------------------------------------ masking
    @staticmethod
    def _layout(payload: dict[str, np.ndarray], n_rows: int | None) -> tuple[list[tuple[str, tuple]], bool]:
        if "items" in payload:
            if n_rows is None:
                raise PrivauditError(
                    "defense 'secagg': row-indexed uploads need the number of rows (meta n_rows or config n_items)"
                )
            width = int(np.prod(np.asarray(payload["values"]).shape[1:]))
            return [("values", (n_rows, width)), ("P", (n_rows,))], True
        return [(k, np.asarray(v).shape) for k, v in sorted(payload.items())], False

    @staticmethod
    def _flatten(payload: dict[str, np.ndarray], layout: list, indexed: bool) -> np.ndarray:
        if indexed:
            n_rows, width = layout[0][1]
            dense = np.zeros((n_rows, width), dtype=np.float64)
            P = np.zeros(n_rows, dtype=np.float64)
            idx = np.asarray(payload["items"], dtype=np.int64)
            np.add.at(dense, idx, np.asarray(payload["values"], dtype=np.float64).reshape(len(idx), width))
            P[idx] = 1.0
            return np.concatenate([dense.ravel(), P])
        return np.concatenate([np.asarray(payload[k], dtype=np.float64).ravel() for k, _ in layout])

    def process_uploads(
        self, uploads: RoundUploads, ctx: ChannelContext, call_next: Callable[[RoundUploads], RoundUploads]
    ) -> RoundUploads:
        """Mask every batch (one at a time); the receiver's sum unmasks (:meth:`unmask`)."""
        return call_next(uploads.map(lambda b: self.mask(b, ctx)))

    def mask(self, batch: UploadBatch, channel: Any) -> UploadBatch:
        """``batch`` as the server receives it: the survivors' masked ring vectors."""
        if not batch.payloads:
            return batch
        senders = list(batch.senders)
        st = self._round_state(batch.round, senders, channel.rng)
        n_rows = batch.meta.get("n_rows")
        if n_rows is None and "items" in batch.payloads[0]:
            n_rows = channel.transcript.config.get("n_items")
        layout, indexed = self._layout(batch.payloads[0], n_rows)
        f = self._frac_bits(len(senders))
        bits = self.ring_bits
        limit = float(2**self.int_bits)
        info = f"privaudit-secagg|{batch.round}|{batch.kind}".encode()
        size = sum(int(np.prod(s)) for _, s in layout)
        masked = []
        for i, payload in enumerate(batch.payloads):
            x = self._flatten(payload, layout, indexed)
            if x.size != size:
                raise PrivauditError(f"defense 'secagg': uploads of {batch.kind!r} differ in shape")
            if not np.all(np.isfinite(x)) or (x.size and np.abs(x).max() >= limit):
                raise PrivauditError(
                    f"defense 'secagg': an upload value of {batch.kind!r} is outside the fixed-point range |x| < 2^{self.int_bits}; raise int_bits"
                )
            y = sc.encode(x, f, bits)
            y += sc.expand(st["self"][i], info + b"|self", size, bits)
            for j in range(len(senders)):
                if j == i:
                    continue
                mask = sc.expand(sc.pair_seed(st["sks"][i], st["pks"][j], info), info, size, bits)
                if i < j:
                    y += mask
                else:
                    y -= mask
            masked.append(y)
        dropped = set(st["dropped"])
        keep = [i for i in range(len(senders)) if i not in dropped]
        out_payloads = []
        for i in keep:
            parts, pos = {}, 0
            for k, shape in layout:
                cnt = int(np.prod(shape))
                parts[k] = masked[i][pos : pos + cnt].reshape(shape)
                pos += cnt
            out_payloads.append(parts)
        meta = dict(batch.meta)
        meta.update(
            masked=True, ring_bits=bits, frac_bits=f, secagg="mf-secavg", dropped=[senders[i] for i in sorted(dropped)]
        )
        self._batches[(batch.round, batch.kind)] = {
            "senders": senders,
            "keep": keep,
            "layout": layout,
            "indexed": indexed,
            "f": f,
            "info": info,
            "size": size,
            "state": st,
        }
        return UploadBatch(
            batch.round,
            batch.kind,
            [senders[i] for i in keep],
            out_payloads,
            batch.receiver,
            batch.noisy_keys,
            meta,
            receiver_sum=self.unmask,
        )

    # ------------------------------------------------------------------ server side
    def unmask(self, batch: UploadBatch, channel: Any, rows: int | None) -> dict[str, np.ndarray]:
        """The server's sum of a masked batch: the ring sum, the survivors' self masks and the
        dropped clients' pair masks removed with the Shamir shares, decoded."""
        info_b = self._batches.pop((batch.round, batch.kind), None)
        if info_b is None:
            raise PrivauditError(f"defense 'secagg': no masking state for round {batch.round} {batch.kind!r}")
        st, bits, size, info = info_b["state"], self.ring_bits, info_b["size"], info_b["info"]
        senders, keep = info_b["senders"], info_b["keep"]
        layout, indexed, f = info_b["layout"], info_b["indexed"], info_b["f"]
        if len(keep) < st["t"]:
            raise PrivauditError(
                f"defense 'secagg': only {len(keep)} of {st['n']} clients survived round {batch.round}; "
                f"{st['t']} are needed to unmask (threshold)"
            )
        if not keep:
            return {}
        total = sc.ring_sum(
            [np.concatenate([np.asarray(p[k]).ravel() for k, _ in layout]) for p in batch.payloads], bits
        )
        holders = keep[: st["t"]]  # any t survivors answer with their shares
        for i in keep:  # remove the survivors' self masks (b_i reconstructed from shares)
            b = sc.shamir_combine([st["share_b"][i][h] for h in holders]).to_bytes(32, "big")
            total -= sc.expand(b, info + b"|self", size, bits)
        for d in sorted(set(range(len(senders))) - set(keep)):  # dropped: rebuild sk_d, cancel pair masks
            sk_d = sc.private_from_bytes(sc.shamir_combine([st["share_sk"][d][h] for h in holders]).to_bytes(32, "big"))
            for j in keep:
                mask = sc.expand(sc.pair_seed(sk_d, st["pks"][j], info), info, size, bits)
                if j < d:  # survivor j added +PRG(s_jd), never cancelled
                    total -= mask
                else:
                    total += mask
        self.last_unmasked = total.copy()
        plain = sc.decode(total, f, bits)
        out: dict[str, np.ndarray] = {}
        pos = 0
        for k, shape in layout:
            cnt = int(np.prod(shape))
            out[k] = plain[pos : pos + cnt].reshape(shape)
            pos += cnt
        if indexed:
            out["counts"] = np.rint(out.pop("P")).astype(np.int64)
        return out
