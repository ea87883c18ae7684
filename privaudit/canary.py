"""Empirical epsilon from randomized canaries in one protocol run.

Steinke, Nasr and Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023): m
canaries, each included independently with probability 1/2 (bit S_i = +1 / -1); the protocol
runs ONCE on the data with the included canaries; an attack on the server's view guesses the
bits of the k canaries it is most confident are included and the k it is most confident are
not (it abstains on the rest). If the mechanism is (epsilon, delta)-DP with respect to one
canary's bit, the number W of correct guesses among r guesses satisfies (their Theorem 3.1)

    P[W >= v] <= f(v) + 2 m delta max_{i=1..v} (f(v - i) - f(v)) / i,
    f(v) = P[Binomial(r, e^eps / (1 + e^eps)) >= v]

(pure epsilon: delta = 0, W is dominated by that binomial). :func:`one_run_epsilon` returns the
largest epsilon this rejects at the stated confidence (scipy's binomial tail and ``brentq``).
The guess counts k are a fixed menu (:data:`GUESS_FRACTIONS`), each scored at
``(1 - confidence) / len(menu)`` (a union bound), so that picking the best k costs no validity.

FedMVMF canaries (:class:`FedMVMFCanaries`): ``m`` canary users appended to the dataset, each
with no attributes and two ratings, of the two canary items of its group (canary items no real
user rated, no item features). Its bit swaps them: item a at the top of the scale and item b at
the bottom (S = +1) or the reverse. A canary user thus rates the same item ids either way (the
rated item ids are not noised by any value-noising defense, so an add/remove canary would be
read off them); the bit replaces its rating values. That is the relation ``dp-laplace`` and
``dp-gaussian`` claim (a joint clip of a client's round bounds ANY change of its values by the
sensitivity 2C), so the bound is compared with their epsilon as it is. :func:`claim_relation`
reads the relation of a claim; a canary that replaces is halved only against an add/remove
claim (an (epsilon, delta) add/remove mechanism is (2 epsilon, (1 + e^epsilon) delta) for
replacing, group privacy). :func:`ceiling` is the largest bound m canaries can give.

The guesser reads only the server's view: the recorded broadcasts (V, P), each canary client's
uploaded grad_V rows of its canary items and its grad_P, and the public defense config. From
the public state it computes what the canary would upload under either bit (SemiALS, the
protocol's own equations), clips it as the defense declares, and scores the noisy upload by the
log-likelihood ratio of the two (Laplace: L1, Gaussian: L2), summed over the recorded rounds.
It is given which clients and items are canaries (the auditor inserted them), never the bits;
the bits are scored outside it. When the run's claim, projected from the public config before
the run, is above the ceiling, the canary run is one epoch (at K = 1, with 10,000 canaries) and is
tested against the per-round claim (:func:`round_claim`): ``"tested": "first round"``. Against
an L2 clip (``dp-gaussian``) at K = 1 each canary rates 16 items (8 high, 8 low, swapped by the
bit) instead of two: its upload reaches the clip and, where the bit flips the sign of its user
vector, the two clipped uploads are 0.83 x 2C apart (:meth:`FedMVMFCanaries.for_defenses`).

:func:`planted_control` is the planted-signal control of a DP cell: the cell's config and noise
on data with planted canary users, an attack evaluated on it and scored on them (does it find a
leak larger than the margin through the mechanism?).

FedNCF canaries (:class:`FedNCFCanaries`, ``dp-sgd``, neighbour "instance": one training
instance replaced, the instance count public): the bit picks which of two canary items is a
training positive and which the held-out item, so the negatives' distribution and the count are
the same either way; the canary client's initial user vector is crafted (large), so a positive's
clipped gradient lies mostly on its item row, along h * u in GMF; the guesser reads the
uploaded item-row changes. FedProto canaries (:class:`FedProtoCanaries`, ``dp-prototypes``,
neighbour "user" added or removed in a silo): one-entry extreme rows in crafted silos, the
canary run at s = 1; the guesser reads the released prototypes. FedProto under dp-laplace /
dp-gaussian (:class:`FedProtoSiloCanaries`, a client's whole upload replaced): one-user canary
silos. :data:`KITS` lists each protocol's kits and :func:`canary_kit` picks the one whose
``covers`` names the defense; :func:`canary_audit` refuses the others.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit.errors import PrivauditError

#: per direction, guess this fraction of the canaries (a fixed menu, union-bounded)
GUESS_FRACTIONS = (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)
#: canary users per canary audit run and canary items they share
DEFAULT_CANARIES = 200
#: FedMVMF canary users, the canary items they rate (in groups of CANARY_PER_USER: half A, half
#: B) and the canary items in all: 3,000 two-item canaries flag a 4x-too-small dp-laplace noise
#: in 9 of 10 seeds where 1,000 eight-item canaries flag it in 7 and 1,000 two-item ones in 6
#: (benchmarks/canary_power.py, docs/canaries.md)
MVMF_CANARIES = 3000
CANARY_PER_USER = 2
CANARY_ITEMS = 16
#: the FedMVMF design against an L2 clip (dp-gaussian) at K = 1 (FedMVMFCanaries.for_defenses): 16 canary items per canary user (8 rated
#: high, 8 low, swapped by the bit) in 16 groups. The Gaussian likelihood ratio depends only on the
#: L2 distance of the two clipped uploads, not on how many coordinates carry it; 16 ratings lift
#: the upload to the clip C (two ratings stay below it: median distance 0.38 of the sensitivity
#: 2C), and when the bit flips the sign of the canary's user vector (K = 1, about a third of the
#: groups) the two clipped uploads are 0.83 x 2C apart, the most two positive rating vectors allow.
#: A 4x-too-small dp-gaussian noise is flagged in 10 of 10 seeds where the two-item design flagged
#: 1 of 10 (benchmarks/canary_power.py, docs/canaries.md)
L2_CANARY_PER_USER = 16
L2_CANARY_ITEMS = 256
#: the largest epsilon the root search reports (all guesses right among thousands)
EPSILON_CAP = 50.0
#: record every round of the canary run when it has at most this many rated entries x epochs
RECORD_ALL_BUDGET = 2_000_000
#: canary users of a planted-signal control run (:func:`planted_control`) and its bootstrap draws
PLANTED_CANARIES = 200
PLANTED_BOOTSTRAP = 2000

__all__ = [
    "one_run_epsilon",
    "guess",
    "canary_bound",
    "FedMVMFCanaries",
    "canary_kit",
    "claim_relation",
    "ceiling",
    "at_ceiling",
    "canary_sentence",
    "canary_audit",
    "plan_run",
    "planted_control",
    "planted_sentence",
]


# ------------------------------------------------------------------------------ the bound


def _binom_sf(k: Any, r: int, p: float) -> Any:
    """P[Binomial(r, p) > k] (1 for k < 0), scipy's ``bdtrc`` ufunc."""
    from scipy.special import bdtrc

    k = np.asarray(k, dtype=float)
    return np.where(k < 0, 1.0, bdtrc(np.maximum(k, 0.0), r, p))


def _tail_bound(eps: float, r: int, v: int, m: int, delta: float) -> float:
    """Theorem 3.1's bound on P[W >= v] for an (eps, delta)-DP mechanism."""
    p = 1.0 / (1.0 + math.exp(-eps))
    total = float(_binom_sf(v - 1, r, p))
    if delta > 0:
        i = np.arange(1, v + 1)
        total += 2.0 * m * delta * float(np.max((_binom_sf(v - i - 1, r, p) - _binom_sf(v - 1, r, p)) / i))
    return total


def one_run_epsilon(guesses: int, correct: int, canaries: int, delta: Any = 0.0, confidence: float = 0.95) -> float:
    """Lower bound on epsilon from ``correct`` right guesses out of ``guesses`` on ``canaries``
    randomized canaries (module docstring): the epsilon at which Theorem 3.1's tail bound on
    P[W >= correct] equals ``1 - confidence``; 0.0 when even epsilon = 0 explains the count.

    ``delta``: a float, or a callable of epsilon (a delta that grows with epsilon, e.g. by
    group privacy)."""
    r, v, m = int(guesses), int(correct), int(canaries)
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= correct ({v}) <= guesses ({r}) <= canaries ({m})")
    if callable(delta):
        return _root(r, v, m, delta, float(confidence))
    return _cached_root(r, v, m, float(delta), float(confidence))


@functools.lru_cache(maxsize=4096)
def _cached_root(r: int, v: int, m: int, delta: float, confidence: float) -> float:
    return _root(r, v, m, delta, confidence)


def _root(r: int, v: int, m: int, delta: Any, confidence: float) -> float:
    from scipy.optimize import brentq

    beta = 1.0 - confidence
    if v == 0:
        return 0.0

    def gap(eps: float) -> float:
        d = delta(eps) if callable(delta) else delta
        return math.log(max(_tail_bound(eps, r, v, m, d), 1e-300)) - math.log(beta)

    if gap(0.0) >= 0:
        return 0.0
    if gap(EPSILON_CAP) < 0:
        return EPSILON_CAP
    return float(brentq(gap, 0.0, EPSILON_CAP, xtol=1e-6))


def guess(scores: Any, k: int) -> np.ndarray:
    """+1 for the ``k`` highest scores, -1 for the ``k`` lowest, 0 (abstain) elsewhere; (m,) int8."""
    s = np.asarray(scores, dtype=float).ravel()
    k = int(min(max(k, 0), s.size // 2))
    out = np.zeros(s.size, dtype=np.int8)
    order = np.argsort(s, kind="stable")
    if k:
        out[order[-k:]] = 1
        out[order[:k]] = -1
    return out


def canary_bound(
    scores: Any,
    bits: Any,
    delta: float = 0.0,
    confidence: float = 0.95,
    fractions: Sequence[float] = GUESS_FRACTIONS,
    replace: bool = False,
) -> dict[str, Any]:
    """The one-run bound of a guesser's ``scores`` (m,) (higher = included) against the canaries'
    ``bits`` (m,) (True / +1 = included), best over the menu ``fractions`` at ``confidence``
    (each k scored at ``(1 - confidence) / len(fractions)``).

    ``delta``: the delta of the claim tested. ``replace``: the bit replaces one unit by
    another while the claim is for adding or removing one: the bound is computed for the
    replace relation at delta (1 + e^(eps/2)) delta and halved (group privacy).

    Returns ``{"epsilon_lb", "canaries", "guesses", "correct", "confidence"}``."""
    s = np.asarray(scores, dtype=float).ravel()
    b = np.asarray(bits).ravel()
    b = np.where(b.astype(float) > 0, 1, -1)
    if s.size != b.size:
        raise ValueError(f"canary_bound: {s.size} scores but {b.size} bits")
    m = int(s.size)
    out: dict[str, Any] = {"epsilon_lb": 0.0, "canaries": m, "guesses": 0, "correct": 0, "confidence": confidence}
    if m < 2:
        return out
    level = 1.0 - (1.0 - confidence) / len(fractions)
    d_of = (lambda eps: (1.0 + math.exp(eps / 2.0)) * delta) if replace and delta > 0 else delta
    for frac in fractions:
        g = guess(s, max(1, int(round(frac * m))))
        r = int(np.count_nonzero(g))
        v = int(np.sum(g == b))
        eps = one_run_epsilon(r, v, m, d_of, level)
        if replace:
            eps /= 2.0
        if eps > out["epsilon_lb"] or out["guesses"] == 0:
            out.update({"epsilon_lb": eps, "guesses": r, "correct": v})
    return out


# ------------------------------------------------------------------------------ datasets


def append_canaries(
    dataset: Any, rows: np.ndarray, cols: np.ndarray, values: np.ndarray, times: np.ndarray, new_items: int
) -> Any:
    """``dataset`` with ``rows.max() + 1`` canary users and ``new_items`` canary items appended:
    canary ``rows[e]`` (0-based among the canaries) rates item ``cols[e]`` (a dataset column,
    new ones from ``n_items``) with ``values[e]`` at ``times[e]`` (offset from the dataset's
    earliest timestamp); canaries have no attributes, canary items no features."""
    from privaudit.data.dataset import RatingsDataset

    n, n_items = dataset.n_users, dataset.n_items
    m, c = int(np.max(rows)) + 1, int(new_items)
    shape = (m, n_items + c)
    extra = sp.csr_matrix((np.asarray(values, dtype=np.float64), (rows, cols)), shape=shape)
    base = sp.hstack([dataset.ratings, sp.csr_matrix((n, c))], format="csr")
    ratings = sp.vstack([base, extra], format="csr")
    timestamps = None
    if dataset.timestamps is not None:
        t0 = int(dataset.timestamps.data.min()) if dataset.timestamps.nnz else 0
        ts_base = sp.hstack([dataset.timestamps, sp.csr_matrix((n, c), dtype=np.int64)], format="csr")
        ts = t0 + np.asarray(times, dtype=np.int64)
        ts_extra = sp.csr_matrix((ts, (rows, cols)), shape=shape)
        timestamps = sp.vstack([ts_base, ts_extra], format="csr")
        timestamps.sort_indices()
    p, q = dataset.user_attributes.shape[1], dataset.item_features.shape[1]
    return RatingsDataset(
        name=dataset.name,
        ratings=ratings,
        user_attributes=np.vstack([dataset.user_attributes, np.zeros((m, p))]),
        attribute_names=list(dataset.attribute_names),
        item_features=np.vstack([dataset.item_features, np.zeros((c, q))]),
        feature_names=list(dataset.feature_names),
        user_ids=np.concatenate([np.asarray(dataset.user_ids).astype(str), [f"canary-{k}" for k in range(m)]]),
        item_ids=np.concatenate([np.asarray(dataset.item_ids).astype(str), [f"canary-item-{k}" for k in range(c)]]),
        timestamps=timestamps,
        user_region=np.concatenate([dataset.user_region, np.full(m, -1, dtype=np.int64)]),
        rating_min=dataset.rating_min,
        rating_max=dataset.rating_max,
        rating_step=dataset.rating_step,
    )


# ------------------------------------------------------------------------------ FedMVMF


@dataclass
class FedMVMFCanaries:
    """Canary users for FedMVMF (module docstring): insertion, the guesser, the scoring.

    The ``items`` canary items (no real user rates them) form groups of ``per_user``; canary user
    k rates every item of group k mod (items / per_user), whose first half is A and second half
    B. Its bit picks which half gets the top rating and which the bottom one: S = +1 rates A high
    and B low, S = -1 the reverse. The rated-item set, and so the item ids of its uploads, is
    the same either way; only its rating values change: the relation the clipped mechanisms
    state (``dp-laplace`` / ``dp-gaussian``: everything a client sends in a round is clipped
    jointly, so ANY change of its values moves the release by at most the sensitivity 2C;
    neighbour "rating": one client's rating values replaced, its item set kept, or "user" with
    ``dense``). A replacement: the bound is not halved for them (:func:`claim_relation`).

    Why a swap of two: with one canary rating, or every rating moved the same way, SemiALS makes
    the upload a multiple of one direction (u grows with the ratings), so both bits clip to
    nearly the same vector; the swap moves u, and every uploaded row with it, elsewhere, and two
    rows keep the difference on few coordinates, where the Laplace likelihood ratio reaches its
    extremes (``docs/canaries.md``: measured against eight items per canary)."""

    canaries: int = MVMF_CANARIES
    items: int = CANARY_ITEMS
    #: canary items each canary user rates (a group of the canary items: half A, half B)
    per_user: int = CANARY_PER_USER
    #: the design used against an L2 clip (:meth:`for_defenses`): items, and items per canary user
    l2_items: int = L2_CANARY_ITEMS
    l2_per_user: int = L2_CANARY_PER_USER
    #: the clip norm of the defense the canaries test (1: L1, dp-laplace; 2: L2, dp-gaussian)
    norm: int = 1
    #: the bit replaces the canary's ratings (a replacement: halved only for an add/remove claim)
    replace = True
    #: the DP defenses whose neighbour relation these canaries instantiate
    covers = ("dp-laplace", "dp-gaussian")
    #: a run whose projected epsilon is above the ceiling is replaced by its first round alone,
    #: at K = 1 (one float per uploaded row: the canaries' difference on two coordinates) with
    #: more canaries (one round is cheap): 4x-too-small dp-laplace noise at epsilon 0.3 per round
    #: is flagged in 9 of 10 seeds with 10,000 canaries, 6 of 10 with 3,000 (docs/canaries.md)
    first_round = True
    first_round_canaries: int = 10_000

    def for_defenses(self, defenses: Sequence[Any], config: Mapping[str, Any] | None = None) -> None:
        """Pick the design for the defenses' clip norm and the canary run's ``config``: an L2 clip
        (``clip_ord`` 2) at K = 1 takes the ``l2_*`` design (many ratings per canary: its upload
        reaches the clip, the Gaussian ratio reads the whole L2 distance, and where the bit flips
        the sign of the one-float user vector the two uploads are 0.83 x 2C apart); an L1 clip, or
        K > 1 (no sign flip, and two ratings already reach the clip: 0.66 x 2C apart at K = 20;
        the two-rating design is cheaper to record), the two-rating one (the Laplace ratio needs
        the difference on few coordinates)."""
        norm = max((int(getattr(d, "clip_ord", 1) or 1) for d in defenses), default=1)
        one_float = config is None or int(config.get("K", 1)) == 1
        self.norm = 2 if norm == 2 and one_float else 1

    def design(self) -> tuple[int, int]:
        """(canary items, canary items per canary user) of the design in use (:meth:`for_defenses`)."""
        if self.norm == 2:
            return int(self.l2_items), int(self.l2_per_user)
        return int(self.items), int(self.per_user)

    @staticmethod
    def first_round_config(config: Mapping[str, Any]) -> dict[str, Any]:
        """The config of a first-round canary run: one epoch at K = 1. The per-round claim of a
        clipped mechanism (sensitivity 2C, whatever the client sends) does not depend on K."""
        return {**dict(config), "epochs": 1, "K": 1}

    def insert(self, dataset: Any, rng: np.random.Generator) -> tuple[Any, dict[str, Any]]:
        """The dataset with ``canaries`` users and ``items`` items appended, and the canary
        record ``{"users": (m,) dataset indices, "items": (c,) canary items, "half": (c,) bool
        (True: half A), "bits": (m,) bool, "high", "low"}``."""
        n, n_items = dataset.n_users, dataset.n_items
        m = int(self.canaries)
        c, g = self.design()
        if g < 2 or g % 2 or c % g:
            raise PrivauditError(f"FedMVMF canaries: per_user ({g}) must be even, >= 2 and divide items ({c})")
        bits = rng.random(m) < 0.5
        hi, lo = float(dataset.rating_max), float(dataset.rating_min)
        items = n_items + np.arange(c)
        half = np.arange(c) % g < g // 2
        group = np.arange(m) % (c // g)
        rows = np.repeat(np.arange(m), g)
        pos = (group[:, None] * g + np.arange(g)[None, :]).ravel()
        values = np.where(np.repeat(bits, g) == half[pos], hi, lo)
        augmented = append_canaries(dataset, rows, items[pos], values, np.zeros(m * g, dtype=np.int64), c)
        users = np.arange(n, n + m)
        record = {
            "users": users,
            "items": items,
            "half": half,
            "group": group,
            "per_user": g,
            "bits": bits,
            "high": hi,
            "low": lo,
        }
        return augmented, record

    def config(self, config: Mapping[str, Any], n_ratings: int) -> dict[str, Any]:
        """The protocol config of the canary run: every round recorded when that stays small."""
        cfg = dict(config)
        if int(n_ratings) * int(cfg.get("epochs", 1)) <= RECORD_ALL_BUDGET:
            cfg["record_rounds"] = -1
        return cfg

    def locate(self, record: Mapping[str, Any], model: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(canary positions kept, their client indices, the transcript index of every canary
        item, -1 for a cold one): canaries that the split made cold users upload nothing and
        are dropped, and so is every canary when the split left no warm item in one of the
        halves (the split does not depend on the bits)."""
        train_users = np.asarray(model["train_users"])
        train_items = np.asarray(model["train_items"])
        u_pos = np.searchsorted(train_users, record["users"])
        i_pos = np.searchsorted(train_items, record["items"])
        ok_u = (u_pos < train_users.size) & (train_users[np.minimum(u_pos, train_users.size - 1)] == record["users"])
        ok_i = (i_pos < train_items.size) & (train_items[np.minimum(i_pos, train_items.size - 1)] == record["items"])
        half = np.asarray(record["half"], dtype=bool)
        g = int(record.get("per_user", self.design()[1]))
        groups = np.arange(half.size) // g
        usable = np.array(
            [(ok_i & half)[groups == k].any() and (ok_i & ~half)[groups == k].any() for k in range(half.size // g)]
        )
        keep = np.flatnonzero(ok_u & usable[np.asarray(record["group"])])
        return keep, u_pos[keep], np.where(ok_i, i_pos, -1)

    def score(self, result: Any, record: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, int]:
        """(guesser scores, the bits of the canaries scored, rounds observed) of a canary run;
        the bits are read from ``record`` here, outside the guesser."""
        keep, clients, items = self.locate(record, result.model)
        scores, rounds = self.scores(
            result.transcript,
            clients,
            items,
            np.asarray(record["half"]),
            record["high"],
            record["low"],
        )
        return scores, record["bits"][keep], rounds

    def planted_victims(self, result: Any, record: Mapping[str, Any]) -> list[str]:
        """The party ids of the canaries a run kept (the planted signal of
        :func:`planted_control`)."""
        _, clients, _ = self.locate(record, result.model)
        return [f"client:{int(c)}" for c in clients]

    @staticmethod
    def expected(V: np.ndarray, P: np.ndarray, rows: Sequence[Mapping[int, float]], cfg: Mapping[str, Any]):
        """What a client with no attributes and the ratings ``{item: value}`` of each entry of
        ``rows`` uploads under the state (V, P), before any defense (SemiALS, one batched
        solve with the protocol's own equations): per entry, its grad_V rows (items in
        ascending order) and its grad_P, flattened into one vector."""
        from privaudit.models import mvmf

        r_idx = np.concatenate([np.full(len(r), k) for k, r in enumerate(rows)])
        cols = np.concatenate([np.array(sorted(r), dtype=np.int64) for r in rows])
        vals = np.concatenate([np.array([r[j] for j in sorted(r)], dtype=np.float64) for r in rows])
        shape = (len(rows), V.shape[0])
        R = sp.csr_matrix((vals, (r_idx, cols)), shape=shape)
        W = sp.csr_matrix((np.ones(vals.size), (r_idx, cols)), shape=shape)
        R.sort_indices()
        W.sort_indices()
        X = np.zeros((len(rows), P.shape[0]))
        alpha = float(cfg["alpha"])
        A, b = mvmf.normal_equations(V, P, X, R, W, alpha, float(cfg["lam"]), float(cfg["w"]), cfg["unrated"])
        U = mvmf.solve_users(A, b)
        coef = mvmf.entry_coefficients(U, V, R, W)
        owner = np.repeat(np.arange(len(rows)), np.diff(R.indptr))
        grad_rows = coef[:, None] * U[owner]
        gP = mvmf.grad_P(U, P, X, alpha).reshape(len(rows), -1)
        parts = np.split(grad_rows, R.indptr[1:-1])
        return [np.concatenate([part.ravel(), gP[k]]) for k, part in enumerate(parts)]

    @staticmethod
    def clipped(x: np.ndarray, K: int, defense: Mapping[str, Any] | None, n_rows: int | None = None) -> np.ndarray:
        """``x`` (the client's grad_V rows, K floats each, then its grad_P; or one client per row of a
        2-D array) clipped as the public
        ``defense`` entry declares: ``clip_per="user"`` (the default) the whole vector jointly,
        ``"upload"`` the first ``n_rows`` K-blocks (the grad_V message) and the rest (grad_P)
        each on its own, ``"row"`` every K-block."""
        if not defense or "clip" not in defense:
            return x
        from privaudit.defenses.dp_laplace import clip_rows

        order = 2 if "gaussian" in str(defense.get("name", "")) or "sgd" in str(defense.get("name", "")) else 1
        clip = float(defense["clip"])
        per = defense.get("clip_per", "user")
        X = np.atleast_2d(np.asarray(x, dtype=np.float64))  # one client per row
        if per == "row":
            out = clip_rows(X.reshape(-1, K), clip, order).reshape(X.shape)
        elif per == "upload":
            cut = K * (X.shape[1] // K if n_rows is None else int(n_rows))
            out = np.concatenate([clip_rows(X[:, :cut], clip, order), clip_rows(X[:, cut:], clip, order)], axis=1)
        else:
            out = clip_rows(X, clip, order)
        return out.reshape(np.shape(x))

    @classmethod
    def scores(
        cls,
        transcript: Any,
        clients: np.ndarray,
        items: np.ndarray,
        half: np.ndarray,
        high: float,
        low: float,
        only_round: int | None = None,
        distances: list | None = None,
    ) -> tuple[np.ndarray, int]:
        """The guesser: per canary client (its index in the transcript; ``items``: the canary
        items' transcript indices, -1 if cold; ``half``: which are in half A), the
        log-likelihood ratio of its uploads (grad_V rows of the canary items it uploaded, and
        its grad_P) between the uploads it would make with S = +1 and with S = -1, computed
        from the recorded V, P and clipped as the public defense config declares, under
        Laplace noise (L1 distances) or Gaussian noise (L2), summed over the recorded rounds;
        (scores (m,), rounds used). The noise scale is not needed (it only scales the ratio).
        Reads only the server's view. ``distances``: a list that receives, per canary and
        round, the distance of its two clipped uploads in the clip's norm (L1 for Laplace, L2
        for Gaussian) over the clip C (the sensitivity is 2; benchmarks/canary_power.py
        ``--distances``)."""
        cfg = transcript.config
        defense = next((d for d in cfg.get("defenses") or [] if isinstance(d, Mapping) and "clip" in d), None)
        laplace = defense is None or "laplace" in str(defense.get("name", ""))
        states = {m.round: m.payload for m in transcript.messages if m.kind == "state"}
        want = {f"client:{c}": k for k, c in enumerate(clients)}
        in_a = {int(j): bool(h) for j, h in zip(items, half) if j >= 0}
        seen: dict[int, dict[int, dict[str, np.ndarray]]] = {}
        for msg in transcript.messages:
            if msg.kind not in ("grad_V", "grad_P") or msg.sender not in want:
                continue
            k = want[msg.sender]
            values = np.asarray(msg.payload["values"], dtype=np.float64)
            part = seen.setdefault(msg.round, {}).setdefault(k, {})
            if msg.kind == "grad_V":
                ids = np.asarray(msg.payload["items"])
                at = np.array([i for i, j in enumerate(ids.tolist()) if j in in_a], dtype=np.int64)
                order = at[np.argsort(ids[at], kind="stable")]
                part["ids"] = ids[order]
                part["grad_V"] = values[order].ravel()
            else:
                part["grad_P"] = np.ravel(values)
        out = np.zeros(len(clients))
        used = 0
        for t, got in sorted(seen.items()):
            if t not in states or (only_round is not None and t != only_round):
                continue
            V, P = np.asarray(states[t]["V"], dtype=np.float64), np.asarray(states[t]["P"], dtype=np.float64)
            K = V.shape[1]
            ks = [k for k, parts in got.items() if "grad_V" in parts and parts["ids"].size]
            if not ks:
                continue
            rows = []
            for k in ks:
                ids = got[k]["ids"]
                rows.append({int(j): (high if in_a[int(j)] else low) for j in ids})
                rows.append({int(j): (low if in_a[int(j)] else high) for j in ids})
            raw = cls.expected(V, P, rows, cfg)
            used += 1
            by_rows: dict[int, list[int]] = {}
            for n, k in enumerate(ks):
                by_rows.setdefault(int(got[k]["ids"].size), []).append(n)
            for n_rows, idx in by_rows.items():  # canaries uploading as many rows: one batch
                e1 = cls.clipped(np.stack([raw[2 * n] for n in idx]), K, defense, n_rows)
                e0 = cls.clipped(np.stack([raw[2 * n + 1] for n in idx]), K, defense, n_rows)
                width = e1.shape[1] - n_rows * K
                x = np.stack(
                    [
                        np.concatenate([got[ks[n]]["grad_V"], got[ks[n]].get("grad_P", np.full(width, np.nan))])
                        for n in idx
                    ]
                )
                ok = ~np.isnan(x)
                x = np.where(ok, x, 0.0)
                if laplace:
                    llr = np.abs(x - e0) - np.abs(x - e1)
                else:
                    llr = (x - (e1 + e0) / 2.0) * (e1 - e0)
                if distances is not None and defense:
                    gap = np.linalg.norm(e1 - e0, ord=1 if laplace else 2, axis=1)
                    distances.extend((gap / float(defense["clip"])).tolist())
                out[[ks[n] for n in idx]] += np.sum(np.where(ok, llr, 0.0), axis=1)
        return out, used


# ------------------------------------------------------------------------------ FedNCF


@dataclass
class FedNCFCanaries:
    """Replace-one-instance canaries for FedNCF under ``dp-sgd`` (module docstring).

    Canary user k has three interactions with the canary items of its group g = k mod
    ``groups`` (A_g, B_g, C_g, unrated by real users), timestamped A < X < Y: its bit sets
    X = B_g, Y = C_g (S = +1) or X = C_g, Y = B_g (S = -1). Leave-one-out holds Y out, so
    the canary trains on the positives {A_g, X}, its negatives are drawn from the same
    items either way (all but A_g, B_g, C_g) and its instance count is the same: the bit
    replaces one training instance (the positive on B_g by one on C_g), ``dp-sgd``'s
    neighbour relation (its epsilon is already for replacement: no halving)."""

    canaries: int = 400  # 200 flag a 10x-too-small noise only at the margin (docs/canaries.md)
    groups: int = 4
    replace = False
    #: the DP defenses whose neighbour relation these canaries instantiate
    covers = ("dp-sgd",)
    #: every coordinate of a canary client's initial user vector
    user_scale: float = 10.0
    #: global rounds of the canary run (each canary trains once per global round)
    global_rounds: int = 1

    def insert(self, dataset: Any, rng: np.random.Generator) -> tuple[Any, dict[str, Any]]:
        """The dataset with the canaries appended and ``{"users", "a", "b", "c", "bits"}``
        ((m,) dataset indices of the canary users and of their group's items A, B, C)."""
        if dataset.timestamps is None:  # zeros: leave-one-out then breaks real users' ties as without
            import dataclasses

            ts = sp.csr_matrix(dataset.ratings, dtype=np.int64, copy=True)
            ts.data[:] = 0
            dataset = dataclasses.replace(dataset, timestamps=ts)
        n, n_items = dataset.n_users, dataset.n_items
        m, g = int(self.canaries), int(self.groups)
        bits = rng.random(m) < 0.5
        group = np.arange(m) % g
        a, b, c = n_items + 3 * group, n_items + 3 * group + 1, n_items + 3 * group + 2
        x, y = np.where(bits, b, c), np.where(bits, c, b)
        rows = np.repeat(np.arange(m), 3)
        cols = np.column_stack([a, x, y]).ravel()
        times = np.tile(np.arange(3, dtype=np.int64), m)
        value = float(dataset.rating_max)
        augmented = append_canaries(dataset, rows, cols, np.full(rows.size, value), times, 3 * g)
        return augmented, {"users": np.arange(n, n + m), "a": a, "b": b, "c": c, "bits": bits}

    def config(self, config: Mapping[str, Any], n_ratings: int) -> dict[str, Any]:
        """The canary run: ``global_rounds`` passes (at most the cell's), every round recorded,
        leave-one-out by timestamp (ties among the canaries' three are impossible)."""
        cfg = dict(config)
        cfg["global_rounds"] = int(min(int(cfg.get("global_rounds", 1)), self.global_rounds))
        cfg["record_rounds"] = -1
        return cfg

    def protocol(self, protocol_cls: type, config: Mapping[str, Any], record: dict[str, Any]) -> Any:
        """The protocol with the canary clients' initial user vectors set to ``user_scale`` in
        every coordinate (recorded as ``record["u"]``): a large u puts most of a positive's
        clipped gradient on its item row, along h * u (GMF); DP-SGD's guarantee holds for any
        initial state."""
        from privaudit.models import ncf

        Dt = ncf.item_dim(config["model"], int(config["D"]))
        record["u"] = np.full(Dt, float(self.user_scale))
        return protocol_cls(user_vectors=(record["users"], np.tile(record["u"], (len(record["users"]), 1))))

    def score(self, result: Any, record: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, int]:
        """(guesser scores, bits, rounds observed); the bits are read here, outside the guesser."""
        scores, rounds = self.scores(
            result.transcript, record["users"], record["a"], record["b"], record["c"], record.get("u")
        )
        return scores, record["bits"], rounds

    @staticmethod
    def canary_epsilon(defenses: Sequence[Any], result: Any, record: Mapping[str, Any]) -> float | None:
        """The accounted epsilon of the canary clients themselves (``dp-sgd``'s own RDP
        accounting for their instance count and the rounds they uploaded in): the claim each
        canary's bit is tested against, at most the run's worst-case ``privacy_spent``."""
        from privaudit.defenses.dp_sgd import REPLACE_SENSITIVITY, rdp_epsilon

        dp = [d for d in defenses if hasattr(d, "noise_multiplier") and hasattr(d, "local_training")]
        if not dp:
            return None
        cfg = result.transcript.config
        want = {f"client:{int(v)}" for v in record["users"]}
        counts: dict[str, int] = {}
        for msg in result.transcript.messages:
            if msg.kind == "item_update" and msg.sender in want:
                counts[msg.sender] = counts.get(msg.sender, 0) + 1
        rounds = max(counts.values(), default=0)
        n = 2 * (1 + int(cfg["negatives"]))  # two training positives and their negatives
        B, E = int(cfg["batch_size"]), int(cfg["local_epochs"])
        steps = rounds * E * math.ceil(n / B)
        return float(
            sum(
                rdp_epsilon(float(d.noise_multiplier) / REPLACE_SENSITIVITY, min(1.0, B / n), steps, float(d.delta))
                for d in dp
            )
        )

    @staticmethod
    def scores(
        transcript: Any, users: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray, u: Any = None
    ) -> tuple[np.ndarray, int]:
        """The guesser: per canary client, summed over its recorded ``item_update`` uploads,
        <d_B - d_C, w> with d_j its uploaded change of item row j and w the direction of a
        positive's step on an item row: in GMF the gradient is (sigmoid - 1) h * u (h the
        output weights of that round's broadcast ``state``, u the canary's crafted initial
        vector), so Adam moves the row along h * u; without u, or for MLP / NeuMF, w = d_A
        (the other positive's row moves the same way). Reads only the uploads, the broadcast
        state and the canary's construction."""
        want = {f"client:{int(v)}": k for k, v in enumerate(users)}
        gmf = transcript.config.get("model") == "gmf" and u is not None
        D = int(transcript.config.get("D", 0))
        heads = {
            msg.round: np.asarray(msg.payload["network"], dtype=np.float64)[:D]
            for msg in transcript.messages
            if msg.kind == "state"
        }
        out = np.zeros(len(users))
        rounds: set[int] = set()
        for msg in transcript.messages:
            if msg.kind != "item_update" or msg.sender not in want or (gmf and msg.round not in heads):
                continue
            k = want[msg.sender]
            ids = np.asarray(msg.payload["items"])
            values = np.asarray(msg.payload["values"], dtype=np.float64)
            pos = {int(j): np.flatnonzero(ids == j) for j in (a[k], b[k], c[k])}
            if any(not p.size for p in pos.values()):
                continue
            da, db, dc = (values[pos[int(j)][0]] for j in (a[k], b[k], c[k]))
            w = heads[msg.round] * np.asarray(u, dtype=np.float64) if gmf else da
            out[k] += float(np.dot(db - dc, w))
            rounds.add(int(msg.round))
        return out, len(rounds)


# ------------------------------------------------------------------------------ FedProto


@dataclass
class FedProtoCanaries:
    """Add/remove-one-user canaries for FedProto under ``dp-prototypes`` (module docstring).

    The canary run is on a crafted dataset (DP is a claim for every dataset): H zip silos
    (regions 0..H-1), each of ``fillers`` filler users (empty rows) and ``per_silo`` canary
    slots; slot j of every silo is an extreme row, the
    top rating on canary item j, present (S = +1) or absent (S = -1): exactly
    ``dp-prototypes``' neighbour (one user's row added or removed in a silo). The silo always
    keeps its fillers, so no silo appears or vanishes with the bits, and the mechanism always
    releases k prototypes. The run uses ``s = 1`` (a one-entry row is then a whole row's worth
    of the mechanism's sensitivity: with s non-zeros allowed, the noise per entry is
    calibrated to s entries and a one-entry canary moves 1/s of it) and no held-out ratings;
    the mechanism, its epsilon and its other parameters are the cell's."""

    canaries: int = 64
    per_silo: int = 2  # at s = 1 a cluster releases one entry: more canaries per silo collide
    fillers: int = 2
    replace = False
    #: the DP defenses whose neighbour relation these canaries instantiate
    covers = ("dp-prototypes",)

    def insert(self, dataset: Any, rng: np.random.Generator) -> tuple[Any, dict[str, Any]]:
        """The crafted dataset (only the included canaries and the fillers; ``dataset`` gives the
        rating scale) and ``{"silo", "item", "bits"}`` per canary ((m,) each)."""
        from privaudit.data.dataset import RatingsDataset

        m, j, f = int(self.canaries), int(self.per_silo), int(self.fillers)
        H = -(-m // j)
        bits = rng.random(m) < 0.5
        silo, item = np.arange(m) // j, np.arange(m) % j
        keep = np.flatnonzero(bits)
        region = np.concatenate([np.repeat(np.arange(H), f), silo[keep]])
        n = region.size
        hi = float(dataset.rating_max)
        rows = np.arange(H * f, n)
        ratings = sp.csr_matrix((np.full(rows.size, hi), (rows, item[keep])), shape=(n, j))
        crafted = RatingsDataset(
            name=dataset.name,
            ratings=ratings,
            user_attributes=np.zeros((n, 0)),
            attribute_names=[],
            item_features=np.zeros((j, 0)),
            feature_names=[],
            user_ids=np.array([f"canary-user-{k}" for k in range(n)]),
            item_ids=np.array([f"canary-item-{k}" for k in range(j)]),
            timestamps=None,
            user_region=region.astype(np.int64),
            rating_min=dataset.rating_min,
            rating_max=dataset.rating_max,
            rating_step=dataset.rating_step,
        )
        return crafted, {"silo": silo, "item": item, "bits": bits}

    def config(self, config: Mapping[str, Any], n_ratings: int) -> dict[str, Any]:
        """The canary run: zip silos (the crafted regions), ``s = 1``, no held-out ratings."""
        cfg = dict(config)
        cfg.update(silos="zip", s=1, test_users=0.0)
        return cfg

    def score(self, result: Any, record: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, int]:
        """(guesser scores, bits, 1); the bits are read here, outside the guesser."""
        return self.scores(result.transcript, record["silo"], record["item"]), record["bits"], 1

    @staticmethod
    def scores(transcript: Any, silo: np.ndarray, item: np.ndarray) -> np.ndarray:
        """The guesser: per canary, the largest entry at its canary item over its silo's
        released prototypes (what the server receives from ``client:<silo>``): an included
        canary's cluster sum carries the top rating there, before the support selection and
        the Laplace noise; the silo's other (mostly empty) clusters release noise only."""
        protos = {
            msg.sender: np.asarray(msg.payload["prototypes"], dtype=np.float64)
            for msg in transcript.messages
            if msg.kind == "prototypes"
        }
        out = np.zeros(len(silo))
        for k, (h, j) in enumerate(zip(silo, item)):
            P = protos.get(f"client:{int(h)}")
            if P is not None:
                out[k] = float(P[:, int(j)].max())
        return out


@dataclass
class FedProtoSiloCanaries:
    """Replace-one-client canaries for FedProto under ``dp-laplace`` / ``dp-gaussian``, whose
    unit is a client's whole upload (here a silo's prototypes; neighbour "user": that client's
    data replaced by any other). Each canary is a silo of one user (exact prototypes: the row
    itself), one top rating of canary item 0 (S = +1) or of item 1 (S = -1): once clipped to C
    the two uploads are C e_0 and C e_1, 2C apart in L1 (the Laplace mechanism's whole
    sensitivity; sqrt(2) C in L2). The claim is already for replacement: no halving. The guesser
    scores the noisy upload by the likelihood ratio of the two clipped uploads (Laplace: L1,
    Gaussian: L2), reading only the ``prototypes`` messages and the public defense config."""

    canaries: int = DEFAULT_CANARIES
    replace = False
    covers = ("dp-laplace", "dp-gaussian")

    def insert(self, dataset: Any, rng: np.random.Generator) -> tuple[Any, dict[str, Any]]:
        """The crafted dataset (one user per canary silo, two items) and ``{"bits"}``."""
        from privaudit.data.dataset import RatingsDataset

        m = int(self.canaries)
        bits = rng.random(m) < 0.5
        ratings = sp.csr_matrix((np.full(m, float(dataset.rating_max)), (np.arange(m), np.where(bits, 0, 1))), (m, 2))
        crafted = RatingsDataset(
            name=dataset.name,
            ratings=ratings,
            user_attributes=np.zeros((m, 0)),
            attribute_names=[],
            item_features=np.zeros((2, 0)),
            feature_names=[],
            user_ids=np.array([f"canary-user-{k}" for k in range(m)]),
            item_ids=np.array(["canary-item-0", "canary-item-1"]),
            timestamps=None,
            user_region=np.arange(m, dtype=np.int64),
            rating_min=dataset.rating_min,
            rating_max=dataset.rating_max,
            rating_step=dataset.rating_step,
        )
        return crafted, {"bits": bits, "high": float(dataset.rating_max)}

    def config(self, config: Mapping[str, Any], n_ratings: int) -> dict[str, Any]:
        """The canary run: zip silos (one per canary), exact prototypes, no held-out ratings."""
        cfg = dict(config)
        cfg.update(silos="zip", test_users=0.0, prototypes="exact")
        return cfg

    def score(self, result: Any, record: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, int]:
        """(guesser scores, bits, 1); the bits are read here, outside the guesser."""
        return self.scores(result.transcript, len(record["bits"]), record["high"]), record["bits"], 1

    @staticmethod
    def scores(transcript: Any, m: int, high: float) -> np.ndarray:
        """Per canary silo h, the log-likelihood ratio (up to the noise scale) of its noisy
        upload between the clipped uploads of a top rating of item 0 and of item 1."""
        cfg = transcript.config
        defense = next((d for d in cfg.get("defenses") or [] if isinstance(d, Mapping) and "clip" in d), None)
        laplace = defense is None or "laplace" in str(defense.get("name", ""))
        e1 = FedMVMFCanaries.clipped(np.array([high, 0.0]), 2, defense)
        e0 = FedMVMFCanaries.clipped(np.array([0.0, high]), 2, defense)
        protos = {
            msg.sender: np.asarray(msg.payload["prototypes"], dtype=np.float64).ravel()
            for msg in transcript.messages
            if msg.kind == "prototypes"
        }
        out = np.zeros(m)
        for h in range(m):
            x = protos.get(f"client:{h}")
            if x is None or x.size != 2:
                continue
            if laplace:
                out[h] = float(np.sum(np.abs(x - e0) - np.abs(x - e1)))
            else:
                out[h] = float(np.dot(x - (e1 + e0) / 2.0, e1 - e0))
        return out


#: protocol name -> its canary kits (one per neighbour relation)
KITS: dict[str, tuple[type, ...]] = {
    "fedmvmf": (FedMVMFCanaries,),
    "fedncf": (FedNCFCanaries,),
    "fedproto": (FedProtoCanaries, FedProtoSiloCanaries),
}


def canary_kit(protocol: str, defense: str | None = None) -> Any | None:
    """The canary kit of ``protocol`` (for the DP defense named ``defense``, when given: None if
    the kit's ``covers`` does not list it), or None when it has none."""
    for cls in KITS.get(protocol, ()):
        if defense is None or defense in (getattr(cls, "covers", None) or (defense,)):
            return cls()
    return None


def claimed_privacy(privacy: Mapping[str, Any]) -> tuple[float, float, str] | None:
    """(accounted epsilon, its delta, neighbour relation) of a run's DP defenses: the PLD
    epsilon when the defense reports one (``epsilon_pld`` at ``delta_pld``), else its
    ``epsilon`` at its ``delta``, summed over the DP defenses; None without a DP defense."""
    claims = [v for v in (privacy or {}).values() if isinstance(v, Mapping) and "epsilon" in v]
    if not claims:
        return None
    eps, delta, neighbour = 0.0, 0.0, "rating"
    for c in claims:
        if "epsilon_pld" in c and "delta_pld" in c:
            eps += float(c["epsilon_pld"])
            delta = max(delta, float(c["delta_pld"]))
        else:
            eps += float(c["epsilon"])
            delta = max(delta, float(c.get("delta", 0.0) or 0.0))
        unit = str(c.get("unit", ""))
        neighbour = str(c.get("neighbour") or ("user" if "user" in unit else neighbour))
    return eps, delta, neighbour


def _projected_epsilon(defenses: Sequence[Any], config: Mapping[str, Any], protocol_cls: type) -> float | None:
    """The total epsilon the DP defenses will account over the releases the protocol declares
    for ``config`` (:meth:`~privaudit.protocols.base.Protocol.release_count`), from their own
    accountant before the run; None when a defense cannot say (no ``total_epsilon``, a
    calibrated ``target_epsilon``) or the protocol declares no release count."""
    rounds = protocol_cls.release_count(dict(config)) or 0
    total = 0.0
    dp = [d for d in defenses if hasattr(d, "total_epsilon") and getattr(d, "strength", None)]
    if not dp or rounds <= 0:
        return None
    for d in dp:
        if float(d.config.get("target_epsilon", 0.0) or 0.0) > 0:
            return None
        total += float(d.total_epsilon(float(d.config[d.strength]), rounds))
    return total


def round_claim(privacy: Mapping[str, Any]) -> tuple[float, float] | None:
    """(epsilon, delta) of one round of the run's DP defenses (``epsilon_per_round`` summed; a
    Laplace defense's round is pure: delta 0, a Gaussian one's at its ``delta``); None when a
    DP defense does not report it."""
    claims = [v for v in (privacy or {}).values() if isinstance(v, Mapping) and "epsilon" in v]
    if not claims or any("epsilon_per_round" not in c for c in claims):
        return None
    eps = sum(float(c["epsilon_per_round"]) for c in claims)
    delta = max(0.0 if "noise_scale" in c else float(c.get("delta", 0.0) or 0.0) for c in claims)
    return eps, delta


def claim_relation(privacy: Mapping[str, Any]) -> str:
    """How the run's DP claim relates neighbouring datasets: "add/remove" when a DP defense
    says so (its ``relation``, or a ``unit`` naming a unit "added or removed"), else
    "replace" (dp-laplace, dp-gaussian and dp-sgd state replacement: their sensitivity 2C
    is the distance between any two clipped inputs). A canary whose bit replaces one unit by
    another tests a replace claim directly; only an add/remove claim needs the bound halved
    (group privacy: a replacement is a removal and an addition)."""
    for v in (privacy or {}).values():
        if not isinstance(v, Mapping) or "epsilon" not in v:
            continue
        stated = str(v.get("relation", "")).lower()
        unit = str(v.get("unit", "")).lower()
        if stated in ("add/remove", "add-remove", "addremove") or "added or removed" in unit or "add/remove" in unit:
            return "add/remove"
    return "replace"


def ceiling(
    canaries: int,
    delta: float = 0.0,
    confidence: float = 0.95,
    fractions: Sequence[float] = GUESS_FRACTIONS,
    halved: bool = False,
) -> float:
    """The largest bound ``canaries`` canaries can give: every canary guessed right at the
    largest guess count of the menu (:func:`canary_bound`'s own computation on perfect
    scores). A bound at its ceiling says only "at least this": the guesser was never wrong."""
    m = int(canaries)
    if m < 2:
        return 0.0
    bits = np.where(np.arange(m) % 2 == 0, 1, -1)
    return float(canary_bound(bits.astype(float), bits, delta, confidence, fractions, halved)["epsilon_lb"])


def at_ceiling(audit: Mapping[str, Any] | None) -> bool:
    """A canary audit whose every canary was guessed right (the bound is its ceiling)."""
    if not isinstance(audit, Mapping) or "epsilon_lb" not in audit:
        return False
    m, r, v = int(audit.get("canaries", 0)), int(audit.get("guesses", 0)), int(audit.get("correct", 0))
    if m >= 2 and r == v == 2 * (m // 2):
        return True
    top = audit.get("ceiling")
    return top is not None and float(audit["epsilon_lb"]) >= float(top) - 1e-9 and float(top) > 0


def canary_sentence(audit: Mapping[str, Any] | None) -> str | None:
    """One plain sentence on a canary audit: "all 176 canaries distinguished: ε_lb at its
    ceiling 3.64 (claimed ε 33.25)", "all 88 guesses right on 176 canaries: ε_lb 2.90 (...)",
    "ε_lb 0.89 from 43 of 44 guesses on 176 canaries (ceiling 3.64; claimed ε 8.33)"; None
    without a usable audit."""
    if not isinstance(audit, Mapping) or "epsilon_lb" not in audit:
        return None
    lb, eps = float(audit["epsilon_lb"]), float(audit.get("epsilon", math.nan))
    m = int(audit.get("canaries", 0))
    top = audit.get("ceiling")
    top = (
        ceiling(m, float(audit.get("delta", 0.0) or 0.0), float(audit.get("confidence", 0.95))) if top is None else top
    )
    claimed = f"claimed ε {eps:.2f}" if math.isfinite(eps) else "no claimed ε"
    if audit.get("tested") == "first round":
        claimed += " for its first round"
    r, v = int(audit.get("guesses", 0)), int(audit.get("correct", 0))
    if at_ceiling(audit):
        return f"all {m} canaries distinguished: ε_lb at its ceiling {float(top):.2f} ({claimed})"
    if r and v == r:
        return f"all {r} guesses right on {m} canaries: ε_lb {lb:.2f} (ceiling {float(top):.2f}; {claimed})"
    return (
        f"ε_lb {lb:.2f} from {int(audit.get('correct', 0))} of {int(audit.get('guesses', 0))} guesses on "
        f"{m} canaries (ceiling {float(top):.2f}; {claimed})"
    )


def plan_run(
    kit: Any, protocol_cls: type, config: Mapping[str, Any], defenses: Sequence[Any], canaries: int | None = None
) -> tuple[dict[str, Any], str]:
    """Set up ``kit`` (its canary count and design) for a canary run of ``protocol_cls`` with
    ``config`` and the ``defenses`` objects: (the run's resolved config, "run" or "first
    round"). When the run's claim, projected before the run from the public config, is above
    the ceiling of the canaries, the kit runs the first round alone (``first_round_config``)
    with ``first_round_canaries``; ``canaries`` overrides the count."""
    base = protocol_cls.resolve_config(dict(config))
    tested = "run"
    projected = _projected_epsilon(defenses, base, protocol_cls)
    count = kit.canaries if canaries is None else int(canaries)
    if getattr(kit, "first_round", False) and projected is not None and projected > ceiling(count):
        # the run's claim is above anything the canaries can show (decided before the run, from
        # the public config): a one-round canary run, tested against the per-round claim
        tested = "first round"
        base = protocol_cls.resolve_config(kit.first_round_config(base))
        count = kit.first_round_canaries if canaries is None else count
    kit.canaries = int(count)
    if hasattr(kit, "for_defenses"):
        kit.for_defenses(defenses, base)
    return base, tested


def canary_audit(
    protocol_cls: type,
    config: Mapping[str, Any],
    defense_specs: Sequence[tuple[type, Mapping[str, Any]]],
    dataset: Any,
    seed: int,
    canaries: int | None = None,
    confidence: float = 0.95,
    names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One canary run of ``protocol_cls`` with ``defense_specs`` at ``seed`` and its one-run
    bound next to the claim it tests: ``{"epsilon_lb", "epsilon", "delta", "neighbour",
    "canaries", "guesses", "correct", "confidence", "rounds_observed", "tested", "relation",
    "halved", "ceiling"}``, and ``"epsilon_canaries"`` (the canaries' own accounted epsilon) when
    the kit computes one. ``tested``: "run" (``epsilon``/``delta``: the run's accounted claim) or
    "first round" (the run's claim projected above the ceiling: a one-epoch canary run against
    the per-round claim)."""
    from privaudit import runner

    defense_name = (names or [""])[0] or (getattr(defense_specs[0][0], "name", None) if defense_specs else None)
    kit = canary_kit(protocol_cls.name, defense_name or None)
    if kit is None:
        raise PrivauditError(f"no canary audit for protocol {protocol_cls.name!r} with defense {defense_name!r}")
    defenses = [cls(**dict(params)) for cls, params in defense_specs]
    base, tested = plan_run(kit, protocol_cls, config, defenses, canaries)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xCA7A]))
    augmented, record = kit.insert(dataset, rng)
    cfg = kit.config(base, augmented.n_ratings)
    protocol = kit.protocol(protocol_cls, cfg, record) if hasattr(kit, "protocol") else protocol_cls()
    result = protocol.run(augmented, cfg, defenses, int(seed))
    privacy = runner.defense_privacy(defenses, result.transcript, names)
    claim = claimed_privacy(privacy)
    if claim is None:
        raise PrivauditError("the canary audit needs a DP defense that reports privacy_spent")
    eps, delta, neighbour = claim
    relation = claim_relation(privacy)
    halve = bool(kit.replace) and relation == "add/remove"
    scores, bits, rounds = kit.score(result, record)
    if tested == "first round" and round_claim(privacy) is not None:
        eps, delta = round_claim(privacy)  # one round: a Laplace round is pure (delta 0)
    bound = canary_bound(scores, bits, delta=delta, confidence=confidence, replace=halve)
    extra = {}
    if hasattr(kit, "canary_epsilon"):
        own = kit.canary_epsilon(defenses, result, record)
        if own is not None:
            extra["epsilon_canaries"] = own
    return {
        "epsilon_lb": float(bound["epsilon_lb"]),
        "epsilon": float(eps),
        "delta": float(delta),
        "neighbour": neighbour,
        "canaries": int(bound["canaries"]),
        "guesses": int(bound["guesses"]),
        "correct": int(bound["correct"]),
        "confidence": float(confidence),
        "rounds_observed": int(rounds),
        "tested": tested,
        "relation": relation,
        "halved": halve,
        "ceiling": ceiling(int(bound["canaries"]), delta=delta, confidence=confidence, halved=halve),
        **extra,
    }


# ------------------------------------------------------------------------------ planted-signal control


def _planted_advantage(table: Any, rows: np.ndarray, metric: str) -> float:
    """The attack's advantage over the best message-free guess (the prior, or the attack's own
    pipeline on the null view when it ran) on the victims ``rows`` of ``table`` (a
    :class:`~privaudit.results.specs.VictimTable`), in the direction of ``metric`` (an RMSE,
    a ``root`` metric, is better when lower)."""
    w = float(np.sum(table.weight[metric][rows]))
    if w <= 0:
        return math.nan
    att = float(np.sum(table.attack[metric][rows])) / w
    guesses = [float(np.sum(table.prior[metric][rows])) / w]
    if metric in table.null:
        guesses.append(float(np.sum(table.null[metric][rows])) / w)
    if metric in table.root:
        return min(math.sqrt(max(g, 0.0)) for g in guesses) - math.sqrt(max(att, 0.0))
    return att - max(guesses)


def planted_control(
    protocol_cls: type,
    config: Mapping[str, Any],
    defense_specs: Sequence[tuple[type, Mapping[str, Any]]],
    dataset: Any,
    seed: int,
    attacks: Sequence[tuple[str, type, Mapping[str, Any]]],
    canaries: int = PLANTED_CANARIES,
    names: Sequence[str] | None = None,
    confidence: float = 0.95,
    margin: float | None = None,
) -> dict[str, Any]:
    """Planted-signal control of a DP cell: would the attack have found a leak at this noise?

    One run of ``protocol_cls`` with the cell's own ``config`` (same rounds, same recording:
    the attack reads what it reads in the cell) and defenses (same noise) at ``seed``, on
    ``dataset`` with ``canaries`` canary users of the protocol's canary kit appended (their
    ratings are a planted signal: extreme values of private items, swapped at random); each
    attack ``(name, class, params)`` is evaluated on it and scored on the planted victims only:
    its advantage over the best guess without the messages (the prior, or its own pipeline on
    the null view) on its primary metric, with a ``confidence`` one-sided lower bound from a
    bootstrap over the planted victims. ``power`` is True when that lower bound is above
    ``margin`` (the verdicts' protection margin by default): the attack finds, through the
    mechanism, a planted leak larger than the margin. (Above 0 is not enough: the bootstrap over
    victims omits run-level variation, and at pure noise the planted advantage reads up to
    +0.015, lower bounds up to 0.001, docs/canaries.md.)

    Returns ``{"canaries", "seconds", "attacks": {name: {"metric", "victims", "advantage",
    "lower", "power"} or {"supported": False, "reason"} or {"error"}}}``."""
    import time

    from privaudit.results.stats import PROTECTION_MARGIN

    t0 = time.perf_counter()
    margin = PROTECTION_MARGIN if margin is None else float(margin)
    defense_name = (names or [""])[0] or None
    kit = canary_kit(protocol_cls.name, defense_name)
    if kit is None or not hasattr(kit, "planted_victims"):
        raise PrivauditError(f"no planted-signal control for protocol {protocol_cls.name!r}")
    defenses = [cls(**dict(params)) for cls, params in defense_specs]
    kit.canaries = int(canaries)
    cfg = protocol_cls.resolve_config(dict(config))
    if hasattr(kit, "for_defenses"):
        kit.for_defenses(defenses, cfg)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x91A7]))
    augmented, record = kit.insert(dataset, rng)
    result = protocol_cls().run(augmented, cfg, defenses, int(seed))
    planted = set(kit.planted_victims(result, record))
    out: dict[str, Any] = {"canaries": len(planted), "margin": margin, "attacks": {}}
    for k, (name, attack_cls, params) in enumerate(attacks):
        arng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x91A7, k]))
        try:
            outcome = attack_cls(**dict(params)).evaluate(result.transcript, arng)
        except Exception as exc:  # reported, like a failing attack
            out["attacks"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        table = getattr(outcome, "victims", None)
        if not outcome.reconstruction.supported or table is None:
            reason = outcome.reconstruction.reason or "no per-victim results"
            out["attacks"][name] = {"supported": False, "reason": reason}
            continue
        metric = getattr(attack_cls, "primary_metric", None)
        metric = metric if metric in table.weight else next(iter(table.weight), None)
        rows = np.array([i for i, v in enumerate(table.victims) if v in planted], dtype=np.int64)
        if metric is None or rows.size < 2:
            out["attacks"][name] = {"supported": False, "reason": "the attack scores no planted victim"}
            continue
        adv = _planted_advantage(table, rows, metric)
        boot = np.array(
            [
                _planted_advantage(table, rows[arng.integers(0, rows.size, rows.size)], metric)
                for _ in range(PLANTED_BOOTSTRAP)
            ]
        )
        lower = float(np.nanquantile(boot, 1.0 - confidence))
        out["attacks"][name] = {
            "metric": metric,
            "victims": int(rows.size),
            "advantage": float(adv),
            "lower": lower,
            "margin": margin,
            "power": bool(lower > margin),
        }
    out["seconds"] = time.perf_counter() - t0
    return out


def planted_sentence(control: Mapping[str, Any] | None) -> str | None:
    """One plain clause on an attack's planted-signal control entry: "on 133 planted canary users
    at the same noise it finds the planted leak (rating_accuracy +0.481, lower bound 0.406 >
    margin 0.05)" or "... it finds no leak above the margin (rating_accuracy -0.038, lower bound
    -0.083 ≤ 0.05)"; None without a usable entry."""
    if not isinstance(control, Mapping):
        return None
    if "error" in control:
        return f"planted-signal control failed ({control['error']})"
    if control.get("supported") is False:
        return f"planted-signal control not applicable ({control.get('reason', '')})"
    if "lower" not in control:
        return None
    margin = float(control.get("margin", math.nan))
    if control["power"]:
        found, cmp = "finds the planted leak", f"> margin {margin:.2f}"
    else:
        found, cmp = "finds no leak above the margin", f"≤ {margin:.2f}"
    return (
        f"on {control['victims']} planted canary users at the same noise it {found} "
        f"({control['metric']} {control['advantage']:+.3f}, lower bound {control['lower']:.3f} {cmp})"
    )
