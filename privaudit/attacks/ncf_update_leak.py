"""``ncf-update-leak``: which items a FedNCF client trained, read off its plain upload.

Threat (fedncf.txt §1, §3.4; Gao et al. 2020): under plain MF-FedAvg/FedAvg/SimpleAvg a client
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


@register_attack("ncf-update-leak")
class NCFUpdateLeak(Attack):
    """Recover a FedNCF client's positives from the rows its plain uploads changed (module docstring)."""

    description = "FedNCF plain uploads: updated item rows reveal each client's training items (precision/recall of positives)"
    party = "server"
    protocols = ("fedncf",)
    requires = ("item_update",)
    primary_metric = "precision"
    default_sweep = ("rounds", (1, 2, 3, 4))
    parameters = (
        Param("rounds", 1, "intersect the item sets of each client's first r recorded uploads (-1: all)", ge=1, also=(-1,)),
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


def _intersect(seq: list[np.ndarray]) -> np.ndarray:
    out = seq[0]
    for s in seq[1:]:
        out = np.intersect1d(out, s, assume_unique=True)
    return out
