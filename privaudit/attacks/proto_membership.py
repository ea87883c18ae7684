"""``proto-membership``: membership inference on FedProto's prototypes.

The server holds the k prototypes P_h each silo sent (kind ``prototypes``). Given a candidate
row x (a user's rating vector), it decides whether x was in silo h's training data: members
pulled the prototypes (k-means centres, or the rows themselves for ``random``) towards them, so
the membership score is the negative squared distance to the nearest prototype,

    ``score="distance"``: -min_j ||x - p_j||^2
    ``score="relative"`` (default): -(min_j ||x - p_j||^2 - ||x||^2) / max(||x||^2, 1)
        (how much closer than the empty row the nearest prototype is, per unit of the row's
        own norm; removes the row-norm effect that dominates raw distances of sparse rows).

Prior knowledge (:meth:`prior_knowledge`, granted from the transcript): for every silo h the
candidate rows — up to ``n_members`` of its training rows (members) and as many rows of other
silos (non-members) — and ``n_calibration`` further rows of other silos, known to be outside
h (the "rows known to be outside" that calibrate the threshold). Which candidates are members
is hidden from the attack. The decision threshold is the (1 - ``fpr``) quantile of the
calibration rows' scores (a member is declared when its score exceeds it).

Metrics: ``auc`` (mean over silos of the per-silo AUC of the scores, Mann-Whitney),
``auc_pooled`` (one AUC over all silos' candidates), ``advantage`` = TPR - FPR of the
calibrated decisions over all candidates, ``tpr``, ``fpr``. Baseline: AUC 0.5, advantage 0.
Default sweep: none of its own — ``--defense dp-prototypes`` sweeps epsilon (10, 1, 0.1);
sweep k with ``--sweep protocol.k=...``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from privaudit.attacks.base import Attack, Reconstruction
from privaudit.metrics import auc
from privaudit.params import Param
from privaudit.registry import register_attack
from privaudit.results import Decisions, MetricSpec, VictimTable
from privaudit.transcript import Transcript, View


def _silo_rows(transcript: Transcript) -> tuple[list[str], list[np.ndarray], sp.csr_matrix]:
    """Silo parties, their dataset user ids, and the training rows of every user (n x m CSR)."""
    m = int(transcript.config["n_items"])
    parties, ids, rows, cols, vals = [], [], [], [], []
    for p in transcript.parties:
        priv = transcript.private(p)
        if not priv or "user_ids" not in priv:
            continue
        u = np.asarray(priv["user_ids"], dtype=np.int64)
        parties.append(p)
        ids.append(u)
        rows.append(u[np.asarray(priv["users"], dtype=np.int64)])
        cols.append(np.asarray(priv["items"], dtype=np.int64))
        vals.append(np.asarray(priv["ratings"], dtype=np.float64))
    n = int(max((u.max() for u in ids if u.size), default=-1)) + 1
    R = (
        sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, m))
        if ids
        else sp.csr_matrix((0, m))
    )
    return parties, ids, R


def membership_scores(X: Any, P: np.ndarray, kind: str = "relative") -> np.ndarray:
    """Membership scores of the rows of ``X`` (c x m) against prototypes ``P`` (k x m); higher
    = more likely a member (module docstring)."""
    X = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    P = np.asarray(P, dtype=np.float64)
    x2 = (X * X).sum(1)
    d = np.maximum(x2[:, None] - 2.0 * X @ P.T + (P * P).sum(1)[None, :], 0.0).min(axis=1)
    if kind == "distance":
        return -d
    return -(d - x2) / np.maximum(x2, 1.0)


@register_attack("proto-membership")
class ProtoMembership(Attack):
    """Was this row in the silo? Distance to the silo's nearest prototype, calibrated on rows
    known to be outside."""

    description = "membership inference from FedProto prototypes (nearest-prototype distance); AUC, advantage"
    party = "server"
    protocols = ("fedproto",)
    requires = ("prototypes",)
    primary_metric = "auc"
    metric_specs = {
        "auc": MetricSpec(True, True, "fraction", "ROC AUC of the membership score, mean over silos"),
        "auc_pooled": MetricSpec(True, True, "fraction", "ROC AUC of the membership score over all silos' candidates"),
        "advantage": MetricSpec(True, True, "fraction", "TPR - FPR of the calibrated member decisions"),
        "tpr": MetricSpec(True, True, "fraction", "share of member candidates declared members"),
        "fpr": MetricSpec(False, True, "fraction", "share of non-member candidates declared members"),
    }
    parameters = (
        Param(
            "score",
            "relative",
            "'relative' (distance gain over the empty row, per row norm) or 'distance'",
            choices=("relative", "distance"),
        ),
        Param("fpr", 0.1, "false-positive rate the threshold is calibrated to on the outside rows", gt=0, lt=1),
        Param("n_members", 100, "members (and as many non-members) per silo among the candidates (0: all)", ge=0),
        Param("n_calibration", 100, "rows of other silos known to be outside, per silo", ge=0),
    )

    def prior_knowledge(self, transcript: Transcript, rng: np.random.Generator) -> dict[str, Any]:
        """Per silo: candidate user ids and rows (members and outsiders, shuffled) and
        calibration rows of outsiders (disjoint from the candidates)."""
        parties, ids, R = _silo_rows(transcript)
        owner = np.full(R.shape[0], -1, dtype=np.int64)
        for h, u in enumerate(ids):
            owner[u] = h
        out: dict[str, Any] = {}
        nm, nc = int(self.config["n_members"]), int(self.config["n_calibration"])
        for h, party in enumerate(parties):
            members = ids[h]
            if nm and members.size > nm:
                members = rng.choice(members, size=nm, replace=False)
            outside = rng.permutation(np.flatnonzero((owner >= 0) & (owner != h)))
            non = outside[: members.size]
            calib = outside[members.size : members.size + (nc or outside.size)]
            cand = rng.permutation(np.concatenate([members, non]))
            out[party] = {"user_ids": cand, "rows": R[cand], "calibration": R[calib]}
        return {"silos": out}

    def applicable(self, view: View) -> tuple[bool, str]:
        return super().applicable(view)  # the base rule: every kind of ``requires``, in plaintext

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        victims: dict[str, dict[str, np.ndarray]] = {}
        q = 1.0 - float(self.config["fpr"])
        for party, know in knowledge.get("silos", {}).items():
            msgs = view.select("prototypes", sender=party)
            if not msgs or "prototypes" not in msgs[-1].payload:
                continue
            P = np.asarray(msgs[-1].payload["prototypes"], dtype=np.float64)
            s = membership_scores(know["rows"], P, self.config["score"])
            c = membership_scores(know["calibration"], P, self.config["score"])
            tau = float(np.quantile(c, q)) if c.size else float("inf")
            victims[party] = {
                "user_ids": np.asarray(know["user_ids"]),
                "scores": s,
                "member": s > tau,
                "threshold": np.asarray(tau),
            }
        if not victims:
            return self.unsupported("no silo's prototypes and candidates to test")
        return Reconstruction(self.name, self.party, victims, meta={"score": self.config["score"]})

    @staticmethod
    def _scored(reconstruction: Reconstruction, transcript: Transcript):
        """Per silo with members and non-members among its candidates: (party, candidate user
        ids, truth, scores, decisions)."""
        out = []
        for party, rec in reconstruction.victims.items():
            members = np.asarray(transcript.private(party).get("user_ids", np.zeros(0, dtype=np.int64)))
            y = np.isin(rec["user_ids"], members)
            if y.all() or not y.any():
                continue
            out.append(
                (party, np.asarray(rec["user_ids"]), y, np.asarray(rec["scores"]), np.asarray(rec["member"], bool))
            )
        return out

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        silos = self._scored(reconstruction, transcript)
        if not silos:
            return dict(self.baseline(transcript))
        y = np.concatenate([s[2] for s in silos])
        d = np.concatenate([s[4] for s in silos])
        tpr = float(d[y].mean())
        fpr = float(d[~y].mean())
        return {
            "auc": float(np.mean([auc(s[2], s[3]) for s in silos])),
            "auc_pooled": auc(y, np.concatenate([s[3] for s in silos])),
            "advantage": tpr - fpr,
            "tpr": tpr,
            "fpr": fpr,
        }

    @staticmethod
    def _users(reconstruction: Reconstruction) -> np.ndarray:
        """Every candidate user id of every silo, sorted: the victims of :meth:`victim_table`."""
        ids = [np.asarray(rec["user_ids"], dtype=np.int64) for rec in reconstruction.victims.values()]
        return np.unique(np.concatenate(ids)) if ids else np.zeros(0, dtype=np.int64)

    def _user_parts(self, silos, users: np.ndarray) -> dict[str, np.ndarray]:
        """Per user: its member / non-member candidacies and how many were declared members."""
        ids = np.searchsorted(users, np.concatenate([s[1] for s in silos]))
        y = np.concatenate([s[2] for s in silos])
        d = np.concatenate([s[4] for s in silos])
        n = users.size
        return {
            "members": np.bincount(ids, weights=y, minlength=n),
            "tp": np.bincount(ids, weights=y & d, minlength=n),
            "outsiders": np.bincount(ids, weights=~y, minlength=n),
            "fp": np.bincount(ids, weights=~y & d, minlength=n),
        }

    def victim_table(
        self, reconstruction: Reconstruction, transcript: Transcript, knowledge: dict[str, Any]
    ) -> VictimTable | None:
        """Per candidate user (``user:<id>``), over the silos that test it: ``tpr`` (declared
        a member where it is one) and ``fpr`` (declared one where it is not). The users are the
        unit that varies: they are drawn as candidates, while the silos are few and fixed; AUC
        and advantage are not ratios of per-user sums and are left out. None when the prior
        tests other silos than the attack (a silo with fewer than two calibration rows)."""
        silos = self._scored(reconstruction, transcript)
        prior = self._scored(self._prior_reconstruction(knowledge), transcript)
        if not silos or [s[0] for s in silos] != [s[0] for s in prior]:
            return None
        users = self._users(reconstruction)
        a, b = self._user_parts(silos, users), self._user_parts(prior, users)
        return VictimTable(
            [f"user:{u}" for u in users.tolist()],
            {"tpr": a["members"], "fpr": a["outsiders"]},
            {"tpr": a["tp"], "fpr": a["fp"]},
            {"tpr": b["tp"], "fpr": b["fp"]},
        )

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """The same decisions without the prototypes: a candidate unlike every known outsider is
        more likely a member (the silos' rows may differ in distribution). Score = the distance
        to the nearest calibration row (the attacker's own outside rows), threshold calibrated
        on the calibration rows' leave-one-out distances at the same FPR."""
        prior = self._prior_reconstruction(knowledge)
        if not prior.victims:
            return dict(self.baseline(transcript))
        return self.score(prior, transcript)

    def _prior_reconstruction(self, knowledge: dict[str, Any]) -> Reconstruction:
        victims: dict[str, dict[str, np.ndarray]] = {}
        q = 1.0 - float(self.config["fpr"])
        for party, know in knowledge.get("silos", {}).items():
            calib = know["calibration"]
            if calib.shape[0] < 2:
                continue
            s = -membership_scores(know["rows"], calib.toarray() if sp.issparse(calib) else calib, "distance")
            C = calib.toarray() if sp.issparse(calib) else np.asarray(calib, dtype=np.float64)
            d = np.maximum((C * C).sum(1)[:, None] - 2.0 * C @ C.T + (C * C).sum(1)[None, :], 0.0)
            np.fill_diagonal(d, np.inf)
            tau = float(np.quantile(d.min(axis=1), q))
            victims[party] = {"user_ids": np.asarray(know["user_ids"]), "scores": s, "member": s > tau}
        return Reconstruction(self.name, self.party, victims)

    def decisions(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, Decisions]:
        """Per candidate row and silo: the membership score, truth = member of the silo;
        groups = the candidate user (index into :meth:`victim_table`'s victims)."""
        labels, scores, ids = [], [], []
        for party, rec in reconstruction.victims.items():
            members = np.asarray(transcript.private(party).get("user_ids", np.zeros(0, dtype=np.int64)))
            labels.append(np.isin(rec["user_ids"], members))
            scores.append(np.asarray(rec["scores"], dtype=np.float64))
            ids.append(np.asarray(rec["user_ids"], dtype=np.int64))
        if not labels:
            return {}
        y = np.concatenate(labels)
        if y.all() or not y.any():
            return {}
        groups = np.searchsorted(self._users(reconstruction), np.concatenate(ids))
        return {"member": Decisions(np.concatenate(scores), y, positive="member row", groups=groups)}

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        return {
            "auc": 0.5,
            "auc_pooled": 0.5,
            "advantage": 0.0,
            "tpr": float(self.config["fpr"]),
            "fpr": float(self.config["fpr"]),
        }
