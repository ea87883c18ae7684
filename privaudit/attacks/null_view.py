"""The null view of an attack: the attacker's view with every client's messages replaced by
messages that carry no information about that client's data (same kinds, rounds, shapes and
item ids), so that the attack's own pipeline on it measures what the attack achieves from its
prior knowledge alone (:meth:`privaudit.attacks.base.Attack.evaluate`, ``baseline_null``).

How a victim's message is replaced by default (``kind``, ``round`` and the integer arrays -- item
ids, flags -- are kept; only float arrays change; an attack whose leak is the id set itself, such
as which items a client trained, declares ``null_keeps_ids = False`` and gets the donor's whole
messages instead):

* every victim gets one donor, another client, through a random derangement fixed for the whole
  view (so that a multi-round attack sees one donor's coherent messages);
* a float array whose leading dimension matches an integer id array of the same message (e.g.
  ``grad_V``'s ``values`` beside ``items``) takes, row by row, the donor's row of the same id;
  an id the donor did not send takes the row of that id from another client drawn at random
  (never the victim), and an id no other client sent a random row of another client;
* any other float array takes the donor's array when the shapes agree, else values drawn from
  the donor's array.

What is kept is the victim's item ids (their disclosure is not what the null tests: the scoring
runs on the victim's own items in both arms), the public configuration and the attacker's own
``state``/``private`` messages. Messages from non-client parties (an item server, decryptors)
are kept as they are.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any

import numpy as np

from privaudit.transcript import Message, View, is_client


def _id_key(payload: dict[str, np.ndarray], rows: int) -> str | None:
    """The integer 1-D array of ``payload`` with ``rows`` entries (the row ids), if any."""
    for key, arr in payload.items():
        if arr.ndim == 1 and arr.dtype.kind in "iu" and arr.shape[0] == rows:
            return key
    return None


class _Pool:
    """Rows of one (kind, round, float key) over every sender, sorted by id, to draw "the row of
    id i from a random other client" in one vectorized step."""

    def __init__(self, entries: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
        owner = np.concatenate([np.full(ids.size, who, dtype=np.int64) for who, ids, _ in entries])
        ids = np.concatenate([ids for _, ids, _ in entries]).astype(np.int64)
        rows = np.concatenate([vals.reshape(vals.shape[0], -1) for _, _, vals in entries])
        order = np.argsort(ids, kind="stable")
        self.ids, self.owner, self.rows = ids[order], owner[order], rows[order]

    def draw(self, ids: np.ndarray, exclude: int, rng: np.random.Generator) -> np.ndarray:
        if self.ids.size == 0:  # nobody sent a row: nothing to draw from
            return np.zeros((ids.size, self.rows.shape[1]), dtype=self.rows.dtype)
        lo = np.searchsorted(self.ids, ids, side="left")
        hi = np.searchsorted(self.ids, ids, side="right")
        count = hi - lo
        pick = lo + (rng.random(ids.size) * np.maximum(count, 1)).astype(np.int64)
        pick = np.minimum(pick, np.maximum(hi - 1, lo))
        own = (count > 0) & (self.owner[np.minimum(pick, self.ids.size - 1)] == exclude)
        # the victim's own row: step to the next row of the same id (another client's), if any
        step = own & (count > 1)
        pick[step] = lo[step] + (pick[step] - lo[step] + 1) % count[step]
        missing = (count == 0) | (own & (count <= 1))
        if missing.any():  # no other client sent this id: any other client's row
            others = np.flatnonzero(self.owner != exclude)
            if others.size:
                pick[missing] = others[rng.integers(0, others.size, size=int(missing.sum()))]
            else:
                pick[missing] = rng.integers(0, self.ids.size, size=int(missing.sum()))
        return self.rows[pick]


def derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    """A random permutation of ``range(n)`` without fixed points (n >= 2; identity for n < 2)."""
    if n < 2:
        return np.arange(n)
    order = rng.permutation(n)
    out = np.empty(n, dtype=np.int64)
    out[order] = np.roll(order, -1)  # each victim's donor is the next one in a random cycle
    return out


def null_view(view: View, rng: np.random.Generator, keep_ids: bool = True) -> View:
    """``view`` with every client sender's messages replaced as the module docstring says; with
    ``keep_ids`` False a victim's messages become its donor's whole messages (item ids
    included), for attacks whose leak is the id set itself (which items a client trained)."""
    senders = sorted({m.sender for m in view.messages if is_client(m.sender) and m.sender != view.party})
    if len(senders) < 2:
        return view
    code = {s: k for k, s in enumerate(senders)}
    donor = derangement(len(senders), rng)
    by = defaultdict(list)  # (kind, round, sender) -> its messages, in order
    for m in view.messages:
        if m.sender in code:
            by[(m.kind, m.round, m.sender)].append(m)
    pools: dict[tuple[str, int, int, str], _Pool | None] = {}

    def pool(kind: str, rnd: int, pos: int, key: str) -> _Pool | None:
        k = (kind, rnd, pos, key)
        if k not in pools:
            entries = []
            for s in senders:
                msgs = by.get((kind, rnd, s), [])
                if pos < len(msgs):
                    vals = msgs[pos].payload.get(key)
                    ids_key = _id_key(msgs[pos].payload, vals.shape[0]) if vals is not None and vals.ndim else None
                    if ids_key is not None and vals.dtype.kind == "f":
                        entries.append((code[s], msgs[pos].payload[ids_key], vals))
            pools[k] = _Pool(entries) if entries else None
        return pools[k]

    out: list[Message] = []
    seen: dict[tuple[str, int, str], int] = defaultdict(int)
    for m in view.messages:
        if m.sender not in code:
            out.append(m)
            continue
        pos = seen[(m.kind, m.round, m.sender)]
        seen[(m.kind, m.round, m.sender)] += 1
        d = senders[int(donor[code[m.sender]])]
        dmsgs = by.get((m.kind, m.round, d), [])
        dm = dmsgs[pos] if pos < len(dmsgs) else None
        if not keep_ids and dm is not None:
            out.append(replace(m, payload=dict(dm.payload)))
            continue
        payload: dict[str, Any] = {}
        for key, arr in m.payload.items():
            if arr.dtype.kind != "f":
                payload[key] = arr
                continue
            payload[key] = _replace(m, dm, pos, key, arr, code[m.sender], pool, rng)
        out.append(replace(m, payload=payload))
    return View(
        party=view.party,
        protocol=view.protocol,
        config=dict(view.config),
        dataset=dict(view.dataset),
        parties=list(view.parties),
        messages=out,
    )


def _replace(m: Message, dm: Message | None, pos: int, key: str, arr: np.ndarray, who: int, pool, rng) -> np.ndarray:
    """The null version of float array ``key`` of message ``m`` (donor message ``dm``)."""
    ids_key = _id_key(m.payload, arr.shape[0]) if arr.ndim else None
    if ids_key is not None:
        ids = m.payload[ids_key].astype(np.int64)
        rows = np.empty((ids.size, int(np.prod(arr.shape[1:], dtype=np.int64))), dtype=arr.dtype)
        filled = np.zeros(ids.size, dtype=bool)
        if dm is not None and key in dm.payload and dm.payload[key].shape[1:] == arr.shape[1:]:
            d_ids_key = _id_key(dm.payload, dm.payload[key].shape[0])
            if d_ids_key is not None:
                d_ids = dm.payload[d_ids_key].astype(np.int64)
                order = np.argsort(d_ids, kind="stable")
                at = np.searchsorted(d_ids[order], ids)
                at = np.minimum(at, max(d_ids.size - 1, 0))
                hit = d_ids.size > 0
                filled = (d_ids[order][at] == ids) if hit else filled
                if filled.any():
                    rows[filled] = dm.payload[key].reshape(d_ids.size, -1)[order[at[filled]]]
        if not filled.all():
            p = pool(m.kind, m.round, pos, key)
            if p is not None:
                rows[~filled] = p.draw(ids[~filled], who, rng)
            else:
                rows[~filled] = 0.0
        return rows.reshape(arr.shape)
    if dm is not None and key in dm.payload:
        src = np.asarray(dm.payload[key])
        if src.shape == arr.shape:
            return src
        if src.size:
            return rng.choice(src.ravel(), size=arr.shape).astype(arr.dtype)
    return arr * 0.0
