"""``dp-laplace``: one joint L1 clip of what a client releases, Laplace noise, basic composition and PLD.

Neighbour relation and sensitivity
----------------------------------
With ``clip_per="user"`` (default) every float a client sends in one round -- every entry
named by :meth:`UploadBatch.float_keys` of every message of the round, e.g. FedMVMF's
``grad_V.values`` and ``grad_P.values``, which the protocol hands over together
(:meth:`~privaudit.protocols.base.Channel.send_round`; the defense is ``joint_round``) -- is scaled by ONE factor so that their
joint L1 norm is at most ``clip`` = C. Two such clipped releases differ by at most 2C in L1
whatever the two inputs were, so replacing one rating, or one user's whole data, moves the
release by at most the sensitivity Delta = 2C (changing one rating moves every row a FedMVMF
client uploads through its u_u, so no smaller per-rating bound holds). Laplace(0, Delta /
epsilon) noise on every float then makes each release epsilon-DP (Dwork & Roth, "The
Algorithmic Foundations of Differential Privacy", 2014, Thm 3.6).

Which relation that is depends on the integer item ids, which are never noised:

- ``dense=true``: item-row uploads (``items`` + rows) are expanded to all ``n_items`` rows of the
  protocol's public config (zero rows where the client sent none; for FedMVMF ObsOnly the
  gradient of an unrated item is zero, so the sum is unchanged before noise) and every row gets
  noise: the rated-item set is hidden and the neighbour relation is ``user`` (one user's whole
  data -- ratings, rated-item set, attributes -- replaced by any other);
- otherwise the ids go out as sent: the relation is ``rating`` (one rating value replaced; in
  fact any change of one user's ratings and attributes that keeps the rated-item set) and
  ``item_set_covered`` is False, unless every item-row upload of the run covered all items
  (FedMVMF InclUnc) or none was sent.

Any other entry that is not noised (an integer count, a float outside the batch's
``noisy_keys``) is listed in ``unnoised`` and also limits the relation to ``rating`` (e.g.
FedSplit's per-group rating ``count``, which one rating replaced leaves unchanged).

Add/remove of a whole client is not hidden by local noise: the server sees who sends. A user
"removed" while still sending (its data emptied) is a replacement: Delta = 2C again.

Releases and composition
------------------------
``clip_per="upload"`` clips each message on its own and ``clip_per="row"`` each row (and each
1-D array) on its own; each such unit is then a separate release with its own Delta = 2C, and so
is every message a protocol sends with :meth:`Channel.send` instead of ``send_round``. The
defense counts the releases of every client in every round it sees (the most any client made
in one round, times the rounds); :meth:`DPLaplace.privacy_spent` composes all of them: basic
composition gives ``releases * epsilon`` (delta 0); with ``delta > 0`` the PLD accountant
(:mod:`privaudit.defenses.accounting`) a smaller epsilon at that delta.

``target_epsilon > 0`` calibrates the per-release epsilon so that the total over the run equals
it (``clip_per="user"`` only; a run whose protocol sends a round's messages separately is
stopped with an error). The run's round count is ``rounds`` if given, else the protocol's
public ``epochs``/``rounds``/``global_rounds``/``n_rounds`` at the first upload; the calibrated
value is written into this defense's entry of the public config (what an attacker knows),
which also carries the noise scale.

Noise is drawn from the channel's simulation generator in one vectorized draw per call; in a
round that is not recorded and only summed, on the sums (the sum over each element's senders,
same law), after the same clip and release count.
``default_grid`` runs from the weakest to the strongest protection (large to small epsilon).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from privaudit.defenses import accounting
from privaudit.defenses.base import ChannelContext, Defense, PackedBatch, RoundUploads, UploadBatch
from privaudit.defenses.noise import laplace_noise, laplace_sums
from privaudit.errors import PrivauditError
from privaudit.params import Param
from privaudit.registry import register_defense

#: what one clip covers: everything a client sends in a round, one message, or one row
CLIP_PER = ("user", "upload", "row")

#: delta at which privacy_spent also reports the PLD epsilon when the defense's own delta is 0
REFERENCE_DELTA = 1e-5

#: ``unit`` of privacy_spent by neighbour relation
UNITS = {
    "user": "one user's data (ratings, rated-item set, attributes) replaced",
    "rating": "one rating value replaced (rated-item set not covered)",
}

CLAIM = (
    "{norm} clip of everything a client sends in a round to C (clip_per=user), sensitivity 2C "
    "(replace one rating, or with dense=true one user's data including its rated-item set); "
    "without dense=true the item ids go out unnoised (item set not covered); a client's "
    "participation is visible (add/remove not covered); every separately clipped release is composed"
)


def clip_rows(arr: np.ndarray, clip: float, ord: int = 1) -> np.ndarray:
    """Rows of a 2-D array (or a 1-D array as a whole; higher dims by leading axis) scaled
    to L``ord`` norm <= ``clip``; float64 copy."""
    a = np.array(arr, dtype=np.float64)
    if a.ndim == 0:
        a = a.reshape(1)
        return np.clip(a, -clip, clip).reshape(())
    if a.size == 0:  # e.g. grad_P of a dataset without user attributes: (0, K)
        return a
    flat = a.reshape(1, -1) if a.ndim == 1 else a.reshape(a.shape[0], -1)
    norms = np.abs(flat).sum(axis=1, keepdims=True) if ord == 1 else np.linalg.norm(flat, axis=1, keepdims=True)
    factor = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    return (flat * factor).reshape(a.shape)


def clip_l1_rows(arr: np.ndarray, clip: float) -> np.ndarray:
    """:func:`clip_rows` in the L1 norm."""
    return clip_rows(arr, clip, 1)


def joint_norm(arrays: list[np.ndarray], ord: int) -> float:
    """L1 (``ord=1``) or L2 norm of the concatenation of ``arrays``."""
    if ord == 1:
        return float(sum(np.abs(a).sum() for a in arrays))
    return math.sqrt(float(sum(np.sum(a * a) for a in arrays)))


def _rows_of(a: np.ndarray) -> int:
    """Separately clipped units of one array under ``clip_per="row"``."""
    return 0 if a.size == 0 else (1 if a.ndim <= 1 else int(a.shape[0]))


def segment_sums(values: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Sums of consecutive segments of ``values`` (1-D) of lengths ``sizes``, (len(sizes),), each
    bit for bit ``np.sum`` of that segment alone: numpy sums pairwise within one reduction (so
    ``np.add.reduceat`` rounds differently); segments of one common length are reduced as the rows
    of a 2-D view (same rounding), others one by one."""
    n = len(sizes)
    if n == 0:
        return np.zeros(0)
    if int(sizes[0]) > 0 and bool(np.all(sizes == sizes[0])):
        return values.reshape(n, int(sizes[0])).sum(axis=1)
    ends = np.cumsum(sizes).tolist()
    return np.array([values[e - k : e].sum() for k, e in zip(sizes.tolist(), ends)], dtype=np.float64)


@dataclasses.dataclass
class JointClip:
    """Every float entry of a round's batches clipped jointly per sender (``clip_per="user"``), as
    one float64 concatenation ``flat`` in (batch, payload, key) order -- the order of the noise
    draw -- with the entries' ``slots`` (batch, payload, key), ``shapes`` and ``sizes``.

    Same numbers as :meth:`ClippedNoise.clip` (the per-sender loop): every entry's norm part is
    ``np.sum`` of that entry, summed over the sender's entries in slot order, one factor
    min(1, C / norm) per sender."""

    batches: list[UploadBatch]
    slots: list[tuple[int, int, str]]
    shapes: list[tuple[int, ...]]
    sizes: np.ndarray
    flat: np.ndarray
    releases: dict[str, int]

    @classmethod
    def of(cls, batches: list[UploadBatch], keys: list[list[list[str]]], clip: float, ord: int) -> JointClip:
        """``keys[i][j]``: the float keys of payload j of batch i."""
        slots, arrays, unit_of, spans = [], [], [], []
        units: dict[str, int] = {}
        for i, b in enumerate(batches):
            start = len(arrays)
            for j, (sender, p) in enumerate(zip(b.senders, b.payloads)):
                if keys[i][j]:
                    unit = units.setdefault(sender, len(units))
                for k in keys[i][j]:
                    slots.append((i, j, k))
                    arrays.append(np.asarray(p[k], dtype=np.float64))
                    unit_of.append(unit)
            spans.append((start, len(arrays)))
        sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
        flat = np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0)
        ends = np.cumsum(sizes)
        sums = np.zeros(len(arrays))
        for lo, hi in spans:  # per batch: its entries usually share one size (one 2-D reduction)
            if hi > lo:
                part = flat[ends[lo] - sizes[lo] : ends[hi - 1]]
                sums[lo:hi] = segment_sums(np.abs(part) if ord == 1 else part * part, sizes[lo:hi])
        owner = np.asarray(unit_of, dtype=np.int64)
        totals = np.zeros(len(units))
        np.add.at(totals, owner, sums)  # in slot order, like the per-sender Python sum
        if ord != 1:
            totals = np.sqrt(totals)
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = np.where(totals > 0, np.minimum(1.0, clip / totals), 1.0)
        flat *= np.repeat(factor[owner], sizes)
        return cls(batches, slots, [a.shape for a in arrays], sizes, flat, dict.fromkeys(units, 1))

    def payloads(self) -> list[UploadBatch]:
        """The batches with every clipped entry (plus whatever was added to ``flat``) in place."""
        out = [[dict(p) for p in b.payloads] for b in self.batches]
        ends = np.cumsum(self.sizes).tolist()
        for (i, j, k), shape, size, end in zip(self.slots, self.shapes, self.sizes.tolist(), ends):
            out[i][j][k] = self.flat[end - size : end].reshape(shape)
        return [dataclasses.replace(b, payloads=p) for b, p in zip(self.batches, out)]


class ClippedNoise(Defense):
    """Shared machinery of the clip-then-noise DP defenses (subclasses: norm, noise, accounting)."""

    clip_ord: int = 1
    #: the parameter :meth:`calibrate` solves for, and whether the total epsilon grows with it
    calibrated: str = "epsilon"
    calibrated_increasing: bool = True
    #: the interval searched for the calibrated parameter
    calibration_range: tuple[float, float] = (1e-4, 1e3)
    acts_on = (("*", "*"),)  # every float of every upload
    joint_round = True  # one clip over everything a client sends in a round

    def validate(self) -> None:
        """Bounds and choices come from the declaration; a target epsilon with a known round
        count is calibrated at once (otherwise at the first upload)."""
        self._start_run(None)
        if self.config["target_epsilon"] and self.config["clip_per"] != "user":
            raise PrivauditError(
                f"defense {self.name!r}: target_epsilon needs clip_per=user (one release per round); "
                f"with clip_per={self.config['clip_per']} the releases per round depend on the data"
            )
        if self.config["target_epsilon"] and self.config["rounds"]:
            self.calibrate(self.config["rounds"])

    def _start_run(self, run: int | None) -> None:
        """Forget what an earlier run released (an instance reused for another transcript)."""
        self._run = run
        self._releases: dict[int, dict[str, int]] = {}  # round -> sender -> releases (last rounds)
        self._max_releases = 0
        self._sparse_items = False
        self._unnoised: set[str] = set()  # names of entries other than item ids released exactly

    # ------------------------------------------------------------------ claim
    @property
    def norm(self) -> str:
        return "l1" if self.clip_ord == 1 else "l2"

    @property
    def sensitivity(self) -> float:
        """L1 / L2 distance bound of two clipped releases (replace neighbours): 2C."""
        return 2.0 * float(self.config["clip"])

    @property
    def releases_per_round(self) -> int:
        """The most separately clipped releases any client made in one round (1 before any upload)."""
        return max(self._max_releases, 1)

    @property
    def item_set_covered(self) -> bool:
        """Whether the rated-item set is hidden: dense uploads, or no sparse item-row upload seen
        (False before any upload unless dense)."""
        if self.config["dense"]:
            return True
        return self._max_releases > 0 and not self._sparse_items

    @property
    def neighbour(self) -> str:
        """``user`` when nothing a client sends escapes the noise (item ids hidden, no other exact
        entry such as a count), else ``rating``."""
        return "user" if self.item_set_covered and not self._unnoised else "rating"

    def claim(self, rounds: int) -> dict[str, Any]:
        """The neighbour relation, coverage and release count of ``privacy_spent``."""
        per_round = self.releases_per_round
        return {
            "unit": UNITS[self.neighbour],
            "neighbour": self.neighbour,
            "item_set_covered": self.item_set_covered,
            "releases": max(int(rounds), 0) * per_round,
            "releases_per_round": per_round,
            "sensitivity": self.sensitivity,
            "norm": self.norm,
            "unnoised": ", ".join(sorted(self._unnoised)),
        }

    def public_config(self) -> dict[str, Any]:
        return {**super().public_config(), **self.public_noise()}

    def public_noise(self) -> dict[str, float]:
        """The noise parameter every party knows (recorded in the public config)."""
        return {}

    # ------------------------------------------------------------------ clip and noise
    def dense_items(self, batch: UploadBatch, n_items: int) -> UploadBatch:
        """Item-row payloads (``items`` + rows) expanded to all ``n_items`` rows, zeros elsewhere."""
        full = np.arange(n_items, dtype=np.int64)
        payloads = []
        for p in batch.payloads:
            if "items" not in p:
                payloads.append(p)
                continue
            items = np.asarray(p["items"], dtype=np.int64)
            if len(items) == n_items and np.array_equal(items, full):
                payloads.append(p)
                continue
            if len(items) and (items.min() < 0 or items.max() >= n_items):
                raise PrivauditError(f"defense {self.name!r}: an item id is outside the public n_items = {n_items}")
            q = {"items": full}
            for key, value in p.items():
                v = np.asarray(value)
                if key != "items" and v.ndim >= 1 and v.shape[0] == len(items):
                    rows = np.zeros((n_items,) + v.shape[1:], dtype=np.result_type(v.dtype, np.float64))
                    rows[items] = v
                    q[key] = rows
                elif key != "items":
                    q[key] = value
            payloads.append(q)
        return dataclasses.replace(batch, payloads=payloads)

    def clip(self, batches: list[UploadBatch]) -> tuple[list[UploadBatch], dict[str, int]]:
        """``batches`` clipped before noise (float64 copies of the float entries), and the
        number of separately clipped releases of every sender."""
        C, per, ord = float(self.config["clip"]), self.config["clip_per"], self.clip_ord
        out = [[dict(p) for p in b.payloads] for b in batches]
        releases: dict[str, int] = {}
        groups: dict[str, list[tuple[int, int, str]]] = {}  # clip unit -> (batch, payload, key)
        for i, b in enumerate(batches):
            for j, (sender, p) in enumerate(zip(b.senders, b.payloads)):
                keys = b.float_keys(p)
                if per == "row":
                    for key in keys:
                        out[i][j][key] = clip_rows(p[key], C, ord)
                        releases[sender] = releases.get(sender, 0) + _rows_of(np.asarray(p[key]))
                    continue
                unit = sender if per == "user" else f"{i}\0{j}"
                groups.setdefault(unit, []).extend((i, j, key) for key in keys)
                if per == "upload" and keys:
                    releases[sender] = releases.get(sender, 0) + 1
                elif per == "user" and keys:
                    releases[sender] = 1
        for slots in groups.values():
            arrays = [np.asarray(batches[i].payloads[j][k], dtype=np.float64) for i, j, k in slots]
            total = joint_norm(arrays, ord)
            factor = min(1.0, C / total) if total > 0 else 1.0
            for (i, j, k), a in zip(slots, arrays):
                out[i][j][k] = a * factor
        return [dataclasses.replace(b, payloads=p) for b, p in zip(batches, out)], releases

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        raise NotImplementedError

    def process_uploads(
        self, uploads: RoundUploads, ctx: ChannelContext, call_next: Callable[[RoundUploads], RoundUploads]
    ) -> RoundUploads:
        """Clip (jointly per client under ``clip_per="user"``), count the releases, add noise: on
        packed batches when the layout allows (:attr:`takes_packed`, one float entry per batch),
        else on the unpacked payloads (the same numbers); in a round only summed, the noise goes
        onto the sums."""
        if uploads.summed:  # offered only packed, one float entry per batch
            uploads.noise_on_sums(self.noise_sums)
            return call_next(uploads.replace(self._round_packed(uploads.batches, ctx, noise=False)))
        if self.takes_packed and uploads.packed and all(len(b.float_keys()) <= 1 for b in uploads.batches):
            return call_next(uploads.replace(self._round_packed(uploads.batches, ctx)))
        return call_next(uploads.replace(self._round(uploads.unpacked().batches, ctx)))

    def noise_sums(self, rng: np.random.Generator, counts: np.ndarray) -> np.ndarray:
        """The sum of ``counts`` senders' noise, elementwise (:meth:`RoundUploads.noise_on_sums`)."""
        raise NotImplementedError

    def _begin_round(self, channel: ChannelContext) -> None:
        """Calibrate a target epsilon once; a new transcript starts a new run's release counts."""
        if self.config.get("target_epsilon"):
            self._calibrate_from(channel)
        run = id(getattr(channel, "transcript", None))
        if run != self._run:
            self._start_run(run)

    def _counted(self, round: int, releases: dict[str, int]) -> None:
        """Count one round's releases; target_epsilon's one-release-per-round assumption checked."""
        self._count(round, releases)
        if self.config.get("target_epsilon") and self._max_releases > 1:
            raise PrivauditError(
                f"defense {self.name!r}: a client made {self._max_releases} separately noised releases in "
                f"one round (the protocol sends its messages separately); target_epsilon assumes one"
            )

    @property
    def takes_packed(self) -> bool:  # type: ignore[override]
        """Packed under ``clip_per="user"`` without ``dense`` (with one float entry per batch,
        the only layouts whose (batch, payload, key) float order is the arrays' order)."""
        return self.config["clip_per"] == "user" and not self.config["dense"]

    def _round_packed(
        self, batches: list[PackedBatch], channel: ChannelContext, noise: bool = True
    ) -> list[PackedBatch]:
        """:meth:`_round` of packed batches: the same clip factors, releases and noise (none
        without ``noise``: a round whose noise goes onto the sums)."""
        self._begin_round(channel)
        if not any(b.senders for b in batches):
            return batches
        n_items = self._n_items(channel)
        for b in batches:
            if "items" not in b.arrays:
                lengths: Any = ()
            else:
                lengths = np.diff(b.bounds) if b.bounds is not None else [b.arrays["items"][0].size] * len(b.senders)
            self._note_batch(b.kind, {(tuple(b.arrays), tuple(b.float_keys()))}, lengths, n_items)
        units: dict[str, int] = {}
        parts = []  # (batch, key, owner, sizes, clipped float64 copy)
        for b in batches:
            for key in b.float_keys():
                owner = np.fromiter((units.setdefault(s, len(units)) for s in b.senders), np.int64, len(b.senders))
                parts.append((b, key, owner, b.entry_sizes(key), b.arrays[key].astype(np.float64)))
        totals = np.zeros(len(units))
        for _, _, owner, sizes, values in parts:  # each sender's entries in slot order, as JointClip
            flat = values.reshape(-1)
            np.add.at(totals, owner, segment_sums(np.abs(flat) if self.clip_ord == 1 else flat * flat, sizes))
        if self.clip_ord != 1:
            totals = np.sqrt(totals)
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = np.where(totals > 0, np.minimum(1.0, float(self.config["clip"]) / totals), 1.0)
        self._counted(batches[0].round, dict.fromkeys(units, 1))
        total = sum(values.size for *_, values in parts) if noise else 0
        draws = self.draw(channel.rng, total) if total else None  # one draw in (batch, payload, key) order
        out, start = [], 0
        for b, key, owner, _, values in parts:
            # each sender's factor on its rows (the same product per float as JointClip's)
            per_row = factor[owner] if b.bounds is None else np.repeat(factor[owner], np.diff(b.bounds))
            values *= per_row.reshape((-1,) + (1,) * (values.ndim - 1))
            flat = values.reshape(-1)
            if flat.size and draws is not None:
                flat += draws[start : start + flat.size]
                start += flat.size
            out.append((b, key, values))
        done = {id(b): dataclasses.replace(b, arrays={**b.arrays, key: values}) for b, key, values in out}
        return [done.get(id(b), b) for b in batches]

    def _round(self, batches: list[UploadBatch], channel: ChannelContext) -> list[UploadBatch]:
        """Clip (jointly per client under ``clip_per="user"``), count the releases, add noise."""
        self._begin_round(channel)
        batches = [b for b in batches]
        if not any(b.payloads for b in batches):
            return batches
        n_items = self._n_items(channel)
        if self.config["dense"] and any("items" in p for b in batches for p in b.payloads):
            if n_items is None:
                raise PrivauditError(f"defense {self.name!r}: dense=true needs the protocol's public n_items")
            batches = [self.dense_items(b, n_items) for b in batches]
        keys = [[b.float_keys(p) for p in b.payloads] for b in batches]
        self._note_items(batches, keys, n_items)
        joint = None
        if self.config["clip_per"] == "user":  # batched: one factor per sender
            joint = JointClip.of(batches, keys, float(self.config["clip"]), self.clip_ord)
            releases = joint.releases
        else:
            batches, releases = self.clip(batches)
        self._counted(batches[0].round, releases)
        if joint is not None:
            if joint.flat.size:  # one draw over every float in (batch, payload, key) order
                joint.flat += self.draw(channel.rng, joint.flat.size)
            return joint.payloads()
        slots = [(i, j, k) for i, b in enumerate(batches) for j, p in enumerate(b.payloads) for k in b.float_keys(p)]
        total = sum(np.asarray(batches[i].payloads[j][k]).size for i, j, k in slots)
        if total == 0:
            return batches
        noise = self.draw(channel.rng, total)
        offset = 0
        for i, j, key in slots:
            payload = batches[i].payloads[j]
            arr = np.asarray(payload[key], dtype=np.float64)
            payload[key] = arr + noise[offset : offset + arr.size].reshape(arr.shape)
            offset += arr.size
        return batches

    @staticmethod
    def _n_items(channel: ChannelContext) -> int | None:
        transcript = getattr(channel, "transcript", None)
        n = (getattr(transcript, "config", None) or {}).get("n_items")
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    def _note_items(self, batches: list[UploadBatch], keys: list[list[list[str]]], n_items: int | None) -> None:
        """Remember whether any item-row upload revealed a proper subset of the items, and the
        entries other than item ids that go out without noise (e.g. integer counts);
        ``keys[i][j]``: the float keys of payload j of batch i."""
        for b, noised_keys in zip(batches, keys):
            layouts = {(tuple(p), tuple(noised)) for p, noised in zip(b.payloads, noised_keys)}
            self._note_batch(b.kind, layouts, (len(p["items"]) for p in b.payloads if "items" in p), n_items)

    def _note_batch(self, kind: str, layouts: set, item_counts: Any, n_items: int | None) -> None:
        """:meth:`_note_items` of one batch: ``layouts`` its payloads' distinct (entry names,
        noised names), ``item_counts`` the length of every ``items`` entry it holds."""
        if not self._sparse_items:
            self._sparse_items = any(n_items is None or int(n) != n_items for n in item_counts)
        for names, noised in layouts:  # one per payload layout, not per payload
            self._unnoised.update(f"{kind}.{k}" for k in names if k != "items" and k not in noised)

    def _count(self, round: int, releases: dict[str, int]) -> None:
        """Add one call's releases to its round (several calls of a round add up)."""
        seen = self._releases.setdefault(int(round), {})
        for sender, n in releases.items():
            seen[sender] = seen.get(sender, 0) + n
        if seen:
            self._max_releases = max(self._max_releases, max(seen.values()))
        for r in [r for r in self._releases if r < int(round) - 1]:  # keep memory flat
            del self._releases[r]

    # ------------------------------------------------------------------ target epsilon
    def total_epsilon(self, value: float, rounds: int) -> float:
        """Total epsilon over ``rounds`` with the calibrated parameter at ``value``."""
        raise NotImplementedError

    def calibrate(self, rounds: int) -> None:
        """Set the calibrated parameter so that the total epsilon over ``rounds`` is ``target_epsilon``."""
        if rounds <= 0:
            raise PrivauditError(f"defense {self.name!r}: target_epsilon needs the number of rounds (set rounds=N)")
        target = float(self.config["target_epsilon"])
        lo, hi = self.calibration_range
        value = accounting.calibrate(
            lambda x: self.total_epsilon(x, rounds), target, lo, hi, self.calibrated_increasing
        )
        self.config[self.calibrated] = value
        self._calibrated_rounds = rounds

    def _calibrate_from(self, channel: ChannelContext) -> None:
        if getattr(self, "_calibrated_rounds", None):
            return
        public = channel.transcript.config
        declared = accounting.declared_releases(channel.transcript.protocol, public)
        rounds = int(self.config.get("rounds") or 0) or (declared or 0)
        before = {"name": self.name, **self.public_config()}
        self.calibrate(rounds)
        for entry in public.get("defenses", []) or []:  # the public record an attacker reads
            if isinstance(entry, dict) and entry == before:
                entry.update(self.public_config())
                break


#: parameters shared by dp-laplace and dp-gaussian
CLIP_PER_PARAM = Param(
    "clip_per",
    "user",
    "what one clip to C covers: 'user' (everything a client sends in a round, one factor), "
    "'upload' (each message) or 'row' (each row); each clipped unit is one release",
    choices=CLIP_PER,
)
DENSE_PARAM = Param(
    "dense",
    False,
    "expand item-row uploads to all n_items rows (zeros) before clip and noise, hiding the rated-item set",
)


@register_defense("dp-laplace")
class DPLaplace(ClippedNoise):
    """Jointly L1-clip what a client releases in a round to C, add Laplace(2C / epsilon) noise;
    basic composition and PLD over every release."""

    description = (
        "epsilon-DP Laplace mechanism: joint L1 clip to C, sensitivity 2C, Laplace(2C/epsilon) noise, "
        "every release composed (basic, PLD)"
    )
    privacy_claim = CLAIM.format(norm="L1")
    parameters = (
        Param(
            "epsilon", 1.0, "privacy budget of one release (pure epsilon-DP; one release per round by default)", gt=0
        ),
        Param("clip", 1.0, "joint L1 clipping norm C (sensitivity 2C, Laplace scale 2C / epsilon)", gt=0),
        CLIP_PER_PARAM,
        DENSE_PARAM,
        Param(
            "delta",
            0.0,
            "0: report pure epsilon by basic composition; > 0: the PLD accountant's epsilon at this delta",
            ge=0,
            lt=1,
        ),
        Param("target_epsilon", 0.0, "> 0: calibrate epsilon per round so that the total over the run is this", ge=0),
        Param("rounds", 0, "rounds of the run for target_epsilon (0: the release count the protocol declares)", ge=0),
    )
    strength = "epsilon"
    default_grid = (100.0, 30.0, 10.0, 3.0, 1.0, 0.3)
    clip_ord = 1

    @property
    def noise_scale(self) -> float:
        """Laplace scale b = sensitivity / epsilon = 2C / epsilon."""
        return self.sensitivity / self.config["epsilon"]

    def public_noise(self) -> dict[str, float]:
        return {"noise_scale": self.noise_scale}

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return laplace_noise(rng, size, self.noise_scale)

    def noise_sums(self, rng: np.random.Generator, counts: np.ndarray) -> np.ndarray:
        return laplace_sums(rng, counts, self.noise_scale)

    def total_epsilon(self, value: float, rounds: int) -> float:
        return accounting.laplace_epsilon(value, rounds, self.config["delta"])

    @property
    def unit(self) -> str:
        return UNITS[self.neighbour]

    def privacy_spent(self, rounds: int) -> dict[str, Any]:
        """Total epsilon over ``rounds`` rounds, every release composed: ``epsilon`` by the
        tightest accountant at this defense's ``delta`` (basic composition when delta = 0),
        ``epsilon_basic`` = releases x epsilon, ``epsilon_pld`` the PLD epsilon at ``delta_pld``
        (the defense's delta, or :data:`REFERENCE_DELTA` when it is 0); plus the claim
        (:meth:`ClippedNoise.claim`)."""
        eps, delta = self.config["epsilon"], self.config["delta"]
        claim = self.claim(rounds)
        releases = claim["releases"]
        basic = float(releases) * eps
        delta_pld = delta if delta > 0 else REFERENCE_DELTA
        pld = accounting.laplace_epsilon(eps, releases, delta_pld)
        return {
            "epsilon": pld if delta > 0 else basic,
            "delta": delta,
            "unit": claim.pop("unit"),
            "accountant": "pld" if delta > 0 else "basic",
            "epsilon_basic": basic,
            "epsilon_per_round": eps * claim["releases_per_round"],
            "epsilon_per_release": eps,
            "epsilon_pld": pld,
            "delta_pld": delta_pld,
            "noise_scale": self.noise_scale,
            **claim,
        }
