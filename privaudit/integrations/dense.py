"""Whole-matrix replies: detect the item-embedding matrix of a recorded run and convert replies.

Most Flower apps use the stock ``FedAvg`` pattern: the server sends the whole parameter list
(``ArrayRecord([V, ...])``, entries ``arrays/0``, ``arrays/1``, ...) and every client replies
with its whole list, item ids nowhere. A client that trains only its rated items' rows returns
the other rows unchanged, so the rows that changed against the model it was sent are the items
it trained. :func:`convert` turns such a recording into privaudit's contract:

* the item-embedding matrix is the entry the schema map names (dense form), or, for
  ``item-embeddings = "auto"`` (an app without a map), every 2-D float array with ``n_items``
  rows that the server sends and the clients return with the same shape (several: their
  columns concatenated, e.g. NCF's GMF and MLP item tables);
* each such down message becomes ``model`` with payload ``V`` (n_items x K, float64);
* each reply becomes ``item_update`` with ``items`` = the changed row ids and ``values`` = those
  rows as returned, meta ``values`` = ``"rows"`` (updated rows: unchanged rows equal the sent
  ones) or ``"deltas"`` (unchanged rows are 0), decided over all replies unless the map says.

Other arrays (biases, user-side or head parameters) stay in the payload under their names.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from privaudit.integrations.schema_map import SchemaMap

__all__ = ["changed_rows", "convert", "detect", "updates_mode"]


def _natural(name: str) -> tuple:
    """Sort key putting ``arrays/2`` before ``arrays/10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _is_matrix(a: Any, rows: int | None) -> bool:
    return (
        isinstance(a, np.ndarray) and a.ndim == 2 and a.dtype.kind == "f" and (rows is None or a.shape[0] == rows)
    ) and a.shape[0] >= 2


def _plain_type(kind: str) -> str | None:
    """The Flower message type of an unmapped event kind (``flower.<type>[.reply]``)."""
    if not kind.startswith("flower.") or kind == "flower.error":
        return None
    return kind[len("flower.") :].removesuffix(".reply")


def detect(events: list, n_items: int | None, skip: tuple[str, ...] = ()) -> tuple[str, tuple[str, ...]]:
    """(message type, entry names) of the item-embedding matrices, ``("", ())`` when none.

    Parameters
    ----------
    events : list of recorder events (``direction``, ``kind``, ``payload``)
    n_items : int or None
        The public number of items; None admits any row count of at least 2.
    skip : tuple of str
        Entries that are not item matrices (the map's user-side and head parameters).
    """
    down: dict[tuple[str, str], tuple] = {}
    up: dict[tuple[str, str], int] = {}
    for ev in events:
        mtype = _plain_type(ev.kind)
        if mtype is None:
            continue
        for name, a in ev.payload.items():
            if name in skip or not _is_matrix(a, n_items):
                continue
            if ev.direction == "down":
                down.setdefault((mtype, name), a.shape)
            elif down.get((mtype, name)) == a.shape:
                up[(mtype, name)] = up.get((mtype, name), 0) + 1
    if not up:
        return "", ()
    counts: dict[str, int] = {}
    for (mtype, _name), n in up.items():
        counts[mtype] = max(counts.get(mtype, 0), n)
    mtype = max(sorted(counts), key=lambda t: (counts[t], t == "train"))
    names = sorted((n for t, n in up if t == mtype), key=_natural)
    if n_items is None:  # no public item count: the matrices with the most rows
        top = max(down[(mtype, n)][0] for n in names)
        names = [n for n in names if down[(mtype, n)][0] == top]
    return mtype, tuple(names)


def _stack(payload: dict[str, np.ndarray], names: tuple[str, ...]) -> np.ndarray | None:
    """The matrices ``names`` of a payload side by side (float64), None if one is missing or
    their row counts differ."""
    parts = [payload.get(n) for n in names]
    if any(p is None or p.ndim != 2 for p in parts) or len({p.shape[0] for p in parts}) != 1:
        return None
    return np.hstack([np.asarray(p, dtype=np.float64) for p in parts])


def updates_mode(pairs: list[tuple[np.ndarray, np.ndarray]]) -> str:
    """``"rows"`` when more returned rows equal the sent ones than are zero, else ``"deltas"``.

    ``pairs``: (sent, returned) matrices of the same shape (n_items x K).
    """
    same = sum(int(np.sum(np.all(u == s, axis=1))) for s, u in pairs)
    zero = sum(int(np.sum(np.all(u == 0, axis=1))) for _, u in pairs)
    return "rows" if same >= zero else "deltas"


def changed_rows(sent: np.ndarray, returned: np.ndarray, mode: str) -> np.ndarray:
    """Ids (int64) of the rows a reply changed: differing from ``sent`` (``"rows"``) or nonzero."""
    ref = sent if mode == "rows" else 0.0
    return np.flatnonzero(np.any(returned != ref, axis=1)).astype(np.int64)


def convert(events: list, schema: SchemaMap, config: dict[str, Any]) -> tuple[list, SchemaMap, dict[str, Any]]:
    """Recorder events with whole-matrix messages converted (module docstring).

    Returns the events (new objects where converted; the input is not modified), the schema
    map with the matrix entries resolved, and a summary for the public config (``entries``,
    ``updates``, ``converted`` replies, ``reason`` when nothing was found). A ``kinds`` map
    whose replies may hold whole matrices (:attr:`SchemaMap.whole_matrix`) has them converted
    against its ``model`` messages; any other map returns everything unchanged and an empty
    summary.
    """
    if not schema.whole_matrix:
        return events, schema, {}
    if not schema.dense:
        return _convert_mapped(events, schema)
    n_items = config.get("n_items")
    n_items = int(n_items) if isinstance(n_items, (int, np.integer)) and not isinstance(n_items, bool) else None
    skip = schema.user_params + schema.head_params
    if schema.auto:
        mtype, names = detect(events, n_items, skip)
    else:
        mtype, names = schema.dense_message_type, schema.item_embeddings
    if not names:
        rows = f"n_items = {n_items}" if n_items is not None else "the same"
        reason = (
            f"no item-embedding matrix: no 2-D float array with {rows} rows is sent to the clients "
            "and returned in their replies"
        )
        return events, schema, {"entries": [], "reason": reason}
    resolved = schema.with_embeddings(names) if schema.auto else schema
    if schema.auto and mtype != resolved.dense_message_type:
        resolved = SchemaMap.from_dict({**resolved.to_dict(), "message-type": mtype})
    sent: dict[int, np.ndarray] = {}
    pairs: list[tuple[int, np.ndarray, np.ndarray]] = []  # (event index, sent, returned)
    out = list(events)
    for i, ev in enumerate(events):
        if _plain_type(ev.kind) != mtype:
            continue
        M = _stack(ev.payload, names)
        if M is None:
            continue
        if ev.direction == "down":
            sent[ev.node] = M
            payload = {k: v for k, v in ev.payload.items() if k not in names}
            out[i] = _replace(ev, "model", {"V": M, **payload}, {"item_embeddings": list(names)})
        elif ev.node in sent and sent[ev.node].shape == M.shape:
            pairs.append((i, sent[ev.node], M))
    mode = schema.updates if schema.updates != "auto" else updates_mode([(s, u) for _, s, u in pairs])
    for i, S, U in pairs:
        ev = events[i]
        ids = changed_rows(S, U, mode)
        payload = {k: v for k, v in ev.payload.items() if k not in names}
        payload.update({"items": ids, "values": U[ids]})
        meta = {"values": mode, "item_embeddings": list(names)}
        out[i] = _replace(ev, "item_update", payload, meta)
    summary = {"entries": list(names), "message_type": mtype, "updates": mode, "converted": len(pairs)}
    summary["detected"] = schema.auto
    if not pairs:
        summary["reason"] = f"no {mtype!r} reply returns {', '.join(names)} with the shape it was sent"
    return out, resolved, summary


def _convert_mapped(events: list, schema: SchemaMap) -> tuple[list, SchemaMap, dict[str, Any]]:
    """:func:`convert` for a ``kinds`` map: replies mapped to ``item_update`` without ``items``
    (their ``values``), or unmapped replies holding a ``model`` rule's ``V`` entry, against the
    ``V`` of the last ``model`` message the client was sent."""
    v_entries = sorted({r.payload["V"] for r in schema.kinds if r.kind == "model" and "V" in r.payload})
    sent: dict[int, np.ndarray] = {}
    pairs: list[tuple[int, str, np.ndarray, np.ndarray]] = []  # (event index, entry, sent, returned)
    for i, ev in enumerate(events):
        if ev.direction == "down":
            if ev.kind == "model" and _is_matrix(ev.payload.get("V"), None):
                sent[ev.node] = np.asarray(ev.payload["V"], dtype=np.float64)
            continue
        if ev.kind == "item_update" and "items" not in ev.payload:
            entry = "values"
        elif _plain_type(ev.kind) is not None and ev.kind.endswith(".reply"):
            entry = next((e for e in v_entries if e in ev.payload), "")
        else:
            continue
        U = ev.payload.get(entry)
        if ev.node in sent and isinstance(U, np.ndarray) and U.shape == sent[ev.node].shape:
            pairs.append((i, entry, sent[ev.node], np.asarray(U, dtype=np.float64)))
    mode = updates_mode([(s, u) for _, _, s, u in pairs])
    out = list(events)
    for i, entry, S, U in pairs:
        ev = events[i]
        ids = changed_rows(S, U, mode)
        payload = {k: v for k, v in ev.payload.items() if k != entry}
        payload.update({"items": ids, "values": U[ids]})
        out[i] = _replace(ev, "item_update", payload, {"values": mode})
    summary: dict[str, Any] = {"entries": sorted({e for _, e, _, _ in pairs}), "updates": mode}
    summary.update({"converted": len(pairs), "detected": False})
    if not pairs:
        summary["reason"] = "no reply returns a whole matrix of the shape of the model it was sent"
    return out, schema, summary


def _replace(ev: Any, kind: str, payload: dict[str, np.ndarray], meta: dict[str, Any]) -> Any:
    return type(ev)(ev.direction, ev.node, ev.round, kind, payload, {**ev.meta, **meta})
