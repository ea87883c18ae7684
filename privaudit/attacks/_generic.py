"""What the generic attacks read from any transcript with item-embedding uploads.

The contract (simulated protocols and recorded runs alike, through a schema map): messages of
kind ``item_update`` from ``client:<k>`` to the server with payload ``items`` (int64 row ids)
and ``values`` (len(items) x K); meta ``values`` says whether the values are the updated rows
(``"rows"``) or row deltas (anything else, the default). When the values are rows, the model
the server sent is read from its ``state`` messages (meta ``of = "model"``, ``to`` the
receivers, payload ``V``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privaudit.transcript import Transcript, View


@dataclass
class Upload:
    """One client's item upload in one round, as deltas against the model it was sent."""

    round: int
    items: np.ndarray  # (n,) int64
    delta: np.ndarray | None  # (n, K) float64 new - old, None when the sent model is unknown
    sent: np.ndarray | None  # (n, K) rows of the model the client was sent, or None


def sent_models(view: View) -> dict[tuple[int, str], np.ndarray]:
    """(round, client) -> the ``V`` the server sent that client (from its ``state`` messages)."""
    out: dict[tuple[int, str], np.ndarray] = {}
    for m in view.select("state"):
        if m.meta.get("of") == "model" and "V" in m.payload:
            for party in m.meta.get("to", []):
                out[(m.round, party)] = np.asarray(m.payload["V"], dtype=np.float64)
    return out


def client_uploads(view: View) -> dict[str, list[Upload]]:
    """Every client's ``item_update`` uploads in round order."""
    models = sent_models(view)
    out: dict[str, list[Upload]] = {}
    for m in view.select("item_update"):
        if "items" not in m.payload or "values" not in m.payload:
            continue
        items = np.asarray(m.payload["items"], dtype=np.int64).ravel()
        values = np.asarray(m.payload["values"], dtype=np.float64).reshape(items.size, -1)
        V = models.get((m.round, m.sender))
        sent = V[items] if V is not None and items.size and items.max() < V.shape[0] else None
        if m.meta.get("values") == "rows":
            delta = values - sent if sent is not None else None
        else:
            delta = values
        out.setdefault(m.sender, []).append(Upload(m.round, items, delta, sent))
    return out


def changed_items(up: Upload) -> np.ndarray:
    """Ids of the rows an upload changed (every uploaded row when the change is unknown)."""
    if up.delta is None:
        return np.unique(up.items)
    return np.unique(up.items[np.any(up.delta != 0, axis=1)])


def truth_items(transcript: Transcript, party: str) -> np.ndarray:
    return np.asarray(transcript.private(party).get("items", np.zeros(0)), dtype=np.int64).ravel()


def n_items(transcript: Transcript | View) -> int:
    """Number of items: the public ``n_items``, else one more than the largest uploaded id."""
    m = transcript.config.get("n_items")
    if isinstance(m, (int, np.integer)) and m > 0:
        return int(m)
    top = -1
    for msg in transcript.select("item_update"):
        items = np.asarray(msg.payload.get("items", np.zeros(0)), dtype=np.int64)
        if items.size:
            top = max(top, int(items.max()))
    return top + 1


def defense_note(view: View) -> str:
    """`` (active defense: ...)`` naming the defenses the transcript's public config records."""
    names = []
    for d in view.config.get("defenses", []) or []:
        if isinstance(d, dict) and d.get("name"):
            label = str(d["name"])
            if d.get("workflow"):
                label += f" = Flower {d['workflow']} with {d.get('client_mod', 'its client mod')}"
            names.append(label)
    return f" (active defense: {', '.join(names)})" if names else ""


def uploaders(transcript: Transcript) -> list[str]:
    """Every client that uploaded item rows, in the clear or masked (the victims of a run)."""
    kinds = ("item_update", "masked_update")
    return sorted({m.sender for m in transcript.messages if m.kind in kinds and m.receiver == "server"})


def scored_victims(transcript: Transcript, parties) -> list[str]:
    """The parties among ``parties`` that have ground truth (a ``private`` message)."""
    return [p for p in parties if transcript.private(p)]
