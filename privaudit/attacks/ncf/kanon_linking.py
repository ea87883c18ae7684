"""``ncf-kanon-linking``: break FedNCF's per-round k-anonymity under secure aggregation (FedNCF paper §3.5.2).

Under MF-SecAvg the server learns per round only the sums and the per-item counts
``counts_t[k]`` = number of cohort members that updated item k (Algorithm 1). A server that
controls client selection (``selection=adversarial``) picks a cohort S + {target} in round 2j
and S alone in round 2j+1 (j = 0..R-1). Then

    d_j[k] = counts_2j[k] - counts_2j+1[k] = P_target,2j[k] + (noise of S's re-drawn negatives)

S's positives are trained in both rounds and cancel; the target's positives give 1 in every
pair, its sampled negatives (the *blurring* of §3.5.2) and S's negatives change from round to
round. The attack averages d_j over the first ``rounds`` pairs and predicts the items whose
mean is at least ``threshold``. One pair recovers positives and negatives alike
(precision about 1 / (1 + negatives)); more pairs average the blurring away.

Metrics: ``precision``, ``recall``, ``f1`` of the target's training positives (its ``private``
message), ``pairs`` used and ``k`` (mean cohort size of the manipulated rounds: the nominal
k-anonymity). Baseline: guessing every item with probability 1/2; prior-only: the target's k
items most rated by the other clients, k chosen on the other clients. Needs the ``cohort`` and
``aggregate`` messages of the manipulated rounds (``record_rounds`` >= 2R); the cohort pairs are
found in the view, so a random-selection transcript makes the attack inapplicable.
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


@register_attack("ncf-kanon-linking")
class NCFKAnonLinking(OneTarget):
    """Difference per-item counts of cohorts with and without the target (module docstring)."""

    null_arm = False  # it reads server-side per-item counts, which a null view of clients does not reach

    description = (
        "FedNCF under secagg: adversarial cohorts with/without the target link items to it via per-item counts (§3.5.2)"
    )
    party = "server"
    protocols = ("fedncf",)
    requires = ("cohort", "aggregate")
    primary_metric = "precision"
    metric_specs = {
        **PRF_SPECS,
        "pairs": MetricSpec(True, False, "count", "manipulated round pairs used"),
        "k": MetricSpec(True, False, "count", "mean cohort size of the manipulated rounds (nominal k-anonymity)"),
    }
    default_sweep = ("rounds", (1, 2, 3, 4))
    parameters = (
        Param("rounds", -1, "manipulated round pairs to use (-1: all found in the view)", ge=1, also=(-1,)),
        Param("threshold", 0.5, "predict an item when its mean count difference is at least this"),
    )

    def applicable(self, view: View) -> tuple[bool, str]:
        ok, reason = super().applicable(view)
        if not ok:
            return ok, reason
        if int(view.config.get("target", -1)) < 0:
            return False, "the transcript has no adversarial selection (no target; set selection=adversarial)"
        if not self._pairs(view):
            return False, "the view holds no pair of rounds with the same cohort with and without the target"
        return True, ""

    @staticmethod
    def _pairs(view: View) -> list[tuple[int, int]]:
        target = int(view.config.get("target", -1))
        cohorts = {m.round: np.asarray(m.payload["clients"], dtype=np.int64) for m in view.select("cohort")}
        counted = {m.round for m in view.select("aggregate")}
        pairs = []
        for r in sorted(cohorts):
            c0, c1 = cohorts[r], cohorts.get(r + 1)
            if c1 is None or r not in counted or (r + 1) not in counted or target not in c0:
                continue
            if np.array_equal(np.sort(c0[c0 != target]), np.sort(c1)):
                pairs.append((r, r + 1))
        return pairs

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        target = int(view.config["target"])
        pairs = self._pairs(view)
        if self.rounds != -1:
            pairs = pairs[: self.rounds]
        counts = {m.round: np.asarray(m.payload["counts"], dtype=np.int64) for m in view.select("aggregate")}
        ks = {m.round: int(m.meta.get("k", len(m.payload["clients"]))) for m in view.select("cohort")}
        diffs = np.stack([counts[a] - counts[b] for a, b in pairs]).astype(np.float64)
        score = diffs.mean(axis=0)
        pred = np.flatnonzero(score >= self.threshold).astype(np.int64)
        party = f"client:{target}"
        meta = {
            "pairs": len(pairs),
            "k": float(np.mean([ks[a] for a, _ in pairs] + [ks[b] for _, b in pairs])),
            "k_per_round": [ks[r] for pair in pairs for r in pair],
        }
        return Reconstruction(self.name, self.party, {party: {"items": pred, "score": score}}, meta=meta)

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        ((party, rec),) = reconstruction.victims.items()
        p, r = set_precision_recall(rec["items"], client_truth(transcript, party))
        return {
            "precision": p,
            "recall": r,
            "f1": f1_score(p, r),
            "pairs": float(reconstruction.meta["pairs"]),
            "k": float(reconstruction.meta["k"]),
        }

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        target = int(transcript.config.get("target", -1))
        parties = [f"client:{target}"] if target >= 0 else []
        return guess_baseline(transcript, parties)

    def _prior(self, transcript: Transcript) -> tuple[float, float] | None:
        """The target's (precision, recall) under the popularity strategy with the best mean F1
        over the other clients (:func:`popularity_strategies`: held out, the target excluded)."""
        target = int(transcript.config.get("target", -1))
        if target < 0:
            return None
        return target_prior(transcript, f"client:{target}")

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """The target's guess from item popularity alone (:meth:`_prior`)."""
        prior = self._prior(transcript)
        if prior is None:
            nan = float("nan")
            return {"precision": nan, "recall": nan, "f1": nan, "pairs": 0.0, "k": nan}
        p, r = prior
        return {"precision": p, "recall": r, "f1": f1_score(p, r), "pairs": 0.0, "k": float("nan")}
