"""``generic-interaction-inference``: which changed rows of a recorded upload are positives.

Interaction-level membership inference (Yuan et al., "Interaction-level Membership Inference
Attack Against Federated Recommender Systems", WWW 2023) on a recorded Flower run whose clients
train item embeddings on implicit feedback with sampled negatives: every upload changes the rows
of the client's positives *and* of that round's negatives, so the changed-row set alone
(``generic-trained-items``) cannot tell them apart from one upload. The binary cross-entropy
moves a label-1 row along +d logit / d q_i and a label-0 row along the opposite direction; for a
GMF-type scorer that gradient is a multiple of one client vector, so the changes of one upload
are signed multiples of one direction. Each upload's changed rows are split by the sign of their
cosine with its oriented top right singular vector
(:func:`privaudit.attacks.ncf_interaction_inference.upload_scores`: the side whose size matches
the public negative ratio is the positives).

Over a client's first ``rounds`` uploads, an item's score is the mean of its cosine in each
upload, an upload that did not change its row counting -1 (a positive is trained every round,
negatives are re-drawn); items scoring above 0 are predicted. The negative ratio is public (the
app's run config, recorded as ``negatives``) or given as ``negatives``. Scored like
``generic-trained-items`` against the client's private ``items`` (its positives), with the same
held-out popularity prior.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.attacks._generic import changed_items, client_uploads, n_items
from privaudit.attacks.base import Reconstruction
from privaudit.attacks.generic_trained_items import GenericTrainedItems
from privaudit.attacks.ncf_interaction_inference import upload_scores
from privaudit.params import Param
from privaudit.registry import register_attack
from privaudit.transcript import Transcript, View


@register_attack("generic-interaction-inference")
class GenericInteractionInference(GenericTrainedItems):
    """Split each recorded upload's changed item rows into positives and sampled negatives."""

    null_keeps_ids = True  # scored among the uploaded rows: the null keeps them, values from a donor

    #: per (client, item): (mean cosine + 1) / 2 over the rounds read, 0 for rows never changed
    decision = ("positive", "positive item")
    description = (
        "recorded implicit-feedback runs with sampled negatives: the sign of each changed row along the "
        "upload's main direction tells positives from negatives (Yuan et al., WWW 2023)"
    )
    parameters = (
        Param("rounds", 1, "combine the scores of each client's first r uploads (-1: all)", ge=1, also=(-1,)),
        Param(
            "negatives",
            -1,
            "sampled negatives per positive (-1: the recorded run config's 'negatives')",
            ge=0,
            also=(-1,),
        ),
    )

    def _negatives(self, view: View | Transcript) -> int | None:
        if self.negatives >= 0:
            return int(self.negatives)
        value = view.config.get("negatives")
        return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else None

    def applicable(self, view: View) -> tuple[bool, str]:
        ok, reason = super().applicable(view)
        if ok and self._negatives(view) is None:
            return False, "the run config records no 'negatives' (give the attack parameter negatives=N)"
        return ok, reason

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        negatives, m = int(self._negatives(view) or 0), n_items(view)
        victims: dict[str, dict[str, np.ndarray]] = {}
        for party, ups in client_uploads(view).items():
            r = len(ups) if self.rounds == -1 else min(self.rounds, len(ups))
            total = np.zeros(m + 1)
            seen = np.zeros(m + 1, dtype=bool)
            for up in ups[:r]:
                items, cos = _upload_cosines(up, negatives, m)
                present = np.zeros(m + 1, dtype=bool)
                present[np.minimum(items, m)] = True
                total[np.minimum(items, m)] += cos
                total[~present] -= 1.0  # a row not trained this round: evidence of a re-drawn negative
                seen |= present
            ids = np.flatnonzero(seen[:m])
            score = total[ids] / max(r, 1)
            victims[party] = {"items": ids[score > 0], "seen_items": ids, "seen_share": (score + 1.0) / 2.0}
        return Reconstruction(self.name, self.party, victims, meta={"clients": len(victims), "negatives": negatives})


def _upload_cosines(up: Any, negatives: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(changed item ids, their signed cosine in [-1, 1]) of one upload; without the sent model
    (no deltas) every uploaded row scores 0 (undecided)."""
    if up.delta is None:
        items = changed_items(up)
        return items, np.zeros(items.size)
    moved = np.any(up.delta != 0, axis=1)
    return up.items[moved], upload_scores(up.delta[moved], negatives, m)
