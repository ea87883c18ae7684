"""``generic-attribute-inference``: user attributes from item uploads and an auxiliary labelled set.

Attribute inference against federated recommendation (Zhang et al., "Comprehensive Privacy
Analysis on Federated Recommender System against Attribute Inference Attacks", IEEE TKDE
2023): the server knows the attributes of a fraction ``aux_fraction`` of the clients (an
auxiliary labelled set: users who shared their profile) and trains a classifier from what each
client uploaded to its attributes, then applies it to every other client. Applies to any
transcript with ``item_update`` messages. Features per client: the multi-hot vector of the
items whose rows its uploads changed (its trained items), scaled to unit norm. Classifier: one
multinomial logistic regression (scikit-learn) per attribute group, the groups being the
``group=value`` prefixes of the public ``attribute_names`` (one-hot blocks).

Metrics over the non-auxiliary clients with ground truth: ``accuracy`` (mean over groups of the
share of clients whose category is predicted), ``accuracy_<group>`` per group. Random
baseline: a uniform guess among a group's categories. Prior-only baseline: the auxiliary set's
majority category of each group (what the attacker knows without the victims' messages).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.attacks.base import Attack, Reconstruction
from privaudit.attacks.generic._uploads import (
    changed_items,
    client_uploads,
    missing_note,
    n_items,
    uploaders,
)
from privaudit.params import Param
from privaudit.registry import register_attack
from privaudit.results import Decisions, MetricSpec, VictimTable
from privaudit.transcript import Transcript, View


def attribute_groups(names: list[str], p: int) -> dict[str, np.ndarray]:
    """Group name -> column indices, from ``group=value`` names (one group per column otherwise)."""
    if len(names) != p:
        names = [f"attribute{j}" for j in range(p)]
    groups: dict[str, list[int]] = {}
    for j, name in enumerate(names):
        groups.setdefault(str(name).split("=", 1)[0], []).append(j)
    return {g: np.asarray(cols) for g, cols in groups.items()}


def _labels(transcript: Transcript, parties: list[str]) -> tuple[list[str], np.ndarray]:
    rows, keep = [], []
    for p in parties:
        a = transcript.private(p).get("attributes")
        if a is not None and np.asarray(a).size:
            rows.append(np.asarray(a, dtype=float).ravel())
            keep.append(p)
    if not rows:
        return [], np.zeros((0, 0))
    width = min(r.size for r in rows)
    return keep, np.stack([r[:width] for r in rows])


@register_attack("generic-attribute-inference")
class GenericAttributeInference(Attack):
    """Infer each client's attributes from its uploads with a classifier trained on an auxiliary set."""

    null_keeps_ids = False  # its features are the uploaded id set: the null arm reads a donor's

    description = (
        "any recorder with item-embedding uploads: attributes from uploaded rows + auxiliary labelled users "
        "(Zhang et al., IEEE TKDE 2023)"
    )
    party = "server"
    protocols = ("flower",)  # recorded runs; within them the attack chooses itself by message kinds
    requires = ("item_update",)
    primary_metric = "accuracy"
    parameters = (
        Param(
            "aux_fraction",
            0.5,
            "share of the clients whose attributes the attacker knows (auxiliary labelled set)",
            gt=0,
            lt=1,
        ),
    )
    metric_specs = {
        "accuracy": MetricSpec(
            True, True, "fraction", "mean over attribute groups of the share of targets whose category is inferred"
        ),
        **{
            f"accuracy_{g}": MetricSpec(True, True, "fraction", f"share of targets whose {g} is inferred")
            for g in ("age", "gender", "occupation", "region")
        },
        "targets": MetricSpec(True, False, "count", "clients attacked (outside the auxiliary set)"),
        "aux": MetricSpec(True, False, "count", "clients in the auxiliary labelled set"),
    }

    def applicable(self, view: View) -> tuple[bool, str]:
        ok, reason = super().applicable(view)
        return ok, reason + ("" if ok else missing_note(view))

    def _clients(self, transcript: Transcript) -> list[str]:
        return uploaders(transcript)

    def prior_knowledge(self, transcript: Transcript, rng: np.random.Generator) -> dict[str, Any]:
        """The auxiliary labelled set: attributes of a random ``aux_fraction`` of the clients."""
        parties, labels = _labels(transcript, self._clients(transcript))
        if not parties:
            return {"aux": {}}
        k = min(max(1, int(round(self.aux_fraction * len(parties)))), len(parties) - 1) if len(parties) > 1 else 0
        pick = np.sort(rng.choice(len(parties), size=k, replace=False)) if k else np.zeros(0, dtype=int)
        return {"aux": {parties[i]: labels[i] for i in pick}}

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        from sklearn.linear_model import LogisticRegression

        aux: dict[str, np.ndarray] = knowledge.get("aux", {})
        ups = client_uploads(view)
        m = n_items(view)
        parties = sorted(ups)
        X = np.zeros((len(parties), m))
        for row, p in enumerate(parties):
            for up in ups[p]:
                items = changed_items(up)
                X[row, items[items < m]] = 1.0
        X /= np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
        train = [i for i, p in enumerate(parties) if p in aux]
        targets = [i for i, p in enumerate(parties) if p not in aux]
        if not train or not targets:
            return self.unsupported("the auxiliary labelled set or the target set is empty")
        Y = np.stack([aux[parties[i]] for i in train])
        groups = attribute_groups(list(view.config.get("attribute_names", [])), Y.shape[1])
        probs = np.zeros((len(targets), Y.shape[1]))
        for cols in groups.values():
            y = np.argmax(Y[:, cols], axis=1)
            classes = np.unique(y)
            if classes.size == 1:
                probs[:, cols[classes[0]]] = 1.0
                continue
            clf = LogisticRegression(max_iter=1000, C=1.0).fit(X[train], y)
            probs[:, cols[clf.classes_]] = clf.predict_proba(X[targets])
        victims = {}
        for row, i in enumerate(targets):
            pred = np.zeros(Y.shape[1])
            for cols in groups.values():
                pred[cols[np.argmax(probs[row, cols])]] = 1.0
            victims[parties[i]] = {"attributes": pred, "scores": probs[row]}
        return Reconstruction(self.name, self.party, victims, meta={"aux": len(train), "targets": len(targets)})

    def _correct(self, transcript: Transcript, preds: dict[str, np.ndarray]):
        """(parties with truth, group names, (n, n_groups) bool: category inferred)."""
        parties, truth = _labels(transcript, list(preds))
        if not parties:
            return [], [], np.zeros((0, 0), dtype=bool)
        P = np.stack([preds[p][: truth.shape[1]] for p in parties])
        groups = attribute_groups(list(transcript.config.get("attribute_names", [])), truth.shape[1])
        hit = np.stack(
            [np.argmax(P[:, cols], axis=1) == np.argmax(truth[:, cols], axis=1) for cols in groups.values()], axis=1
        )
        return parties, list(groups), hit

    def _table_parts(self, hit: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
        """Per target: the share of its groups inferred (``accuracy``) and each reported group's hit."""
        out = {
            f"accuracy_{g}": hit[:, j].astype(float)
            for j, g in enumerate(names)
            if f"accuracy_{g}" in self.metric_specs
        }
        out["accuracy"] = hit.mean(axis=1)
        return out

    def _score_rows(self, transcript: Transcript, preds: dict[str, np.ndarray]) -> dict[str, float]:
        parties, names, hit = self._correct(transcript, preds)
        if not parties:
            return {"accuracy": float("nan"), "targets": 0.0}
        out = {k: float(v.mean()) for k, v in self._table_parts(hit, names).items()}
        out["targets"] = float(len(parties))
        return out

    def _majority(self, knowledge: dict[str, Any], transcript: Transcript) -> np.ndarray | None:
        """Per attribute group, the auxiliary set's most frequent category (one-hot row)."""
        aux: dict[str, np.ndarray] = knowledge.get("aux", {})
        if not aux:
            return None
        Y = np.stack(list(aux.values()))
        majority = np.zeros(Y.shape[1])
        for cols in attribute_groups(list(transcript.config.get("attribute_names", [])), Y.shape[1]).values():
            majority[cols[np.argmax(Y[:, cols].sum(axis=0))]] = 1.0
        return majority

    def victim_table(
        self, reconstruction: Reconstruction, transcript: Transcript, knowledge: dict[str, Any]
    ) -> VictimTable | None:
        """Per target: 1/0 per reported attribute group and the share of its groups inferred
        (weight 1: every metric is a mean over targets)."""
        majority = self._majority(knowledge, transcript)
        parties, names, hit = self._correct(transcript, {p: r["attributes"] for p, r in reconstruction.victims.items()})
        if not parties or majority is None:
            return None
        _, _, prior_hit = self._correct(transcript, {p: majority for p in parties})
        attack = self._table_parts(hit, names)
        return VictimTable(
            parties, {k: np.ones(len(parties)) for k in attack}, attack, self._table_parts(prior_hit, names)
        )

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        out = self._score_rows(transcript, {p: r["attributes"] for p, r in reconstruction.victims.items()})
        out["aux"] = float(reconstruction.meta.get("aux", 0))
        return out

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        parties, truth = _labels(transcript, self._clients(transcript))
        if not parties:
            return {"accuracy": float("nan"), "targets": 0.0, "aux": 0.0}
        groups = attribute_groups(list(transcript.config.get("attribute_names", [])), truth.shape[1])
        per_group = {g: 1.0 / len(cols) for g, cols in groups.items()}
        out = {f"accuracy_{g}": v for g, v in per_group.items() if f"accuracy_{g}" in self.metric_specs}
        out["accuracy"] = float(np.mean(list(per_group.values())))
        out.update({"targets": float(len(parties)), "aux": 0.0})
        return out

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """Per attribute group, the auxiliary set's majority category for every target. The
        auxiliary clients are the attacker's knowledge and never targets, so the choice is
        already made on held-out clients; among constant guesses it is the best per group."""
        majority = self._majority(knowledge, transcript)
        if majority is None:
            return self.baseline(transcript)
        aux = knowledge["aux"]
        out = self._score_rows(transcript, {p: majority for p in self._clients(transcript) if p not in aux})
        out["aux"] = float(len(aux))
        return out

    def decisions(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, Decisions]:
        """Per (target, attribute column): the classifier's probability that the column is 1."""
        parties, truth = _labels(transcript, list(reconstruction.victims))
        if not parties:
            return {}
        scores = np.concatenate([reconstruction.victims[p]["scores"][: truth.shape[1]] for p in parties])
        groups = np.repeat(np.arange(len(parties)), truth.shape[1])
        return {"attribute": Decisions(scores, truth.ravel() > 0.5, "attribute value held", groups=groups)}
