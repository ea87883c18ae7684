"""What the generic attacks read from any transcript with item-embedding uploads.

The contract (simulated protocols and recorded runs alike, through a schema map): messages of
kind ``item_update`` from ``client:<k>`` to the server with payload ``items`` (int64 row ids)
and ``values`` (len(items) x K); meta ``values`` says whether the values are the updated rows
(``"rows"``) or row deltas (anything else, the default). When the values are rows, the model
the server sent is read from its ``state`` messages (meta ``of = "model"``, ``to`` the
receivers, payload ``V``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from privaudit.transcript import Transcript, View


@dataclass
class Upload:
    """One client's item upload in one round, as deltas against the model it was sent."""

    round: int
    items: np.ndarray  # (n,) int64
    delta: np.ndarray | None  # (n, K) float64 new - old, None when the sent model is unknown
    sent: np.ndarray | None  # (n, K) rows of the model the client was sent, or None
    #: other uploaded per-item arrays (e.g. item biases): name -> change of the upload's items (n,)
    extras: dict = field(default_factory=dict)


def sent_models(view: View) -> dict[tuple[int, str], np.ndarray]:
    """(round, client) -> the ``V`` the server sent that client (from its ``state`` messages)."""
    return {key: np.asarray(p["V"], dtype=np.float64) for key, p in sent_payloads(view).items()}


def sent_payloads(view: View) -> dict[tuple[int, str], dict[str, np.ndarray]]:
    """(round, client) -> the whole model payload the server sent that client (``V`` and the rest)."""
    out: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for m in view.select("state"):
        if m.meta.get("of") == "model" and "V" in m.payload:
            for party in m.meta.get("to", []):
                out[(m.round, party)] = m.payload
    return out


def _per_item_changes(payload: dict, sent: dict | None, m: int, items: np.ndarray) -> dict[str, np.ndarray]:
    """Changes of the uploaded 1-D float arrays of ``m`` entries (per-item arrays such as item
    biases) against the same arrays of the model sent, at ``items``."""
    out: dict[str, np.ndarray] = {}
    for name, a in payload.items():
        if name in ("items", "values") or sent is None or name not in sent:
            continue
        a, b = np.asarray(a), np.asarray(sent[name])
        if a.ndim == 1 and a.shape == b.shape == (m,) and a.dtype.kind == "f" and b.dtype.kind == "f":
            out[name] = (a.astype(np.float64) - b.astype(np.float64))[items]
    return out


def canary(config: dict) -> str | None:
    """The canary client of a recording (``privaudit record --canaries``): not a victim."""
    c = config.get("canaries")
    return str(c["party"]) if isinstance(c, dict) and isinstance(c.get("party"), str) else None


def client_uploads(view: View, include_canary: bool = False, floor: bool = True) -> dict[str, list[Upload]]:
    """Every client's ``item_update`` uploads in round order (the canary client's only with
    ``include_canary``). With ``floor``, an upload that changes every row of the whole matrix
    keeps only the rows that moved beyond its noise floor (:func:`moved_rows`: a DP mod's noise
    moves every row)."""
    payloads = sent_payloads(view)
    models = {key: np.asarray(p["V"], dtype=np.float64) for key, p in payloads.items()}
    skip = None if include_canary else canary(view.config)
    out: dict[str, list[Upload]] = {}
    for m in view.select("item_update"):
        if "items" not in m.payload or "values" not in m.payload or m.sender == skip:
            continue
        items = np.asarray(m.payload["items"], dtype=np.int64).ravel()
        values = np.asarray(m.payload["values"], dtype=np.float64).reshape(items.size, -1)
        V = models.get((m.round, m.sender))
        sent = V[items] if V is not None and items.size and items.max() < V.shape[0] else None
        if m.meta.get("values") == "rows":
            delta = values - sent if sent is not None else None
        else:
            delta = values
        if floor and delta is not None and V is not None and items.size == V.shape[0] >= 8:
            keep = moved_rows(delta)
            items, delta, sent = items[keep], delta[keep], (sent[keep] if sent is not None else None)
        extras = (
            _per_item_changes(m.payload, payloads.get((m.round, m.sender)), V.shape[0], items) if V is not None else {}
        )
        out.setdefault(m.sender, []).append(Upload(m.round, items, delta, sent, extras))
    return out


#: false-positive rate per upload of the noise floor (:func:`moved_rows`), Bonferroni over its rows
NOISE_LEVEL = 1e-3
#: the lower quantile of the squared row changes that estimates the noise variance
_NOISE_QUANTILE = 0.25


def moved_rows(delta: np.ndarray, whole: bool = True) -> np.ndarray:
    """Mask of the rows of an upload's changes (n x K) that moved beyond its noise floor.

    Rows no client trained change only by the noise a DP mod adds (``LocalDpMod``: N(0, s^2) on
    every entry), so when an upload changes every row of the whole matrix (``whole``) and fewer
    than a quarter of its rows are exactly unchanged, the noise variance is estimated from the
    rows: s^2 = the lower quartile of |delta_i|^2 over the chi-square(K) lower quartile (most rows
    are untrained); a row moved when |delta_i|^2 exceeds s^2 chi2.isf(NOISE_LEVEL / n, K).
    Otherwise (no noise: untouched rows are exactly 0) every nonzero row moved."""
    sq = np.sum(np.asarray(delta, dtype=np.float64) ** 2, axis=1)
    nonzero = sq > 0
    n, k = delta.shape if delta.ndim == 2 else (sq.size, 1)
    if not whole or n < 8 or np.mean(~nonzero) >= _NOISE_QUANTILE:
        return nonzero
    from scipy.stats import chi2

    var = float(np.quantile(sq, _NOISE_QUANTILE)) / float(chi2.ppf(_NOISE_QUANTILE, k))
    return sq > var * float(chi2.isf(NOISE_LEVEL / n, k))


def changed_items(up: Upload, n_items: int | None = None) -> np.ndarray:
    """Ids of the rows an upload changed beyond its noise floor (:func:`moved_rows`; every
    uploaded row when the change is unknown). ``n_items``: the upload covers the whole matrix
    when it lists that many rows (default: when it lists at least 8 rows and every id below them)."""
    if up.delta is None:
        return np.unique(up.items)
    whole = up.items.size == n_items if n_items else (up.items.size >= 8 and up.items.max() + 1 == up.items.size)
    return np.unique(up.items[moved_rows(up.delta, whole)])


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


def missing_note(view: View) -> str:
    """Why a view holds no item uploads: the active defenses (:func:`defense_note`) and, for a
    recording whose item-embedding matrix was not found, the recorder's reason."""
    dense = view.config.get("dense")
    reason = dense.get("reason") if isinstance(dense, dict) else None
    return defense_note(view) + (f" ({reason})" if isinstance(reason, str) and reason else "")


def uploaders(transcript: Transcript) -> list[str]:
    """Every client that uploaded item rows, in the clear or masked (the victims of a run)."""
    kinds = ("item_update", "masked_update")
    skip = canary(transcript.config)
    return sorted(
        {m.sender for m in transcript.messages if m.kind in kinds and m.receiver == "server" and m.sender != skip}
    )


def scored_victims(transcript: Transcript, parties) -> list[str]:
    """The parties among ``parties`` that have ground truth (a ``private`` message)."""
    return [p for p in parties if transcript.private(p)]


def ratio(num: np.ndarray, den: np.ndarray, root: bool = False) -> float:
    """sum(num) / sum(den) (its square root with ``root``); NaN when the denominators sum to 0."""
    total = float(np.sum(den))
    if total <= 0:
        return float("nan")
    v = float(np.sum(num)) / total
    return float(np.sqrt(max(v, 0.0))) if root else v


def cross_fit(
    strategies: dict[str, dict[str, np.ndarray]], select: str, weight: np.ndarray, higher_is_better: bool = True
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Per-victim numerators of message-free strategies, each victim scored by the strategy
    chosen on the other half of the victims.

    Parameters
    ----------
    strategies : dict[str, dict[str, numpy.ndarray of shape (n_victims,)]]
        Strategy name -> per-victim numerators (every strategy has the same keys).
    select : str
        The key ranking the strategies: ``sum(num[select]) / sum(weight)`` over a half.
    weight : numpy.ndarray of shape (n_victims,)
        Denominators of ``select``.
    higher_is_better : bool

    Returns
    -------
    numerators : dict[str, numpy.ndarray of shape (n_victims,)]
        The victims at even positions get the strategy best on the odd positions and vice
        versa (ties: the first strategy listed; fewer than two victims: the first strategy).
    chosen : dict[str, str]
        ``{"even": name, "odd": name}``: the strategy each half was scored with.
    """
    names = list(strategies)
    n = weight.size
    halves = {"even": np.arange(0, n, 2), "odd": np.arange(1, n, 2)}
    chosen = {}
    for half, other in (("even", "odd"), ("odd", "even")):
        idx = halves[other]
        vals = [ratio(strategies[s][select][idx], weight[idx]) for s in names]
        vals = [v if np.isfinite(v) else (-np.inf if higher_is_better else np.inf) for v in vals]
        chosen[half] = names[int(np.argmax(vals) if higher_is_better else np.argmin(vals))] if n > 1 else names[0]
    out = {}
    for key in strategies[names[0]]:
        arr = np.zeros(n)
        for half, idx in halves.items():
            arr[idx] = strategies[chosen[half]][key][idx]
        out[key] = arr
    return out, chosen


def loo_counts(
    keys: np.ndarray, levels: np.ndarray, owner: np.ndarray, q_keys: np.ndarray, q_owner: np.ndarray, n_levels: int
) -> np.ndarray:
    """Per query, how often each level occurs under its key among the other owners' records.

    Population records: ``keys``, ``levels`` (in [0, n_levels)), ``owner`` (n,) ints (e.g. item,
    rating level, client index); queries: ``q_keys``, ``q_owner`` (q,). Returns (q, n_levels)
    counts without the query owner's own records (leave one victim out); keys all 0 give the
    global counts.
    """
    n_keys = int(max(keys.max(initial=-1), q_keys.max(initial=-1))) + 1
    counts = np.zeros((n_keys, n_levels))
    np.add.at(counts, (keys, levels), 1.0)
    code = owner.astype(np.int64) * n_keys + keys
    uniq, inv = np.unique(code, return_inverse=True)
    own = np.zeros((uniq.size, n_levels))
    np.add.at(own, (inv, levels), 1.0)
    q_code = q_owner.astype(np.int64) * n_keys + q_keys
    pos = np.minimum(np.searchsorted(uniq, q_code), max(uniq.size - 1, 0))
    out = counts[q_keys]
    if uniq.size:
        found = uniq[pos] == q_code
        out[found] -= own[pos[found]]
    return out


def rating_population(
    transcript: Transcript, lo: float, step: float, n_levels: int
) -> tuple[dict[str, int], np.ndarray, np.ndarray, np.ndarray]:
    """Every client's private ratings: (client party -> owner index, item ids, rating levels
    ``round((r - lo) / step)`` clipped to [0, n_levels), owner indices), arrays of shape (n,)."""
    clients = [p for p in transcript.clients() if "items" in transcript.private(p)]
    items, levels, owner = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for i, p in enumerate(clients):
        priv = transcript.private(p)
        items.append(np.asarray(priv["items"], dtype=np.int64).ravel())
        r = np.asarray(priv.get("ratings", np.full(items[-1].size, lo)), dtype=np.float64).ravel()
        levels.append(np.clip(np.round((r - lo) / step), 0, n_levels - 1).astype(np.int64))
        owner.append(np.full(items[-1].size, i, dtype=np.int64))
    return {p: i for i, p in enumerate(clients)}, np.concatenate(items), np.concatenate(levels), np.concatenate(owner)


def loo_rating_counts(
    population: tuple[dict[str, int], np.ndarray, np.ndarray, np.ndarray],
    q_items: np.ndarray,
    q_owner: np.ndarray,
    n_levels: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Per query (item, owner index), the other clients' rating-level counts overall and of the
    item (the overall ones for an item no other client rated), both (q, n_levels)."""
    _, items, levels, owner = population
    q_items, q_owner = np.asarray(q_items, dtype=np.int64), np.asarray(q_owner, dtype=np.int64)
    overall = loo_counts(np.zeros_like(items), levels, owner, np.zeros_like(q_items), q_owner, n_levels)
    per_item = loo_counts(items, levels, owner, q_items, q_owner, n_levels)
    return overall, np.where(per_item.sum(axis=1, keepdims=True) > 0, per_item, overall)
