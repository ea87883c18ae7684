"""``ncf-update-leak``: which items a FedNCF client trained, read off its plain upload.

Threat (FedNCF paper §1, §3.4; Gao et al. 2020): under plain MF-FedAvg/FedAvg/SimpleAvg a client
changes exactly the item-profile rows of its local training items -- its positives and the
negatives it sampled that round -- and uploads them (``item_update``: the row ids with the
changed rows; with a dense upload the server would diff against the global model it sent and
find the same rows). The honest-but-curious server therefore learns a superset of the
client's positives from one upload (recall 1), blurred by the negatives (precision about
1 / (1 + negatives) per round); positives are trained every round while negatives are
re-drawn, so intersecting the item sets of the client's first r uploads removes the
negatives (precision -> 1 as r grows).

Metrics (mean over the clients with at least r recorded uploads; ground truth = each client's
``private`` training positives): ``precision``, ``recall``, ``f1`` for r = ``rounds``
(-1: all recorded uploads of the client) and ``precision_r<j>`` / ``recall_r<j>`` for
j = 1..``table_rounds``. Baseline: guessing every item with probability 1/2 (precision =
|positives| / m, recall 1/2). Under ``secagg`` the uploads are masked and the attack does not
apply; under ``dp-sgd`` every row is noised and uploaded, so precision falls to |positives| / m.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.attacks.base import Attack, Reconstruction
from privaudit.params import Param
from privaudit.registry import register_attack
from privaudit.results import Decisions, MetricSpec
from privaudit.transcript import Transcript, View


def _prf(pred: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    tp = np.intersect1d(pred, truth).size
    precision = tp / pred.size if pred.size else 0.0
    recall = tp / truth.size if truth.size else float("nan")
    return precision, recall


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def client_truth(transcript: Transcript, party: str) -> np.ndarray:
    return np.asarray(transcript.private(party).get("items", np.zeros(0, dtype=np.int64)), dtype=np.int64)


def guess_baseline(transcript: Transcript, parties: list[str]) -> dict[str, float]:
    """Guess every item with probability 1/2: precision |pos|/m, recall 1/2."""
    m = int(transcript.config.get("n_items", 0)) or 1
    ps = [client_truth(transcript, p).size / m for p in parties]
    p = float(np.mean(ps)) if ps else float("nan")
    return {"precision": p, "recall": 0.5, "f1": _f1(p, 0.5)}


def popularity_baseline(transcript: Transcript, parties: list[str]) -> dict[str, float]:
    """Guess for every client the k most popular items, k = the median number of positives.

    Popularity and k are computed in hindsight from every client's true positives (an upper
    bound of what public popularity statistics give an attacker who sees no upload).
    Precision, recall and F1 averaged over ``parties`` like the attack's.
    """
    m = int(transcript.config.get("n_items", 0))
    everyone = [p for p in transcript.parties if p.startswith("client:")]
    truths = [client_truth(transcript, p) for p in everyone]
    nan = float("nan")
    if not m or not parties or not any(t.size for t in truths):
        return {"precision": nan, "recall": nan, "f1": nan}
    counts = np.bincount(np.concatenate(truths), minlength=m)
    k = max(1, int(np.median([t.size for t in truths if t.size])))
    guess = np.argsort(-counts, kind="stable")[:k]
    ps, rs = zip(*(_prf(guess, client_truth(transcript, p)) for p in parties))
    p, r = float(np.mean(ps)), float(np.nanmean(rs))
    return {"precision": p, "recall": r, "f1": _f1(p, r)}


def item_decisions(party_scores: dict[str, np.ndarray], transcript: Transcript, positive: str) -> dict[str, Decisions]:
    """One record per (victim, item): the attack's item score (m,) and whether it is a positive."""
    m = int(transcript.config.get("n_items", 0))
    labels, scores = [], []
    for party, sc in party_scores.items():
        truth = client_truth(transcript, party)
        labels.append(np.isin(np.arange(m), truth))
        scores.append(np.asarray(sc, dtype=np.float64)[:m])
    if not labels:
        return {}
    y = np.concatenate(labels)
    if y.all() or not y.any():
        return {}
    return {"positive": Decisions(np.concatenate(scores), y, positive=positive)}


PRF_SPECS = {
    "precision": MetricSpec(
        True, True, "fraction", "share of the items guessed as a client's positives that are positives"
    ),
    "recall": MetricSpec(True, True, "fraction", "share of a client's positives that are guessed"),
    "f1": MetricSpec(True, True, "fraction", "harmonic mean of precision and recall"),
}


@register_attack("ncf-update-leak")
class NCFUpdateLeak(Attack):
    """Recover a FedNCF client's positives from the rows its plain uploads changed (module docstring)."""

    description = (
        "FedNCF plain uploads: updated item rows reveal each client's training items (precision/recall of positives)"
    )
    party = "server"
    protocols = ("fedncf",)
    requires = ("item_update",)
    primary_metric = "precision"
    metric_specs = {
        **PRF_SPECS,
        **{
            f"{k}_r{j}": MetricSpec(True, True, "fraction", f"{k} after intersecting the first {j} uploads")
            for j in range(1, 21)
            for k in ("precision", "recall")
        },
        "victims": MetricSpec(True, False, "count", "clients attacked"),
    }
    default_sweep = ("rounds", (1, 2, 3, 4))
    parameters = (
        Param(
            "rounds", 1, "intersect the item sets of each client's first r recorded uploads (-1: all)", ge=1, also=(-1,)
        ),
        Param("table_rounds", 4, "also report precision/recall for r = 1..N", ge=0),
    )

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        sets: dict[str, list[np.ndarray]] = {}
        for m in view.select("item_update"):
            sets.setdefault(m.sender, []).append(np.unique(np.asarray(m.payload["items"], dtype=np.int64)))
        victims: dict[str, dict[str, np.ndarray]] = {}
        for party, seq in sets.items():
            out: dict[str, np.ndarray] = {"uploads": np.array([len(seq)], dtype=np.int64)}
            r = len(seq) if self.rounds == -1 else self.rounds
            if len(seq) >= r:
                out["items"] = _intersect(seq[:r])
                # the decision score of every item: in how many of those r uploads it was
                out["seen_items"], out["seen_counts"] = np.unique(np.concatenate(seq[:r]), return_counts=True)
            for j in range(1, self.table_rounds + 1):
                if len(seq) >= j:
                    out[f"items_r{j}"] = _intersect(seq[:j])
            victims[party] = out
        return Reconstruction(self.name, self.party, victims, meta={"clients": len(victims)})

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        metrics: dict[str, float] = {}
        keys = ["items"] + [f"items_r{j}" for j in range(1, self.table_rounds + 1)]
        for key in keys:
            ps, rs = [], []
            for party, rec in reconstruction.victims.items():
                if key in rec:
                    p, r = _prf(rec[key], client_truth(transcript, party))
                    ps.append(p)
                    rs.append(r)
            suffix = "" if key == "items" else "_" + key.split("_")[1]
            p = float(np.mean(ps)) if ps else float("nan")
            r = float(np.nanmean(rs)) if rs else float("nan")
            metrics[f"precision{suffix}"] = p
            metrics[f"recall{suffix}"] = r
            if key == "items":
                metrics["f1"] = _f1(p, r) if ps else float("nan")
                metrics["victims"] = float(len(ps))
        return metrics

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        parties = sorted({m.sender for m in transcript.select("item_update")})
        return guess_baseline(transcript, parties)

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """The k most popular items for every client (:func:`popularity_baseline`, hindsight)."""
        parties = sorted({m.sender for m in transcript.select("item_update")})
        out = popularity_baseline(transcript, parties)
        for j in range(1, self.table_rounds + 1):
            out[f"precision_r{j}"], out[f"recall_r{j}"] = out["precision"], out["recall"]
        out["victims"] = float(len(parties))
        return out

    def decisions(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, Decisions]:
        """Per (client, item): the share of the client's first r uploads holding the item."""
        m = int(transcript.config.get("n_items", 0))
        scores = {}
        for party, rec in reconstruction.victims.items():
            if "seen_items" in rec:
                sc = np.zeros(m)
                sc[rec["seen_items"]] = rec["seen_counts"] / max(int(rec["seen_counts"].max(initial=1)), 1)
                scores[party] = sc
        return item_decisions(scores, transcript, "training positive")


def _intersect(seq: list[np.ndarray]) -> np.ndarray:
    out = seq[0]
    for s in seq[1:]:
        out = np.intersect1d(out, s, assume_unique=True)
    return out
