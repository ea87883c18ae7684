"""The prior library of the FedMVMF attacks: message-free guessing strategies scored per victim,
each metric's strategy chosen on held-out victims (the prior-only baseline), and the same
population statistics as the attacks' knowledge for their posterior decoding."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privaudit.attacks.generic._uploads import cross_fit
from privaudit.attacks.mvmf._view import (
    TINY,
    client_sort_key,
    per_transcript,
    private_payloads,
    rating_domain,
    ratio,
    true_ratings,
)
from privaudit.transcript import Transcript

#: message-free strategies of the prior library, per metric, in order of preference on ties
PRIOR_STRATEGIES = {
    "rating_accuracy": ("global", "item"),
    "rated_rating_accuracy": ("global", "item"),
    "rated_detection_accuracy": ("global", "item"),
    "attribute_accuracy": ("global", "column"),
}


#: pseudo-ratings from the global marginal in an item's predictive distribution: the value of
#: this grid with the best leave-one-out predictive likelihood of the population's values
_ITEM_PSEUDO = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def _fit_pseudo(cnt: np.ndarray, mine: np.ndarray, gmarg: np.ndarray, ok: np.ndarray) -> float:
    """Dirichlet concentration a0 of the per-item predictive ``(counts + a0 g) / (n + a0)``
    maximizing the leave-one-out log likelihood of the rows ``ok`` (their own value left out):
    ``cnt`` (N, H) item counts, ``mine`` (N, H) the row's one-hot value, ``gmarg`` (N, H)
    marginal of the other victims."""
    if not ok.any():
        return _ITEM_PSEUDO[0]
    c, own, g = cnt[ok], mine[ok], gmarg[ok]
    others = c - own
    n_other = others.sum(axis=1)
    hit = np.sum(others * own, axis=1)  # other users' count of the row's own value
    g_own = np.sum(g * own, axis=1)
    scores = [float(np.sum(np.log((hit + a0 * g_own) / (n_other + a0)))) for a0 in _ITEM_PSEUDO]
    return _ITEM_PSEUDO[int(np.argmax(scores))]


@dataclass
class PriorTable:
    """The prior library on a transcript: per victim, the hits of the message-free strategy
    chosen on the other half of the victims (:func:`prior_table`).

    Attributes
    ----------
    victims : list[str]             clients the server heard from, by client_sort_key (n,)
    offsets : numpy.ndarray         int64 (n + 1,), victim k's first upload at offsets[k]:offsets[k + 1]
    items, truth : numpy.ndarray    (N,) uploaded item ids and their true values (0 = unrated)
    values : numpy.ndarray          (H,) value grid (0 first when unrated items are uploaded)
    attributes : numpy.ndarray      (n, p) true dummies (p = 0 when the clients hold none)
    weight, hits : dict[str, numpy.ndarray]   per metric (n,): scored values, prior's exact guesses
    choice : dict[str, tuple[str, str]]       per metric, the strategy used on fold 0 and fold 1
    fold : numpy.ndarray            int64 (n,), victim k's fold (k mod 2)
    pseudo : dict[str, float]       per per-item metric, the fitted pseudo-values of "item"
    """

    victims: list[str]
    offsets: np.ndarray
    items: np.ndarray
    truth: np.ndarray
    values: np.ndarray
    attributes: np.ndarray
    weight: dict[str, np.ndarray]
    hits: dict[str, np.ndarray]
    choice: dict[str, tuple[str, str]]
    fold: np.ndarray
    pseudo: dict[str, float] = field(default_factory=dict)

    @functools.cached_property
    def _seg(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.victims)), np.diff(self.offsets))

    def problem(self, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The value problem of a per-item metric: (code of every row's truth (N,), rows counted
        (N,), allowed codes (H_m,)). Codes index :attr:`values` (-1 off the grid), except for
        ``rated_detection_accuracy``: 0 = unrated, 1 = rated."""
        if metric == "rated_detection_accuracy":
            return (self.truth > 0).astype(np.int64), np.ones(len(self.truth), bool), np.ones(2, bool)
        H = len(self.values)
        pos = np.clip(np.searchsorted(self.values, self.truth), 0, max(H - 1, 0))
        codes = np.where(self.values[pos] == self.truth, pos, -1) if H else np.full(len(self.truth), -1)
        if metric == "rated_rating_accuracy":
            return codes, (codes >= 0) & (self.truth > 0), self.values > 0
        return codes, codes >= 0, np.ones(H, bool)

    def predictive(self, metric: str, index: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Leave-victim-out predictive distribution (R, H_m) of the value of item ``items[r]`` for
        victim ``index[r]`` (positions in :attr:`victims`) in ``metric``'s value problem
        (:meth:`problem`), under the strategy chosen for the victim's fold: the other victims'
        marginal (Jeffreys-smoothed), or their counts on the item plus ``pseudo[metric]``
        pseudo-values drawn from that marginal. Its mode is the prior library's guess."""
        codes, use, allowed = self.problem(metric)
        H, n, seg = len(allowed), len(self.victims), self._seg
        own = np.bincount(seg[use] * H + codes[use], minlength=n * H).reshape(n, H).astype(float)
        g = (own.sum(axis=0)[None, :] - own + 0.5) * allowed
        g /= g.sum(axis=1, keepdims=True)
        out = g[index]
        strategy = np.array([self.choice[metric][f] for f in self.fold[index]]) if len(index) else np.empty(0, str)
        per_item = strategy == "item"
        if per_item.any():
            m = int(max(self.items.max(initial=0), items.max(initial=0))) + 1
            C = np.bincount(self.items[use] * H + codes[use], minlength=m * H).reshape(m, H).astype(float)
            cnt = C[items[per_item]] - self._own_counts(index[per_item], items[per_item], codes, use, H)
            cnt += self.pseudo[metric] * out[per_item]
            out[per_item] = cnt / cnt.sum(axis=1, keepdims=True)
        return out

    def _own_counts(
        self, index: np.ndarray, items: np.ndarray, codes: np.ndarray, use: np.ndarray, H: int
    ) -> np.ndarray:
        """One-hot (R, H) of victim ``index[r]``'s own counted code on ``items[r]`` (zero if not counted)."""
        seg = self._seg
        big = np.int64(max(int(self.items.max(initial=0)), int(items.max(initial=0))) + 1)
        keys = seg.astype(np.int64) * big + self.items
        order = np.argsort(keys, kind="stable")
        q = index.astype(np.int64) * big + items
        pos = np.minimum(np.searchsorted(keys[order], q), max(len(keys) - 1, 0))
        out = np.zeros((len(q), H))
        if not len(keys):
            return out
        row = order[pos]
        hit = (keys[row] == q) & use[row]
        out[np.flatnonzero(hit), codes[row[hit]]] = 1.0
        return out

    def attribute_shares(self, index: np.ndarray) -> np.ndarray:
        """Leave-victim-out share of 1 per dummy (R, p) for victims ``index`` under the strategy
        chosen for their fold: per column, or one share over every dummy ("global")."""
        X = self.attributes
        n, p = X.shape
        if p == 0 or n == 0:
            return np.zeros((len(index), p))
        others = max(n - 1, 1)
        col = (X.sum(axis=0)[None, :] - X[index] + 0.5) / (others + 1.0)
        glob = (X.sum() - X[index].sum(axis=1) + 0.5) / (others * p + 1.0)
        strategy = np.array([self.choice["attribute_accuracy"][f] for f in self.fold[index]])
        return np.where((strategy == "column")[:, None], col, glob[:, None])


def _uploads(transcript: Transcript) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(clients the server heard from by client_sort_key, offsets, items, true values) of every
    client's first upload."""
    if "server" not in transcript.parties:
        return [], np.zeros(1, np.int64), np.empty(0, np.int64), np.empty(0)
    private = private_payloads(transcript)
    first: dict[str, np.ndarray] = {}
    for m in transcript.messages:
        if m.kind != "grad_V" or m.receiver != "server" or m.sender in first or "items" not in m.payload:
            continue
        first[m.sender] = np.asarray(m.payload["items"], dtype=np.int64).reshape(-1)
    parties = sorted(first, key=client_sort_key)
    lengths = np.fromiter((len(first[p]) for p in parties), dtype=np.int64, count=len(parties))
    offsets = np.zeros(len(parties) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    items = np.concatenate([first[p] for p in parties]) if parties else np.empty(0, np.int64)
    truth = np.concatenate([true_ratings(private, p, first[p]) for p in parties]) if parties else np.empty(0)
    return parties, offsets, items, truth


def _value_grid(config: dict[str, Any], truth: np.ndarray) -> np.ndarray:
    """The rating hypotheses: the public grid of :func:`rating_domain` (0 included when unrated
    items are uploaded), or the observed values when the config lacks the scale."""
    try:
        lo, hi = rating_domain(config)
        step = float(config.get("rating_step", 1.0) or 1.0)
        grid = np.arange(lo, hi + step / 2, step)
    except (KeyError, TypeError, ValueError):
        grid = np.empty(0)
    return np.unique(np.concatenate([grid, truth])) if truth.size else grid


@per_transcript
def prior_table(transcript: Transcript) -> PriorTable:
    """The prior library: message-free strategies scored per victim, each metric's strategy
    chosen on held-out victims (:func:`privaudit.attacks.generic._uploads.cross_fit`: victims at even
    positions in client order are scored with the strategy best on the odd ones and vice versa;
    :attr:`PriorTable.fold` is 0 for the even positions).

    Strategies (each statistic from the OTHER victims' truth, leaving the victim out):

    - ratings (``rating_accuracy``, 0 = unrated counted as a value): the most frequent value over
      all uploaded items ("global"), or per item the most frequent value among the other users
      who uploaded it, with pseudo-ratings from the global marginal ("item"; their number fitted
      by leave-one-out likelihood on the population, :func:`_fit_pseudo`);
    - ``rated_rating_accuracy``: the same over the rated values of the rated items;
    - ``rated_detection_accuracy``: the more frequent of rated/unrated, globally or per item;
    - ``attribute_accuracy``: per dummy column its most frequent value ("column"), or the most
      frequent dummy value overall ("global").

    The statistics come from the truth in hindsight (an attacker with the population's
    published marginals does no better with a message-free guess); only the victim's own
    values are left out. Computed once per transcript (:func:`per_transcript`).
    """
    parties, offsets, items, truth = _uploads(transcript)
    private = private_payloads(transcript)
    n = len(parties)
    values = _value_grid(transcript.config, truth)
    seg = np.repeat(np.arange(n), np.diff(offsets))
    fold = np.arange(n) % 2
    m = int(items.max(initial=-1)) + 1
    table = PriorTable(parties, offsets, items, truth, values, np.zeros((n, 0)), {}, {}, {}, fold, {})

    def per_victim(x: np.ndarray) -> np.ndarray:
        return np.bincount(seg, weights=x.astype(float), minlength=n)

    per_strategy: dict[str, dict[str, np.ndarray]] = {}
    metrics = ("rating_accuracy", "rated_rating_accuracy") if len(values) else ()
    for metric in metrics + ("rated_detection_accuracy",):
        codes, use, allowed = table.problem(metric)
        H = len(allowed)
        own = np.bincount(seg[use] * H + codes[use], minlength=n * H).reshape(n, H).astype(float)
        gmarg = (own.sum(axis=0)[None, :] - own + 0.5) * allowed
        gmarg /= np.maximum(gmarg.sum(axis=1, keepdims=True), TINY)
        g_guess = np.argmax(np.where(allowed, gmarg, -np.inf), axis=1)[seg]
        C = np.bincount(items[use] * H + codes[use], minlength=max(m, 1) * H).reshape(-1, H).astype(float)
        cnt = C[items] if len(items) else np.zeros((0, H))
        mine = np.zeros_like(cnt)
        mine[np.flatnonzero(use), codes[use]] = 1.0
        a0 = table.pseudo[metric] = _fit_pseudo(cnt, mine, gmarg[seg], use)
        i_guess = np.argmax(np.where(allowed, cnt - mine + a0 * gmarg[seg], -np.inf), axis=1)
        scored = truth > 0 if metric == "rated_rating_accuracy" else np.ones(len(truth), bool)
        table.weight[metric] = per_victim(scored)
        per_strategy[metric] = {
            k: per_victim((v == codes) & scored) for k, v in (("global", g_guess), ("item", i_guess))
        }

    attrs = [np.asarray(private.get(p, {}).get("attributes", np.empty(0)), dtype=np.float64).ravel() for p in parties]
    widths = {a.size for a in attrs}
    X = np.stack(attrs) if attrs and len(widths) == 1 else np.zeros((n, 0))
    weight, hits, choice = table.weight, table.hits, table.choice
    if X.shape[1]:
        others = X.sum(axis=0)[None, :] - X  # other victims' ones per column
        col_guess = (others > (n - 1) / 2.0).astype(float)
        ones_all = X.sum() - X.sum(axis=1)
        glob_guess = (ones_all > (n - 1) * X.shape[1] / 2.0).astype(float)
        per_strategy["attribute_accuracy"] = {
            "global": np.sum(X == glob_guess[:, None], axis=1).astype(float),
            "column": np.sum(X == col_guess, axis=1).astype(float),
        }
        weight["attribute_accuracy"] = np.full(n, float(X.shape[1]))
    for metric, by in per_strategy.items():
        nums, chosen = cross_fit({k: {"hits": by[k]} for k in PRIOR_STRATEGIES[metric]}, "hits", weight[metric])
        choice[metric] = (chosen["even"], chosen["odd"])
        hits[metric] = nums["hits"]
    table.attributes = X
    return table


def prior_baselines(transcript: Transcript, table: PriorTable | None = None) -> dict[str, float]:
    """The prior library's accuracies (:func:`prior_table`): per metric, the message-free
    strategy chosen on held-out victims, scored on the victims it was not chosen on.

    Computed in hindsight from the other victims' truth (an upper bound of strategies built on
    published population marginals); ``attribute_accuracy`` is NaN without user attributes.
    """
    table = prior_table(transcript) if table is None else table
    nan = float("nan")
    out = {m: ratio(table.hits[m], table.weight[m]) if m in table.hits else nan for m in PRIOR_STRATEGIES}
    out["victims"] = float(len(table.victims))
    return out


class PopulationPrior:
    """What the MVMF attacks may know besides the messages: the public rating scale and the
    population's published marginals, as the prior library computes them (:func:`prior_table`,
    each victim left out of its own statistics). Built on first use (a noise-free run never
    reads it)."""

    def __init__(self, transcript: Transcript) -> None:
        self._transcript = transcript

    @functools.cached_property
    def table(self) -> PriorTable:
        return prior_table(self._transcript)

    def index(self, parties: list[str]) -> np.ndarray:
        """Positions of ``parties`` in :attr:`PriorTable.victims` (-1 for unknown parties)."""
        where = {p: k for k, p in enumerate(self.table.victims)}
        return np.fromiter((where.get(p, -1) for p in parties), dtype=np.int64, count=len(parties))


def population_prior(knowledge: dict[str, Any] | None) -> PopulationPrior | None:
    """The :class:`PopulationPrior` in an attack's knowledge, if any."""
    prior = (knowledge or {}).get("population")
    return prior if isinstance(prior, PopulationPrior) else None
