"""Shared pieces of the FedMVMF attacks: reading a server view, scoring, baselines.

Everything here relies only on the FedMVMF message kinds (the fedmvmf schema in :mod:`privaudit.schema`), so any conforming
transcript can be attacked:

- ``state`` (server -> server, round t): ``V`` (m x K) and ``P`` (p x K) as sent that round;
- ``grad_V`` (client:u -> server): ``items`` (int64, r) and ``values`` (r x K);
- ``grad_P`` (client:u -> server): ``values`` (p x K);
- ``private`` (client:u -> client:u, round 0): ``items``, ``ratings``, ``attributes``
  (ground truth, read only by scoring).

Scoring follows PrivMVMF paper eq. 43: the attacker clips ratings to the rating range
(InclUnc: ``[0, rating_max]``, 0 meaning unrated) and attributes to [0, 1], rounds, and the
accuracy is the fraction of exactly recovered values. For ObsOnly the rating accuracy runs
over the items the client uploaded (its rated items, plus any sampled virtual items, whose
truth is 0); for InclUnc over every uploaded item (unrated ones have truth 0), with the
accuracy on the truly rated items and of the rated/unrated decision reported beside it. A
reconstruction may carry its own guesses for those two (``rated``, ``rated_ratings``: each
metric's Bayes decision, :func:`victim_scores`).

The prior-only baseline is the prior library (:func:`prior_table`): message-free strategies,
each metric's chosen on held-out victims; the attacks' knowledge (:class:`PopulationPrior`)
holds the same population statistics for their posterior decoding.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privaudit.attacks._generic import cross_fit
from privaudit.attacks.base import Attack, Reconstruction
from privaudit.metrics import majority_guess_accuracy, uniform_guess_accuracy
from privaudit.models import mvmf
from privaudit.results import Decisions, MetricSpec, VictimTable
from privaudit.transcript import Transcript, View, is_client

_TINY = 1e-300
FEDMVMF_PROTOCOLS = ("fedmvmf", "privmvmf")
REQUIRED_CONFIG = ("K", "alpha", "lam", "update", "unrated", "n_items", "rating_min", "rating_max")


@dataclass
class ClientUploads:
    """One client's uploads, by round (sorted).

    Attributes
    ----------
    party : str
    rounds : list[int]
    items : list[numpy.ndarray]    # int64 (r_t,), the item ids sent in round t
    grad_V : list[numpy.ndarray]   # (r_t x K)
    grad_P : list[numpy.ndarray]   # (p x K)
    """

    party: str
    rounds: list[int] = field(default_factory=list)
    items: list[np.ndarray] = field(default_factory=list)
    grad_V: list[np.ndarray] = field(default_factory=list)
    grad_P: list[np.ndarray] = field(default_factory=list)


@dataclass
class FedMVMFView:
    """A FedMVMF server view in arrays.

    Attributes
    ----------
    config : dict                   public config (K, alpha, lam, w, eta, update, unrated, ...)
    V : dict[int, numpy.ndarray]    round -> item factors sent that round (m x K)
    P : dict[int, numpy.ndarray]    round -> attribute factors sent that round (p x K)
    clients : dict[str, ClientUploads]
    """

    config: dict[str, Any]
    V: dict[int, np.ndarray]
    P: dict[int, np.ndarray]
    clients: dict[str, ClientUploads]

    @property
    def rounds(self) -> list[int]:
        return sorted(set(self.V) & set(self.P))


def missing_config(view: View) -> list[str]:
    return [k for k in REQUIRED_CONFIG if k not in view.config]


def server_states(view: View) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Round -> ``V`` (m x K) and round -> ``P`` (p x K) from the view's ``state`` messages."""
    V: dict[int, np.ndarray] = {}
    P: dict[int, np.ndarray] = {}
    for m in view.select("state"):
        if "V" in m.payload:
            V[m.round] = np.asarray(m.payload["V"], dtype=np.float64)
        if "P" in m.payload:
            P[m.round] = np.asarray(m.payload["P"], dtype=np.float64)
    return V, P


def parse_view(view: View) -> FedMVMFView:
    """Collect the state and uploads of a FedMVMF server view.

    Only uploads of rounds for which the view also holds the server ``state`` are kept (an
    attack needs the V and P the client computed with). Plaintext uploads only: callers check
    :meth:`Attack.applicable` first.
    """
    V, P = server_states(view)
    per_round: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for m in view.messages:
        if m.kind not in ("grad_V", "grad_P") or not is_client(m.sender):
            continue
        slot = per_round.setdefault(m.sender, {}).setdefault(m.round, {})
        if m.kind == "grad_V":
            slot["items"] = np.asarray(m.payload["items"], dtype=np.int64)
            slot["grad_V"] = np.asarray(m.payload["values"], dtype=np.float64)
        else:
            slot["grad_P"] = np.asarray(m.payload["values"], dtype=np.float64)
    clients: dict[str, ClientUploads] = {}
    for party, rounds in per_round.items():
        up = ClientUploads(party)
        for r in sorted(rounds):
            slot = rounds[r]
            if r not in V or r not in P or "grad_V" not in slot or "grad_P" not in slot:
                continue
            up.rounds.append(r)
            up.items.append(slot["items"])
            up.grad_V.append(slot["grad_V"])
            up.grad_P.append(slot["grad_P"])
        if up.rounds:
            clients[party] = up
    return FedMVMFView(dict(view.config), V, P, clients)


_DOT_ROWS = 1 << 16  # uploaded rows concatenated at a time by RoundUploads.grad_V_dots


class RoundUploads:
    """All clients' uploads of one round, concatenated (CSR-like).

    Attributes
    ----------
    round : int
    users : numpy.ndarray     int64 (n,), indices into :attr:`FlatFedMVMFView.parties` (increasing)
    offsets : numpy.ndarray   int64 (n + 1,), rows of user k are ``offsets[k]:offsets[k + 1]``
    items : numpy.ndarray     int64 (N,), item id of each uploaded grad_V row
    grad_V : numpy.ndarray    (N x K), the uploaded grad_V rows, user after user
    grad_P : numpy.ndarray    (n x p x K)

    ``items``, ``grad_V`` and ``grad_P`` are either given or concatenated from the per-client
    payloads on first access (:func:`parse_view_flat`), so a round an attack never reads costs
    no concatenation.
    """

    def __init__(
        self,
        round: int,
        users: np.ndarray,
        offsets: np.ndarray,
        items: np.ndarray | None = None,
        grad_V: np.ndarray | None = None,
        grad_P: np.ndarray | None = None,
        *,
        payloads: tuple[list, list] | None = None,
        K: int | None = None,
    ) -> None:
        self.round = round
        self.users = users
        self.offsets = offsets
        self._payloads = payloads  # (grad_V payloads, grad_P payloads) of the clients in ``users`` order
        self._K = K
        if items is not None:
            self.items = items
        if grad_V is not None:
            self.grad_V = grad_V
        if grad_P is not None:
            self.grad_P = grad_P

    @functools.cached_property
    def items(self) -> np.ndarray:
        return np.concatenate([pv["items"] for pv in self._payloads[0]]).astype(np.int64, copy=False).reshape(-1)

    @functools.cached_property
    def grad_V(self) -> np.ndarray:
        return _concat_float_rows([pv["values"] for pv in self._payloads[0]], (self._K,))

    @functools.cached_property
    def grad_P(self) -> np.ndarray:
        arrays = [pp["values"] for pp in self._payloads[1]]
        if np.size(arrays[0]) == 0:  # no user attributes (p = 0): (n, 0, K)
            return np.zeros((len(arrays),) + np.shape(arrays[0]))
        return _concat_float_rows(arrays, np.shape(arrays[0]))

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def grad_V_dots(self, d: np.ndarray, seg: np.ndarray) -> np.ndarray:
        """``grad_V[e] . d[seg[e]]`` for every uploaded row e: (N,) float64.

        From :attr:`grad_V` when it is already concatenated or is a view of one buffer;
        otherwise (e.g. a transcript loaded from disk) the per-client rows are concatenated a
        block of clients at a time, so no (N x K) copy is made.
        """
        if "grad_V" in self.__dict__ or self._payloads is None:
            return mvmf.row_dots(self.grad_V, d, None, seg)
        arrays = [pv["values"] for pv in self._payloads[0]]
        if not arrays:
            return np.empty(0)
        view = _contiguous_view(arrays, (self._K,))
        if view is not None:
            return mvmf.row_dots(view, d, None, seg)
        out = np.empty(len(seg))
        lo = 0
        chunk = max(1, _DOT_ROWS * len(arrays) // max(len(seg), 1))  # clients per ~_DOT_ROWS rows
        for c in range(0, len(arrays), chunk):
            block = _concatenated(arrays[c : c + chunk], (self._K,))
            hi = lo + len(block)
            out[lo:hi] = mvmf.row_dots(block, d, None, seg[lo:hi])
            lo = hi
        return out

    @functools.cached_property
    def common_items(self) -> np.ndarray | None:
        """The item list (int64) if every client of the round sent the same one (InclUnc), else None.

        Checked by identity of the payload arrays first (a protocol sending one shared item array),
        else elementwise on the concatenated items.
        """
        n = len(self.users)
        if n == 0:
            return None
        if self._payloads is not None and "items" not in self.__dict__:
            first = self._payloads[0][0]["items"]
            if all(pv["items"] is first for pv in self._payloads[0]):
                return np.asarray(first, dtype=np.int64).reshape(-1)
        lengths = self.lengths
        L = int(lengths[0])
        if not np.all(lengths == L):
            return None
        items = self.items.reshape(n, L)
        return items[0] if np.all(items == items[0]) else None


@dataclass
class FlatFedMVMFView:
    """A FedMVMF server view as concatenated arrays (same content as :class:`FedMVMFView`).

    Attributes
    ----------
    config : dict
    V, P : dict[int, numpy.ndarray]   round -> factors sent that round (m x K), (p x K)
    parties : list[str]               clients with at least one usable round, by client_sort_key
    rounds : list[RoundUploads]       rounds holding the server state and some uploads, sorted
    """

    config: dict[str, Any]
    V: dict[int, np.ndarray]
    P: dict[int, np.ndarray]
    parties: list[str]
    rounds: list[RoundUploads]


def _concat_float_rows(arrays: list, tail: tuple) -> np.ndarray:
    """``np.concatenate`` of float arrays reshaped to ``(-1, *tail)``, without a copy when possible.

    A protocol typically records its uploads as consecutive slices of one batched array (e.g.
    ``rows[u]`` of an (n, m, K) tensor). When the arrays are C-contiguous float64 blocks that
    follow each other in memory inside one buffer, the result is a read-only view of that buffer
    (the bytes a copy would hold, :func:`_contiguous_view`); otherwise (noisy uploads,
    transcripts loaded from disk, a small total whose copy is cheaper than the check) one
    concatenation.
    """
    first = np.asarray(arrays[0])
    if first.size * len(arrays) >= 1 << 20:  # a small total: a copy costs less than checking the layout
        view = _contiguous_view(arrays, tail)
        if view is not None:
            return view
    return _concatenated(arrays, tail)


def _concatenated(arrays: list, tail: tuple) -> np.ndarray:
    """One float64 copy of ``arrays`` reshaped to ``(-1, *tail)`` and stacked."""
    return np.concatenate([np.asarray(a, dtype=np.float64).reshape((-1,) + tuple(tail)) for a in arrays], axis=0)


def _contiguous_view(arrays: list, tail: tuple) -> np.ndarray | None:
    """A read-only ``(-1, *tail)`` view of the buffer the float64 ``arrays`` lie in one after
    another (C-contiguous, adjacent, in order), or None."""
    first = np.asarray(arrays[0])
    root = first
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not (root.dtype == first.dtype == np.float64 and root.flags.c_contiguous and first.flags.c_contiguous):
        return None
    root_ptr = root.__array_interface__["data"][0]
    start = ptr = first.__array_interface__["data"][0]
    if (start - root_ptr) % 8:
        return None
    for a in arrays:
        if not (
            isinstance(a, np.ndarray)
            and a.dtype == np.float64
            and a.flags.c_contiguous
            and a.__array_interface__["data"][0] == ptr
        ):
            return None
        ptr += a.nbytes
    if not (root_ptr <= start and ptr <= root_ptr + root.nbytes):
        return None
    out = root.reshape(-1)[(start - root_ptr) // 8 : (ptr - root_ptr) // 8].reshape((-1,) + tuple(tail))
    out.flags.writeable = False
    return out


def parse_view_flat(view: View) -> FlatFedMVMFView:
    """Like :func:`parse_view`, but one concatenation per round (on first access) instead of per-client lists.

    Same selection rules: plaintext ``grad_V``/``grad_P`` uploads from ``client:*`` senders of
    rounds whose ``state`` (V and P) the view holds, only clients that sent both kinds that round
    (the last message wins if a client sent a kind twice).
    """
    V: dict[int, np.ndarray] = {}
    P: dict[int, np.ndarray] = {}
    gv: dict[int, dict[str, dict]] = {}
    gp: dict[int, dict[str, dict]] = {}
    for m in view.messages:
        kind = m.kind
        if kind == "grad_V" or kind == "grad_P":
            if is_client(m.sender):
                (gv if kind == "grad_V" else gp).setdefault(m.round, {})[m.sender] = m.payload
        elif kind == "state":
            if "V" in m.payload:
                V[m.round] = np.asarray(m.payload["V"], dtype=np.float64)
            if "P" in m.payload:
                P[m.round] = np.asarray(m.payload["P"], dtype=np.float64)
    both_by_round: dict[int, set[str]] = {}
    for r in sorted(set(V) & set(P) & set(gv) & set(gp)):
        both = gv[r].keys() & gp[r].keys()
        if both:
            both_by_round[r] = both
    # one sort of all senders (client_sort_key), then each round keeps that order
    parties = sorted(set().union(*both_by_round.values()), key=client_sort_key) if both_by_round else []
    index = {party: k for k, party in enumerate(parties)}
    rounds = []
    for r, both in both_by_round.items():
        who = parties if len(both) == len(parties) else [s for s in parties if s in both]
        users = (
            np.arange(len(parties), dtype=np.int64)
            if who is parties
            else np.fromiter((index[s] for s in who), dtype=np.int64, count=len(who))
        )
        pv, pp = gv[r], gp[r]
        gv_payloads = [pv[s] for s in who]
        lengths = np.fromiter((len(x["items"]) for x in gv_payloads), dtype=np.int64, count=len(who))
        offsets = np.zeros(len(who) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        rounds.append(RoundUploads(r, users, offsets, payloads=(gv_payloads, [pp[s] for s in who]), K=V[r].shape[1]))
    return FlatFedMVMFView(dict(view.config), V, P, parties, rounds)


def client_sort_key(party: str) -> tuple[int, str]:
    """Sort ``client:<k>`` ids numerically."""
    _, _, tail = party.partition(":")
    return (int(tail), party) if tail.isdigit() else (1 << 62, party)


def rating_domain(config: dict[str, Any]) -> tuple[float, float]:
    """(low, high) clipping range of guessed ratings: InclUnc admits 0 (= unrated)."""
    lo, hi = float(config["rating_min"]), float(config["rating_max"])
    sampled = any(d.get("name") == "sampling" for d in config.get("defenses", []) if isinstance(d, dict))
    if config.get("unrated") == "inclunc" or sampled:
        lo = 0.0
    return lo, hi


def round_ratings(values: np.ndarray, config: dict[str, Any]) -> np.ndarray:
    """Clip to the rating domain and round to the rating grid (step ``rating_step``, default 1)."""
    lo, hi = rating_domain(config)
    step = float(config.get("rating_step", 1.0) or 1.0)
    clipped = np.clip(np.nan_to_num(values, nan=lo), lo, hi)
    return np.clip(np.round(clipped / step) * step, lo, hi)


def round_attributes(values: np.ndarray) -> np.ndarray:
    """Clip dummies to [0, 1] and round."""
    return np.round(np.clip(np.nan_to_num(values, nan=0.0), 0.0, 1.0))


def private_payloads(transcript: Transcript) -> dict[str, dict[str, np.ndarray]]:
    """Every party's merged ``private`` payload, in one pass over the messages."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for m in transcript.messages:
        if m.kind == "private" and m.sender == m.receiver:
            out.setdefault(m.sender, {}).update(m.payload)
    return out


def _truth(transcript: Transcript | dict, party: str, items: np.ndarray) -> np.ndarray:
    """True ratings of ``party`` on ``items`` (0 for items it did not rate); ``transcript`` may be
    a :func:`private_payloads` map."""
    private = transcript.get(party, {}) if isinstance(transcript, dict) else transcript.private(party)
    rated = np.asarray(private.get("items", np.empty(0, np.int64)), dtype=np.int64)
    ratings = np.asarray(private.get("ratings", np.empty(0)), dtype=np.float64)
    order = np.argsort(rated)
    rated, ratings = rated[order], ratings[order]
    pos = np.searchsorted(rated, items)
    pos_c = np.minimum(pos, max(len(rated) - 1, 0))
    hit = (pos < len(rated)) & (rated[pos_c] == items) if len(rated) else np.zeros(len(items), bool)
    return np.where(hit, ratings[pos_c] if len(rated) else 0.0, 0.0)


def victim_scores(recon: Reconstruction, transcript: Transcript) -> tuple[list[str], dict, dict]:
    """Per-victim numerators and denominators of :func:`score_reconstruction`'s ratio metrics.

    Returns ``(victims, weight, hits)``: the reconstruction's victims sorted by
    :func:`client_sort_key` (n,), and per metric (n,) float arrays of scored values and of exact
    guesses (``rated_detection_accuracy`` counts correct rated/unrated decisions over all items).
    A victim's optional ``rated`` (bool) and ``rated_ratings`` arrays are its guesses for the
    rated/unrated decision and for the rating of an item known to be rated (each metric's own
    Bayes decision); without them both follow ``ratings`` (rated = guess > 0).
    """
    victims = sorted(recon.victims, key=client_sort_key)
    n = len(victims)
    names = ("rating_accuracy", "rated_rating_accuracy", "rated_detection_accuracy", "attribute_accuracy")
    weight = {m: np.zeros(n) for m in names}
    hits = {m: np.zeros(n) for m in names}
    for k, party in enumerate(victims):
        guess = recon.victims[party]
        items = np.asarray(guess.get("items", np.empty(0, np.int64)), dtype=np.int64)
        if len(items):
            truth = _truth(transcript, party, items)
            g = np.asarray(guess["ratings"], dtype=np.float64)
            g_rated = np.asarray(guess.get("rated_ratings", g), dtype=np.float64)
            decided = np.asarray(guess["rated"], dtype=bool) if "rated" in guess else g > 0
            rated = truth > 0
            hits["rating_accuracy"][k] = np.sum(g == truth)
            weight["rating_accuracy"][k] = weight["rated_detection_accuracy"][k] = len(items)
            hits["rated_rating_accuracy"][k] = np.sum(g_rated[rated] == truth[rated])
            weight["rated_rating_accuracy"][k] = rated.sum()
            hits["rated_detection_accuracy"][k] = np.sum(decided == rated)
        if "attributes" in guess:
            true_x = np.asarray(transcript.private(party).get("attributes", np.empty(0)), dtype=np.float64)
            gx = np.asarray(guess["attributes"], dtype=np.float64)
            if true_x.shape == gx.shape:
                hits["attribute_accuracy"][k] = np.sum(gx == true_x)
                weight["attribute_accuracy"][k] = gx.size
    return victims, weight, hits


def score_reconstruction(recon: Reconstruction, transcript: Transcript) -> dict[str, float]:
    """Rating and attribute accuracy (PrivMVMF paper eq. 43) over all attacked victims.

    Each victim's reconstruction holds ``items`` (the uploaded item ids it guessed),
    ``ratings`` (rounded guesses, 0 = unrated) and ``attributes`` (rounded dummies); the
    accuracies are the sums of :func:`victim_scores` over the victims.
    """
    victims, weight, hits = victim_scores(recon, transcript)
    order = ("rating_accuracy", "attribute_accuracy", "rated_rating_accuracy", "rated_detection_accuracy")
    out = {m: _ratio(hits[m], weight[m]) for m in order}
    out["victims"] = float(len(victims))
    if not transcript.config.get("attribute_names", True):  # a dataset without user attributes
        del out["attribute_accuracy"]
    return out


def _ratio(num: np.ndarray, den: np.ndarray) -> float:
    total = float(den.sum())
    return float(num.sum()) / total if total > 0 else float("nan")


def baselines(transcript: Transcript) -> dict[str, float]:
    """Random-guess and majority-class accuracies for ratings and attributes.

    The uniform guess draws from the value domain: the rating grid (with 0 added when unrated
    items are uploaded too, InclUnc or sampling) and {0, 1} for dummies. The majority guess
    always answers the most frequent true value (computed over all victims' uploaded items).
    """
    cfg = transcript.config
    lo, hi = rating_domain(cfg)
    step = float(cfg.get("rating_step", 1.0) or 1.0)
    domain = int(round((hi - lo) / step)) + 1
    server_view = transcript.view("server") if "server" in transcript.parties else None
    truths = []
    attrs = []
    if server_view is not None:
        seen: set[str] = set()
        for m in server_view.select("grad_V"):
            if m.sender in seen:
                continue
            seen.add(m.sender)
            if "items" in m.payload:
                truths.append(_truth(transcript, m.sender, np.asarray(m.payload["items"], dtype=np.int64)))
    for party in transcript.parties:
        if is_client(party):
            x = transcript.private(party).get("attributes")
            if x is not None:
                attrs.append(np.asarray(x, dtype=np.float64))
    nan = float("nan")
    all_truth = np.concatenate(truths) if truths else np.empty(0)
    all_attrs = np.concatenate(attrs) if attrs else np.empty(0)
    out = {
        "rating_accuracy": uniform_guess_accuracy(domain),
        "attribute_accuracy": uniform_guess_accuracy(2),
        "rating_accuracy_majority": majority_guess_accuracy(all_truth) if len(all_truth) else nan,
        "attribute_accuracy_majority": majority_guess_accuracy(all_attrs) if len(all_attrs) else nan,
    }
    if not cfg.get("attribute_names", True):  # a dataset without user attributes: no attribute metrics
        del out["attribute_accuracy"], out["attribute_accuracy_majority"]
    return out


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
    truth = np.concatenate([_truth(private, p, first[p]) for p in parties]) if parties else np.empty(0)
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


def prior_table(transcript: Transcript) -> PriorTable:
    """The prior library: message-free strategies scored per victim, each metric's strategy
    chosen on held-out victims (:func:`privaudit.attacks._generic.cross_fit`: victims at even
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
    values are left out.
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
        gmarg /= np.maximum(gmarg.sum(axis=1, keepdims=True), _TINY)
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
    out = {m: _ratio(table.hits[m], table.weight[m]) if m in table.hits else nan for m in PRIOR_STRATEGIES}
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


def rated_decisions(recon: Reconstruction, transcript: Transcript) -> dict[str, Decisions]:
    """Rated-vs-unrated decisions over every uploaded (victim, item): truth = really rated;
    ``groups`` is the victim's position in :func:`victim_scores`'s order (its VictimTable row).

    The score is the reconstruction's ``rated_score`` (the attack's log-likelihood ratio of
    "rated" over "unrated") where present, else its 0/1 decision (guessed rating > 0). Empty
    when every uploaded item is rated (ObsOnly without sampling: nothing to decide).
    """
    labels, scores, groups = [], [], []
    private = private_payloads(transcript)
    for k, party in enumerate(sorted(recon.victims, key=client_sort_key)):
        guess = recon.victims[party]
        items = np.asarray(guess.get("items", np.empty(0, np.int64)), dtype=np.int64)
        if not len(items):
            continue
        labels.append(_truth(private, party, items) > 0)
        groups.append(np.full(len(items), k, dtype=np.int64))
        s = guess.get("rated_score")
        decided = (np.asarray(guess["ratings"]) > 0).astype(float)
        scores.append(np.asarray(s, dtype=np.float64) if s is not None else decided)
    if not labels:
        return {}
    y, s = np.concatenate(labels), np.nan_to_num(np.concatenate(scores), nan=0.0, posinf=1e300, neginf=-1e300)
    if y.all() or not y.any():
        return {}
    return {
        "rated": Decisions(
            s, y, positive="really rated item", meta={"attack": recon.attack}, groups=np.concatenate(groups)
        )
    }


MVMF_METRIC_SPECS = {
    "rating_accuracy": MetricSpec(
        True, True, "fraction", "share of uploaded items whose rating (0 = unrated) is guessed exactly"
    ),
    "attribute_accuracy": MetricSpec(True, True, "fraction", "share of user attribute dummies guessed exactly"),
    "rated_rating_accuracy": MetricSpec(
        True, True, "fraction", "share of really rated uploaded items whose rating is guessed exactly"
    ),
    "rated_detection_accuracy": MetricSpec(
        True, True, "fraction", "share of uploaded items correctly decided rated or unrated"
    ),
    "victims": MetricSpec(True, False, "count", "number of clients attacked"),
}


class MVMFAttack(Attack):
    """Base of the FedMVMF/PrivMVMF server attacks: what they target and how they are scored
    (eq. 43 through :func:`score_reconstruction`, baselines through :func:`baselines` and
    :func:`prior_baselines`, rated/unrated decisions through :func:`rated_decisions`)."""

    party = "server"
    protocols = FEDMVMF_PROTOCOLS
    primary_metric = "rating_accuracy"
    metric_specs = MVMF_METRIC_SPECS

    def applicable(self, view: View) -> tuple[bool, str]:
        return super().applicable(view)  # the base rule: every kind of ``requires``, in plaintext

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        return score_reconstruction(reconstruction, transcript)

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        return baselines(transcript)

    def prior_knowledge(self, transcript: Transcript, rng: np.random.Generator) -> dict[str, Any]:
        """The population's published marginals (:class:`PopulationPrior`, built on first use)."""
        return {"population": PopulationPrior(transcript)}

    def _prior_table(self, transcript: Transcript, knowledge: dict[str, Any] | None) -> PriorTable:
        prior = population_prior(knowledge)
        return prior.table if prior is not None and prior._transcript is transcript else prior_table(transcript)

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """The prior library, chosen on held-out victims (:func:`prior_baselines`; hindsight marginals)."""
        return prior_baselines(transcript, self._prior_table(transcript, knowledge))

    def victim_table(
        self, reconstruction: Reconstruction, transcript: Transcript, knowledge: dict[str, Any]
    ) -> VictimTable | None:
        """Per-victim parts of :meth:`score`'s accuracies and of :meth:`prior_baseline`'s.

        Holds the metrics whose per-victim denominators agree between the two (the attack scored
        each victim's first upload). With a victim subsample (``mvmf-nonlinear``'s ``users``) the
        prior's rows are those of the attacked victims, so ``value(m, "prior")`` is the prior on
        them (``prior_baseline`` covers every client). None when a victim is not a client the
        prior covers.
        """
        victims, weight, hits = victim_scores(reconstruction, transcript)
        table = self._prior_table(transcript, knowledge)
        where = {p: k for k, p in enumerate(table.victims)}
        if not victims or any(p not in where for p in victims):
            return None
        idx = np.fromiter((where[p] for p in victims), dtype=np.int64, count=len(victims))
        scored = set(weight) if transcript.config.get("attribute_names", True) else set(weight) - {"attribute_accuracy"}
        keep = [m for m in table.hits if m in scored and np.array_equal(weight[m], table.weight[m][idx])]
        if not keep:
            return None
        return VictimTable(
            victims,
            {m: weight[m] for m in keep},
            {m: hits[m] for m in keep},
            {m: table.hits[m][idx] for m in keep},
        )

    def decisions(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, Decisions]:
        return rated_decisions(reconstruction, transcript)
