"""The ``uploaded-items`` attack: a client rated exactly the items whose rows it uploads."""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.attacks.base import Attack, Reconstruction
from privaudit.params import Param
from privaudit.results import MetricSpec, VictimTable
from privaudit.transcript import Transcript, View


class UploadedItems(Attack):
    """The server guesses, for every client and item, "rated" iff the client uploaded that item's row.

    Exact against FedMVMF's ``obsonly`` uploads; unrated items a defense adds (``sampling``)
    become false positives.
    """

    description = "server: a client rated the items whose grad_V rows it uploads (plugin example)"
    party = "server"
    protocols = ("fedmvmf", "privmvmf", "item-means")
    requires = ("grad_V",)
    primary_metric = "accuracy"
    parameters = (Param("round", 0, "the recorded round whose uploads are read", ge=0),)
    metric_specs = {
        "accuracy": MetricSpec(
            True, True, "fraction", "share of (client, item) pairs whose rated/unrated status is guessed right"
        ),
        "victims": MetricSpec(True, False, "clients", "clients attacked"),
    }

    def applicable(self, view: View) -> tuple[bool, str]:
        """The base rule (``grad_V`` uploads present in plaintext), then a round to read."""
        ok, reason = super().applicable(view)
        if ok and not view.select("grad_V", round=self.config["round"]):
            return False, f"no grad_V uploads in round {self.config['round']}"
        return ok, reason

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        victims = {}
        for m in view.select("grad_V", round=self.config["round"]):
            victims[m.sender] = {"items": np.unique(np.asarray(m.payload["items"], dtype=np.int64))}
        return Reconstruction(self.name, self.party, victims)

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        table = self._table(reconstruction, transcript)
        return {"accuracy": table.value("accuracy"), "victims": float(len(reconstruction.victims))}

    def victim_table(
        self, reconstruction: Reconstruction, transcript: Transcript, knowledge: dict[str, Any]
    ) -> VictimTable:
        """Per victim: its items (the denominator), the pairs the attack and the majority guess
        get right (the numerators); accuracy over any set of victims is the ratio of the sums."""
        return self._table(reconstruction, transcript)

    def _table(self, reconstruction: Reconstruction, transcript: Transcript) -> VictimTable:
        m = int(transcript.config["n_items"])
        victims = sorted(reconstruction.victims)
        hits, prior = [], []
        for party in victims:
            truth = np.zeros(m, dtype=bool)
            truth[transcript.private(party)["items"]] = True
            guessed = np.zeros(m, dtype=bool)
            guessed[reconstruction.victims[party]["items"]] = True
            hits.append(float(np.sum(truth == guessed)))
            prior.append(float(m - truth.sum()))  # the majority guess "unrated" for every item
        weight = [float(m)] * len(victims)
        return VictimTable(victims, {"accuracy": weight}, {"accuracy": hits}, {"accuracy": prior})

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        """A uniform random guess per (client, item): accuracy 1/2."""
        return {"accuracy": 0.5, "victims": 0.0}

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """Without the uploads the best guess is the majority, "unrated": accuracy 1 - density."""
        m = int(transcript.config["n_items"])
        clients = transcript.clients()
        rated = sum(len(transcript.private(p).get("items", ())) for p in clients)
        return {"accuracy": 1.0 - rated / (m * len(clients)) if clients and m else float("nan"), "victims": 0.0}
