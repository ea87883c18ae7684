"""Reading a FedMVMF server view for the FedMVMF attacks, and the ground truth they are scored on.

Relies only on the FedMVMF message kinds (the fedmvmf schema), so any conforming transcript
can be attacked:

- ``state`` (server -> server, round t): ``V`` (m x K) and ``P`` (p x K) as sent that round;
- ``grad_V`` (client:u -> server): ``items`` (int64, r) and ``values`` (r x K);
- ``grad_P`` (client:u -> server): ``values`` (p x K);
- ``private`` (client:u -> client:u, round 0): ``items``, ``ratings``, ``attributes``
  (ground truth, read only by scoring).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from privaudit.models import mvmf
from privaudit.transcript import Transcript, View, is_client

TINY = 1e-300
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


_T = TypeVar("_T")


def per_transcript(fn: Callable[[Transcript], _T]) -> Callable[[Transcript], _T]:
    """``fn(transcript)`` computed once per transcript object: the attacks evaluated on one run
    (mvmf-aggregate, mvmf-analytic, mvmf-nonlinear in an audit) share it. The result is kept for
    the last two transcripts while they are alive and unchanged (same message count and last
    message, as the transcript's own index checks); callers must not modify it."""
    memo: dict[int, tuple[Any, int, Any, Any]] = {}

    @functools.wraps(fn)
    def cached(transcript: Transcript) -> _T:
        msgs = transcript.messages
        last = msgs[-1] if msgs else None
        hit = memo.get(id(transcript))
        if hit is not None and hit[0]() is transcript and hit[1] == len(msgs) and hit[2] is last:
            return hit[3]
        out = fn(transcript)
        for key in [k for k, v in memo.items() if v[0]() is None]:
            del memo[key]
        while len(memo) >= 2:
            del memo[next(iter(memo))]
        memo[id(transcript)] = (weakref.ref(transcript), len(msgs), last, out)
        return out

    cached.uncached = fn  # type: ignore[attr-defined]
    return cached


def private_payloads(transcript: Transcript) -> dict[str, dict[str, np.ndarray]]:
    """Every party's merged ``private`` payload, in one pass over the messages."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for m in transcript.messages:
        if m.kind == "private" and m.sender == m.receiver:
            out.setdefault(m.sender, {}).update(m.payload)
    return out


def true_ratings(transcript: Transcript | dict, party: str, items: np.ndarray) -> np.ndarray:
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


def ratio(num: np.ndarray, den: np.ndarray) -> float:
    total = float(den.sum())
    return float(num.sum()) / total if total > 0 else float("nan")
