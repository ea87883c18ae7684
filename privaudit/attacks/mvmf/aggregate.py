r"""``mvmf-aggregate``: server reconstruction from per-cohort SUMS of FedMVMF uploads.

Under PrivMVMF (``paillier``) the server never sees a client's plaintext upload, only the sums
the decrypting clients return (PrivMVMF paper eq. 37): per item, ``G_V[i] = sum_{u in C, i in
S_u} grad_V[u, i]`` and ``G_P = sum_{u in C} grad_P[u]`` over a cohort C (all senders of a
round by default; ``paillier:cohort_size=c`` makes cohorts of c). The paper argues (eqs.
38-41) that the system relating these sums to the c users' ratings and attributes has more
unknowns than equations once the cohort is large, so the sums leak little. This attack
measures where that holds.

What the server knows besides the sums: V and P of the round (``state``), the public config,
and -- because items travel in the clear so that it can sum per item -- each member's item set
S_u (= I_u ∪ S_u with sampling).

Method (the analytic idea of ``mvmf-analytic`` lifted to sums). Every upload row of member u
is a multiple of its latent vector: ``grad_V[u, i] = a_ui d_u``, ``grad_P[u] = b_u d_u^T``
(d_u unit; see ``mvmf-analytic`` and docs/mvmf-analytic.md). So:

1. items uploaded by exactly one member of the cohort give that member's rows directly; their
   top right singular vector is d_u (needs at least one such "unique" item);
2. an item uploaded by members M_i with known directions satisfies
   ``G_V[i] = sum_{u in M_i} a_ui d_u``: K equations, |M_i| unknowns -- solved exactly by least
   squares when |M_i| <= K and the directions are independent;
3. ``G_P = B D^T`` with D = [d_u] (K x c): B (p x c), hence every member's grad_P, is
   ``G_P D (D^T D)^-1`` when c <= K;
4. with every member's uploads separated, ``mvmf-analytic`` runs on the reconstructed
   per-client view (exact without noise).

Where a step is impossible (a member without a unique item; an item shared by more than K
members or by a member of unknown direction; c > K for grad_P) the least-squares solution over
the known directions is used (minimum norm), which is wrong in general, and the meta records
how much of the cohort was separable. Members without a direction get the prior library's
message-free guesses when the attack's knowledge holds the population prior (the guesses of
``prior_baseline``, so that such members score as the prior does), else an uninformed guess
(:func:`uninformed_rating`: "unrated" when unrated items are the majority of uploads, else the
rating midpoint; attributes 0); either way they count in the accuracy. The separated members
are decoded by ``mvmf-analytic`` with the same knowledge (posterior decoding under noise). With c = 1 the sum IS
the upload and the attack is exactly ``mvmf-analytic`` on it.

Views it reads:

- a PrivMVMF server view: ``plaintext_sum`` messages (decryptor -> server; meta ``of_kind``,
  ``cohort``, ``members``) plus the encrypted ``grad_V`` messages for the members' ``items``;
- a plain FedMVMF server view: the per-client uploads are grouped into consecutive cohorts of
  ``cohort_size`` clients (sorted by client number) and only their sums are kept -- an
  attack-side simulation of secure aggregation over cohorts, used to tabulate accuracy
  against cohort size cheaply (documented departure: the cohorts are formed by the attacker
  from plaintext uploads, not by a protocol).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np

from privaudit.attacks.base import Reconstruction
from privaudit.attacks.mvmf._core import (
    MVMFAttack,
    PopulationPrior,
    client_sort_key,
    missing_config,
    parse_view,
    population_prior,
    round_ratings,
    server_states,
)
from privaudit.params import Param
from privaudit.registry import get, register_attack
from privaudit.transcript import Message, View


class _Cohort:
    """One cohort's sums in one round.

    members : list[str]; items : dict party -> int64 item ids; gv_items, gv_values : (L,) item ids
    and (L x K) sums; gp : (p x K) sum; single : the member's grad_V rows in its item order when the
    cohort is one upload with distinct items (the sums are that upload; gv_* are then unset).
    """

    def __init__(self, round: int, members: list[str]):
        self.round = round
        self.members = members
        self.items: dict[str, np.ndarray] = {}
        self.gv_items: np.ndarray | None = None
        self.gv_values: np.ndarray | None = None
        self.gp: np.ndarray | None = None
        self.single: np.ndarray | None = None


def separate(cohort: _Cohort, K: int) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, float]]:
    """Per-member uploads reconstructed from the cohort sums (steps 1-3 of the module doc).

    Returns ``{party: {"items", "grad_V", "grad_P"}}`` for the members whose direction is known,
    and diagnostics (``members``, ``with_direction``, ``separable_items`` fraction of
    (member, item) pairs solved exactly, ``grad_P_separable``).
    """
    members = cohort.members
    c = len(members)
    if c == 1:  # the sum is the upload
        u = members[0]
        items = np.asarray(cohort.items[u], dtype=np.int64)
        if cohort.single is not None:
            rows = cohort.single
        else:
            GV = {int(i): v for i, v in zip(cohort.gv_items, cohort.gv_values)}
            rows = np.stack([GV[int(i)] for i in items]) if len(items) else np.zeros((0, K))
        return {u: {"items": items, "grad_V": rows, "grad_P": cohort.gp}}, {
            "members": 1.0,
            "with_direction": 1.0,
            "separable_items": 1.0,
            "grad_P_separable": 1.0,
        }
    GV = {int(i): v for i, v in zip(cohort.gv_items, cohort.gv_values)}
    owners: dict[int, list[int]] = defaultdict(list)
    for k, u in enumerate(members):
        for i in np.asarray(cohort.items[u], dtype=np.int64).tolist():
            owners[i].append(k)
    # 1. directions from unique items
    D = np.full((c, K), np.nan)
    for k, u in enumerate(members):
        uniq = [i for i in np.asarray(cohort.items[u]).tolist() if len(owners[i]) == 1 and i in GV]
        if uniq:
            rows = np.stack([GV[i] for i in uniq])
            _, _, vt = np.linalg.svd(rows, full_matrices=False)
            D[k] = vt[0]
    known = ~np.isnan(D[:, 0])
    # 2. per-item coefficients a_ui
    coef: dict[tuple[int, int], float] = {}
    exact = total = 0
    for i, ks in owners.items():
        if i not in GV:
            continue
        total += len(ks)
        kk = [k for k in ks if known[k]]
        if not kk:
            continue
        A = D[kk].T  # K x |kk|
        sol, *_ = np.linalg.lstsq(A, GV[i], rcond=None)
        ok = len(kk) == len(ks) and len(kk) <= K and np.linalg.matrix_rank(A) == len(kk)
        exact += len(kk) if ok else 0
        for k, s in zip(kk, sol):
            coef[(k, i)] = float(s)
    # 3. grad_P coefficients
    kk = np.flatnonzero(known)
    Bp = np.zeros((cohort.gp.shape[0], c))
    gp_ok = False
    if len(kk):
        Dk = D[kk].T  # K x |kk|
        sol, *_ = np.linalg.lstsq(Dk, cohort.gp.T, rcond=None)  # |kk| x p
        Bp[:, kk] = sol.T
        gp_ok = bool(known.all() and c <= K and np.linalg.matrix_rank(Dk) == c)
    out: dict[str, dict[str, np.ndarray]] = {}
    for k, u in enumerate(members):
        if not known[k]:
            continue
        items = np.asarray(cohort.items[u], dtype=np.int64)
        a = np.array([coef.get((k, int(i)), 0.0) for i in items])
        out[u] = {"items": items, "grad_V": a[:, None] * D[k][None, :], "grad_P": Bp[:, k : k + 1] * D[k][None, :]}
    diag = {
        "members": float(c),
        "with_direction": float(known.mean()),
        "separable_items": exact / total if total else float("nan"),
        "grad_P_separable": float(gp_ok),
    }
    return out, diag


def _single_upload(co: _Cohort, up: Any, r: int) -> bool:
    """Fill the one-member cohort ``co`` of round ``r`` straight from the member's upload ``up``
    (its sums are that upload: the same rows, in its item order). False, leaving ``co`` as it was,
    when the upload holds no item or repeats one (the general path sums repeated rows)."""
    j = up.rounds.index(r)
    items = np.asarray(up.items[j], dtype=np.int64)
    if not len(items) or len(np.unique(items)) != len(items):
        return False
    co.items[co.members[0]] = up.items[j]
    co.single = np.array(up.grad_V[j])
    co.gp = up.grad_P[j].copy()
    return True


def _prior_guesses(
    cfg: dict[str, Any], members: list[tuple[str, np.ndarray]], p: int, population: PopulationPrior | None
) -> dict[str, dict[str, np.ndarray]]:
    """Guesses for members whose uploads the sums did not separate: with the population prior,
    the prior library's guesses (:meth:`PriorTable.predictive` modes: rating, rated/unrated,
    rating given rated; attribute dummies with a share above 1/2), else
    :func:`uninformed_rating` and attributes 0."""
    out: dict[str, dict[str, np.ndarray]] = {}
    if not members:
        return out
    table = population.table if population is not None else None
    index = population.index([u for u, _ in members]) if population is not None else None
    if table is None or not len(table.values) or np.any(index < 0):
        mid = uninformed_rating(cfg)
        return {u: {"items": it, "ratings": np.full(len(it), mid), "attributes": np.zeros(p)} for u, it in members}
    lengths = np.fromiter((len(it) for _, it in members), dtype=np.int64, count=len(members))
    rows = np.repeat(index, lengths)
    items = np.concatenate([it for _, it in members])
    guess = table.values[np.argmax(table.predictive("rating_accuracy", rows, items), axis=1)]
    rated_guess = table.values[np.argmax(table.predictive("rated_rating_accuracy", rows, items), axis=1)]
    rated = np.argmax(table.predictive("rated_detection_accuracy", rows, items), axis=1) == 1
    shares = table.attribute_shares(index) if table.attributes.shape[1] == p else np.zeros((len(members), p))
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    for k, (u, it) in enumerate(members):
        sl = slice(bounds[k], bounds[k + 1])
        out[u] = {
            "items": it,
            "ratings": guess[sl],
            "rated": rated[sl],
            "rated_ratings": rated_guess[sl],
            "attributes": (shares[k] > 0.5).astype(float),
        }
    return out


def uninformed_rating(cfg: dict[str, Any]) -> float:
    """The guess for an uploaded item of a member the sums did not separate, from the public config:
    "unrated" (0) when unrated items are at least half of the uploads (InclUnc, or a ``sampling``
    defense with rho >= 1: rho virtual items per rated one), else the rating midpoint."""
    rho = max(
        (
            float(d.get("rho", 0.0) or 0.0)
            for d in cfg.get("defenses", []) or []
            if isinstance(d, dict) and d.get("name") == "sampling"
        ),
        default=0.0,
    )
    if cfg.get("unrated") == "inclunc" or rho >= 1.0:
        return 0.0
    return float(round_ratings(np.array([(float(cfg["rating_min"]) + float(cfg["rating_max"])) / 2]), cfg)[0])


@register_attack("mvmf-aggregate")
class MVMFAggregate(MVMFAttack):
    """Reconstruct ratings/attributes from per-cohort sums of FedMVMF uploads (PrivMVMF's server view)."""

    description = (
        "FedMVMF/PrivMVMF server attack on per-cohort sums: separate the sums by rank-1 structure, then mvmf-analytic"
    )
    requires = ("state",)
    # no default sweep: on plain views sweep ``attack.cohort_size=1,2,5,10,50``; on PrivMVMF
    # views the cohorts are the server's (``--sweep paillier.cohort_size=...``)
    default_sweep = None
    parameters = (
        Param(
            "cohort_size",
            1,
            "plain views: sum consecutive clients in cohorts of this size first (ignored for decrypted sums)",
        ),
        Param("max_rounds", -1, "use at most this many rounds (-1: all)"),
    )

    def applicable(self, view: View) -> tuple[bool, str]:
        kinds = view.kinds()
        if not kinds.get("state"):
            return False, f"the {view.party}'s view holds no state messages (V, P of the round)"
        if kinds.get("plaintext_sum"):
            return True, ""
        if not kinds.get("grad_V") or not kinds.get("grad_P"):
            return False, f"the {view.party}'s view holds neither decrypted sums nor plaintext uploads"
        enc = [
            m for m in view.select("grad_V") + view.select("grad_P") if m.meta.get("encrypted") or m.meta.get("masked")
        ]
        if enc:
            return False, f"the {view.party}'s view holds uploads only as ciphertexts and no decrypted sums"
        return True, ""

    # ------------------------------------------------------------------ cohorts from a view
    def _reads(self, m: Message) -> bool:
        """Whether a ``plaintext_sum`` is one of the protocol's cohort sums (label >= 0; a
        malicious server's own requests are labelled -1, :mod:`privaudit.protocols.privmvmf`)."""
        return int(m.meta.get("cohort", 0)) >= 0

    def _cohorts(self, view: View) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray], list[_Cohort]]:
        V, P = server_states(view)
        rounds = sorted(set(V) & set(P))
        if self.max_rounds is not None and self.max_rounds >= 0:
            rounds = rounds[: self.max_rounds]
        cohorts: list[_Cohort] = []
        if view.select("plaintext_sum"):
            items_by: dict[tuple[int, str], np.ndarray] = {}
            for m in view.select("grad_V"):
                if "items" in m.payload:
                    items_by[(m.round, m.sender)] = np.asarray(m.payload["items"], dtype=np.int64)
            groups: dict[tuple[int, int], dict[str, Any]] = {}
            for m in view.select("plaintext_sum"):
                if m.round not in rounds or not self._reads(m):
                    continue
                g = groups.setdefault(
                    (m.round, int(m.meta.get("cohort", 0))), {"members": m.meta.get("members", []), "V": [], "P": []}
                )
                if m.meta.get("of_kind") == "grad_V":
                    g["V"].append(
                        (
                            np.asarray(m.payload["items"], dtype=np.int64),
                            np.asarray(m.payload["values"], dtype=np.float64),
                        )
                    )
                elif m.meta.get("of_kind") == "grad_P":
                    g["P"].append(np.asarray(m.payload["values"], dtype=np.float64))
            for (r, _), g in sorted(groups.items()):
                if not g["V"] or not g["P"] or not g["members"]:
                    continue
                co = _Cohort(r, list(g["members"]))
                co.gv_items = np.concatenate([it for it, _ in g["V"]])
                co.gv_values = np.concatenate([v for _, v in g["V"]])
                co.gp = np.sum(g["P"], axis=0)
                co.items = {u: items_by.get((r, u), np.empty(0, np.int64)) for u in co.members}
                cohorts.append(co)
            return V, P, cohorts
        fv = parse_view(view)
        size = max(int(self.cohort_size), 1)
        for r in rounds:
            parties = sorted([u for u, up in fv.clients.items() if r in up.rounds], key=client_sort_key)
            for s in range(0, len(parties), size):
                members = parties[s : s + size]
                co = _Cohort(r, members)
                if len(members) == 1 and _single_upload(co, fv.clients[members[0]], r):
                    cohorts.append(co)
                    continue
                acc: dict[int, np.ndarray] = {}
                gp = None
                for u in members:
                    up = fv.clients[u]
                    j = up.rounds.index(r)
                    co.items[u] = up.items[j]
                    for i, row in zip(up.items[j].tolist(), up.grad_V[j]):
                        acc[i] = acc[i] + row if i in acc else row.copy()
                    gp = up.grad_P[j].copy() if gp is None else gp + up.grad_P[j]
                keys = np.array(sorted(acc), dtype=np.int64)
                co.gv_items = keys
                co.gv_values = np.stack([acc[i] for i in keys.tolist()]) if len(keys) else np.zeros((0, fv.config["K"]))
                co.gp = gp
                cohorts.append(co)
        return V, P, cohorts

    # ------------------------------------------------------------------ attack
    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        tic = time.perf_counter()
        missing = missing_config(view)
        if missing:
            return self.unsupported(f"the view's config lacks {', '.join(missing)}")
        try:
            analytic_cls = get("attack", "mvmf-analytic")
        except Exception:  # pragma: no cover - the analytic attack ships with privaudit
            return self.unsupported("mvmf-analytic is not available")
        K = int(view.config["K"])
        V, P, cohorts = self._cohorts(view)
        if not cohorts:
            return self.unsupported("the view holds no per-cohort sums with the server state of their round")
        messages: list[Message] = []
        seq = 0
        for r in sorted({co.round for co in cohorts}):
            messages.append(Message(seq, r, "server", "server", "state", {"V": V[r], "P": P[r]}))
            seq += 1
        diags = []
        sizes = []
        for co in cohorts:
            sep, diag = separate(co, K)
            diags.append(diag)
            sizes.append(len(co.members))
            for u, up in sep.items():
                messages.append(
                    Message(seq, co.round, u, "server", "grad_V", {"items": up["items"], "values": up["grad_V"]})
                )
                messages.append(Message(seq + 1, co.round, u, "server", "grad_P", {"values": up["grad_P"]}))
                seq += 2
        synthetic = View("server", view.protocol, dict(view.config), dict(view.dataset), list(view.parties), messages)
        inner = analytic_cls().run(synthetic, knowledge, rng) if any(m.kind == "grad_V" for m in messages) else None
        victims = dict(inner.victims) if inner is not None and inner.supported else {}
        # message-free guesses for members the sums did not separate
        cfg = view.config
        p = next(iter(P.values())).shape[0]
        first_round = min(co.round for co in cohorts)
        missing = [
            (u, np.asarray(co.items.get(u, np.empty(0, np.int64)), dtype=np.int64))
            for co in cohorts
            if co.round == first_round
            for u in co.members
            if u not in victims
        ]
        victims.update(_prior_guesses(cfg, missing, p, population_prior(knowledge)))
        guessed = len(missing)
        meta = {
            "cohorts": len(cohorts),
            "mean_cohort_size": float(np.mean(sizes)),
            "with_direction": float(np.mean([d["with_direction"] for d in diags])),
            "separable_items": float(np.nanmean([d["separable_items"] for d in diags])),
            "grad_P_separable": float(np.mean([d["grad_P_separable"] for d in diags])),
            "uninformed_guesses": guessed,
            "inner": (
                inner.meta if inner is not None and inner.supported else (inner.reason if inner is not None else "")
            ),
            "seconds": time.perf_counter() - tic,
        }
        return Reconstruction(self.name, self.party, victims, meta=meta)
