"""Malicious-server attacks that defeat FedNCF's secure aggregation (threat ``malicious``).

Secure aggregation (``secagg``) shows the server only the sum of a cohort's uploads, so every
honest-but-curious attack on per-client uploads is "not applicable". That holds only if the
server follows the protocol. Both attacks here make the sum equal one target's upload, in the
rounds the server deviates in (protocol ``server`` plan: ``deviation_rounds`` rounds after
``deviation_start`` regular rounds; the server records each deviation on its own ``state``
message):

``ncf-sybil-isolation`` (``server=sybil``): the server fills the target's cohort with sybil
clients it runs (``sybils``, by default clients_per_round - 1), which upload zeros through
secure aggregation; their contribution is known and subtracted (zero), so the aggregate is the
target's update. Fewer sybils leave honest cover clients in the cohort (re-drawn every round).

``ncf-model-inconsistency`` (``server=inconsistent``; Pasquini, Francati and Ateniese, "Eluding
Secure Aggregation in Federated Learning via Model Inconsistency", ACM CCS 2022): the cohort
holds honest clients only, but the server sends every member except the target a crafted model
(item rows 0, output weights 0, dead ReLUs: :meth:`FedNCF.crafted_model`) on which their item
rows' gradient is exactly 0, so their item updates vanish from the sum.

Reading the item set: the server learns the aggregate by applying it, so the rows of the global
item table that changed from the ``state`` of deviation round r to that of round r + 1 are the
rows the target updated: its positives and the negatives it sampled that round (the observation
vector of the honest ``ncf-update-leak``), and the change of each row is the target's update of
it (divided by the row's count). ``method=intersect``: negatives are re-drawn every round, so
the rows changed in each of the first ``rounds`` rounds are predicted. A round that changed no
row (the target dropped out after masking) is skipped. ``method=direction``
(default): the BCE gradient of a positive row and of a negative row point in opposite directions
((sigma - y) times the same user-dependent vector; exactly so for GMF), so each round's changed
rows are split by the sign of their projection on the first right singular vector of the
normalised changes; each round's split is aligned with the first round's on the rows both
changed, and the side smaller over all rounds is the positive one (a client samples
``negatives`` per positive, 4 by default, so that its distinct negative rows outnumber its
positives; with ``negatives`` 1 on dense data they may not); an item is predicted when it is on
the positive side in at least half the rounds.

Metrics: ``precision``, ``recall``, ``f1`` of the target's training positives; ``rounds_used``
(deviation rounds read), ``sybils`` (largest number of sybils in a deviation cohort) and ``k``
(mean cohort size). Baseline: every item with probability 1/2; prior-only: the target's k items
most rated by the other clients (as ``ncf-kanon-linking``). A round the clients abort
(``model-consistency``, ``verified-cohort``) changes nothing; with every deviation round aborted
the attack does not apply.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.attack_metrics import f1_score, set_precision_recall
from privaudit.attacks.base import Reconstruction
from privaudit.attacks.ncf.update_leak import (
    PRF_SPECS,
    OneTarget,
    client_truth,
    guess_baseline,
    target_prior,
)
from privaudit.params import Param
from privaudit.registry import register_attack
from privaudit.results import MetricSpec
from privaudit.transcript import Transcript, View

#: What a malicious server may do, by name (an attack declares the ones it uses in ``deviations``).
DEVIATIONS = {
    "choose-cohorts": "pick every member of a cohort (the target in each deviation round)",
    "sybils": "add clients it runs to a cohort, up to the attack's declared count",
    "inconsistent-models": "send each cohort member its own model",
    "craft-items": "send item embeddings of its choosing",
    "craft-network": "send network weights of its choosing (e.g. a saturating prediction bias)",
    "isolated-decryption": "have a decrypting client decrypt one client's ciphertexts as if they were a sum",
}


class IsolationAttack(OneTarget):
    """Intersect the item rows the aggregate changed over the deviation rounds (module docstring)."""

    party = "server"
    protocols = ("fedncf",)
    requires = ("state", "aggregate")
    threat = "malicious"
    #: the fedncf ``server`` plan this attack reads
    plan = ""
    #: what the server does (keys of :data:`DEVIATIONS`)
    deviations: tuple[str, ...] = ()
    primary_metric = "precision"
    metric_specs = {
        **PRF_SPECS,
        "rounds_used": MetricSpec(True, False, "count", "deviation rounds whose aggregate the attack read"),
        "sybils": MetricSpec(False, False, "count", "largest number of sybil clients in a deviation cohort"),
        "k": MetricSpec(True, False, "count", "mean cohort size of the deviation rounds"),
    }
    default_sweep = ("rounds", (1, 2, 3, 4))
    #: read one deviation round, unless the audit sweeps the rounds (privaudit.audit.round_grid)
    audit_params = {"rounds": 1}
    parameters = (
        Param("rounds", -1, "deviation rounds to read (-1: all usable in the view)", ge=1, also=(-1,)),
        Param(
            "method",
            "direction",
            "direction (split each round's changed rows by the sign of their main direction) or "
            "intersect (items changed in every round read)",
            choices=("direction", "intersect"),
        ),
    )

    @property
    def server_plan(self) -> str:
        """The fedncf ``server`` plan this attack reads (``plan`` may hold further settings)."""
        return str(self.plan["server"]) if isinstance(self.plan, dict) else str(self.plan)

    def _rounds(self, view: View) -> tuple[dict, dict, list[int], list[str]]:
        """States and aggregates by round, the usable deviation rounds (aggregate and the next
        state recorded, not aborted) and the clients' abort reasons."""
        states = {m.round: m for m in view.select("state")}
        aggs = {m.round: m for m in view.select("aggregate")}
        dev = sorted(r for r, m in states.items() if (m.meta or {}).get("deviation") == self.server_plan)
        aborted = [str(aggs[r].meta["aborted"]) for r in dev if r in aggs and (aggs[r].meta or {}).get("aborted")]
        usable = [r for r in dev if r + 1 in states and r in aggs and not (aggs[r].meta or {}).get("aborted")]
        return states, aggs, usable, aborted

    def plan_mismatch(self, view: View) -> str:
        """Why the view's server did not follow this attack's plan ("" when it did)."""
        followed = view.config.get("server", "honest")
        settings = dict(self.plan) if isinstance(self.plan, dict) else {"server": self.plan}
        other = {k: view.config.get(k) for k, v in settings.items() if k != "server" and view.config.get(k) != v}
        if followed == self.server_plan and not other:
            return ""
        wanted = ", ".join(f"{k}={v}" for k, v in settings.items())
        return f"the server followed plan {followed!r}; this attack needs protocol {wanted}"

    def applicable(self, view: View) -> tuple[bool, str]:
        ok, reason = super().applicable(view)
        if not ok:
            return ok, reason
        mismatch = self.plan_mismatch(view)
        if mismatch:
            return False, mismatch
        _, _, usable, aborted = self._rounds(view)
        if not usable:
            if aborted:
                return False, f"the clients aborted every deviation round ({aborted[0]})"
            return False, "no deviation round has its aggregate and the next global model recorded (record_rounds)"
        return True, ""

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        states, aggs, usable, aborted = self._rounds(view)
        m = int(view.config["n_items"])
        changed = []  # (round, rows, their change) of each round that changed a row
        for r in usable:
            diff = np.asarray(states[r + 1].payload["items"]) - np.asarray(states[r].payload["items"])
            rows = np.flatnonzero(np.any(diff != 0, axis=1)).astype(np.int64)
            if rows.size:
                changed.append((r, rows, diff[rows]))
        unchanged = len(usable) - len(changed)  # the target dropped out: nothing to read
        if self.rounds != -1:
            changed = changed[: self.rounds]
        n = len(changed)
        seen = np.zeros(m)
        for _, rows, _ in changed:
            seen[rows] += 1.0
        if n == 0:
            score = seen
        elif self.method == "intersect" or int(view.config.get("negatives", 1)) == 0:
            score = seen / n
        else:
            score = _aligned_votes([(rows, d) for _, rows, d in changed], m) / n
        threshold = 1.0 if self.method == "intersect" else 0.5
        pred = np.flatnonzero(score >= threshold) if n else np.zeros(0, dtype=np.int64)
        read = [r for r, _, _ in changed] or usable
        meta = {
            "rounds_used": n,
            "rounds_aborted": len(aborted),
            "rounds_unchanged": unchanged,
            "sybils": max(len(states[r].meta.get("sybils", [])) for r in read),
            "k": float(np.mean([int(aggs[r].meta.get("k", 0)) for r in read])),
        }
        target = int(states[usable[0]].meta["target"])
        victim = {"items": pred.astype(np.int64), "score": score}
        return Reconstruction(self.name, self.party, {f"client:{target}": victim}, meta=meta)

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        ((party, rec),) = reconstruction.victims.items()
        p, r = set_precision_recall(rec["items"], client_truth(transcript, party))
        meta = reconstruction.meta
        return {
            "precision": p,
            "recall": r,
            "f1": f1_score(p, r),
            "rounds_used": float(meta["rounds_used"]),
            "sybils": float(meta["sybils"]),
            "k": float(meta["k"]),
        }

    def _target(self, transcript: Transcript) -> str | None:
        target = int(transcript.config.get("target", -1))
        return f"client:{target}" if target >= 0 else None

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        party = self._target(transcript)
        out = guess_baseline(transcript, [party] if party else [])
        return {**out, "rounds_used": 0.0, "sybils": 0.0, "k": float("nan")}

    def _prior(self, transcript: Transcript) -> tuple[float, float] | None:
        """The target's (precision, recall) under the popularity strategy with the best mean F1
        over the other clients (:func:`popularity_strategies`, the target excluded)."""
        party = self._target(transcript)
        if party is None:
            return None
        return target_prior(transcript, party)

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """The target's guess from item popularity alone (:meth:`_prior`)."""
        prior = self._prior(transcript)
        nan = float("nan")
        if prior is None:
            return {"precision": nan, "recall": nan, "f1": nan, "rounds_used": 0.0, "sybils": 0.0, "k": nan}
        p, r = prior
        return {"precision": p, "recall": r, "f1": f1_score(p, r), "rounds_used": 0.0, "sybils": 0.0, "k": nan}


@register_attack("ncf-sybil-isolation")
class NCFSybilIsolation(IsolationAttack):
    """FedNCF under secagg: a cohort of the target and sybils uploading zeros isolates its update."""

    description = (
        "FedNCF, malicious server: sybils fill the target's cohort, the secure aggregate is its update (item set)"
    )
    plan = "sybil"
    deviations = ("choose-cohorts", "sybils")


@register_attack("ncf-model-inconsistency")
class NCFModelInconsistency(IsolationAttack):
    """FedNCF under secagg: crafted models for all but the target make the aggregate its update."""

    description = (
        "FedNCF, malicious server: crafted models zero the other members' item updates (CCS 2022), item set leaks"
    )
    plan = "inconsistent"
    deviations = ("inconsistent-models", "craft-items")


def _split(d: np.ndarray) -> np.ndarray:
    """Bool per row of one round's changes ``d`` (r x Dtot): the sign of its projection on the
    first right singular vector of the row-normalised changes."""
    if len(d) < 2:
        return np.ones(len(d), dtype=bool)
    norm = np.linalg.norm(d, axis=1, keepdims=True)
    unit = d / np.where(norm > 0, norm, 1.0)
    _, _, vt = np.linalg.svd(unit, full_matrices=False)
    return unit @ vt[0] > 0


def _aligned_votes(changed: list[tuple[np.ndarray, np.ndarray]], m: int) -> np.ndarray:
    """Per item (m,), in how many rounds it was on the positives' side: each round's split
    (:func:`_split`) flipped to agree with the first round's on the rows both changed, then
    all rounds flipped together so that the positive side is the smaller one overall."""
    sides = []
    ref = np.full(m, -1)
    for rows, d in changed:
        side = _split(d)
        if sides:
            known = ref[rows] >= 0
            if known.any() and np.mean(side[known] == (ref[rows][known] == 1)) < 0.5:
                side = ~side
        else:
            ref[rows] = side.astype(int)
        sides.append((rows, side))
    n_true = sum(int(side.sum()) for _, side in sides)
    n_false = sum(int((~side).sum()) for _, side in sides)
    flip = n_true > n_false
    votes = np.zeros(m)
    for rows, side in sides:
        votes[rows] += (~side if flip else side).astype(float)
    return votes
