"""Shared pieces of the FedMVMF attacks: scoring, baselines and the attack base class.

Scoring follows PrivMVMF paper eq. 43: the attacker clips ratings to the rating range
(InclUnc: ``[0, rating_max]``, 0 meaning unrated) and attributes to [0, 1], rounds, and the
accuracy is the fraction of exactly recovered values (over the uploaded items; with InclUnc
also on the truly rated items and of the rated/unrated decision, :func:`victim_scores`).
Reading a server view is in :mod:`~privaudit.attacks.mvmf._view`, the prior library (the
prior-only baseline and the attacks' knowledge) in :mod:`~privaudit.attacks.mvmf._prior`;
both are re-exported here for the FedMVMF attacks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from privaudit.attacks.base import Attack, Reconstruction
from privaudit.attacks.mvmf._prior import (
    PRIOR_STRATEGIES,
    PopulationPrior,
    PriorTable,
    population_prior,
    prior_baselines,
    prior_table,
)
from privaudit.attacks.mvmf._shards import histograms, majority
from privaudit.attacks.mvmf._view import (
    FEDMVMF_PROTOCOLS,
    REQUIRED_CONFIG,
    ClientUploads,
    FedMVMFView,
    FlatFedMVMFView,
    RoundUploads,
    client_sort_key,
    missing_config,
    parse_view,
    parse_view_flat,
    per_transcript,
    private_payloads,
    rating_domain,
    ratio,
    round_attributes,
    round_ratings,
    server_states,
    true_ratings,
)
from privaudit.metrics import majority_guess_accuracy, uniform_guess_accuracy
from privaudit.results import Decisions, MetricSpec, VictimTable
from privaudit.transcript import Transcript, View, is_client

__all__ = [
    "FEDMVMF_PROTOCOLS",
    "REQUIRED_CONFIG",
    "ClientUploads",
    "FedMVMFView",
    "FlatFedMVMFView",
    "RoundUploads",
    "client_sort_key",
    "missing_config",
    "parse_view",
    "parse_view_flat",
    "private_payloads",
    "rating_domain",
    "round_attributes",
    "round_ratings",
    "server_states",
    "PRIOR_STRATEGIES",
    "PopulationPrior",
    "PriorTable",
    "population_prior",
    "prior_baselines",
    "prior_table",
    "victim_scores",
    "score_reconstruction",
    "baselines",
    "rated_decisions",
    "MVMF_METRIC_SPECS",
    "MVMFAttack",
]


def victim_scores(recon: Reconstruction, transcript: Transcript) -> tuple[list[str], dict, dict]:
    """Per-victim numerators and denominators of :func:`score_reconstruction`'s ratio metrics.

    Returns ``(victims, weight, hits)``: the reconstruction's victims sorted by
    :func:`client_sort_key` (n,), and per metric (n,) float arrays of scored values and of exact
    guesses (``rated_detection_accuracy`` counts correct rated/unrated decisions over all items).
    A victim's optional ``rated`` (bool) and ``rated_ratings`` arrays are its guesses for the
    rated/unrated decision and for the rating of an item known to be rated (each metric's own
    Bayes decision); without them both follow ``ratings`` (rated = guess > 0).
    """
    victims = sorted(recon.victims, key=client_sort_key)
    n = len(victims)
    names = ("rating_accuracy", "rated_rating_accuracy", "rated_detection_accuracy", "attribute_accuracy")
    weight = {m: np.zeros(n) for m in names}
    hits = {m: np.zeros(n) for m in names}
    for k, party in enumerate(victims):
        guess = recon.victims[party]
        items = np.asarray(guess.get("items", np.empty(0, np.int64)), dtype=np.int64)
        if len(items):
            truth = true_ratings(transcript, party, items)
            g = np.asarray(guess["ratings"], dtype=np.float64)
            g_rated = np.asarray(guess.get("rated_ratings", g), dtype=np.float64)
            decided = np.asarray(guess["rated"], dtype=bool) if "rated" in guess else g > 0
            rated = truth > 0
            hits["rating_accuracy"][k] = np.sum(g == truth)
            weight["rating_accuracy"][k] = weight["rated_detection_accuracy"][k] = len(items)
            hits["rated_rating_accuracy"][k] = np.sum(g_rated[rated] == truth[rated])
            weight["rated_rating_accuracy"][k] = rated.sum()
            hits["rated_detection_accuracy"][k] = np.sum(decided == rated)
        if "attributes" in guess:
            true_x = np.asarray(transcript.private(party).get("attributes", np.empty(0)), dtype=np.float64)
            gx = np.asarray(guess["attributes"], dtype=np.float64)
            if true_x.shape == gx.shape:
                hits["attribute_accuracy"][k] = np.sum(gx == true_x)
                weight["attribute_accuracy"][k] = gx.size
    return victims, weight, hits


def score_reconstruction(
    recon: Reconstruction, transcript: Transcript, scores: tuple[list[str], dict, dict] | None = None
) -> dict[str, float]:
    """Rating and attribute accuracy (PrivMVMF paper eq. 43) over all attacked victims.

    Each victim's reconstruction holds ``items`` (the uploaded item ids it guessed),
    ``ratings`` (rounded guesses, 0 = unrated) and ``attributes`` (rounded dummies); the
    accuracies are the sums of :func:`victim_scores` over the victims (``scores``: its result
    when the caller has it).
    """
    victims, weight, hits = victim_scores(recon, transcript) if scores is None else scores
    order = ("rating_accuracy", "attribute_accuracy", "rated_rating_accuracy", "rated_detection_accuracy")
    out = {m: ratio(hits[m], weight[m]) for m in order}
    out["victims"] = float(len(victims))
    if not transcript.config.get("attribute_names", True):  # a dataset without user attributes
        del out["attribute_accuracy"]
    return out


def baselines(transcript: Transcript) -> dict[str, float]:
    """Random-guess and majority-class accuracies for ratings and attributes.

    The uniform guess draws from the value domain: the rating grid (with 0 added when unrated
    items are uploaded too, InclUnc or sampling) and {0, 1} for dummies. The majority guess
    always answers the most frequent true value (computed over all victims' uploaded items).
    Computed once per transcript (:func:`per_transcript`); a copy is returned.
    """
    return dict(_baselines(transcript))


@per_transcript
def _baselines(transcript: Transcript) -> dict[str, float]:
    cfg = transcript.config
    lo, hi = rating_domain(cfg)
    step = float(cfg.get("rating_step", 1.0) or 1.0)
    domain = int(round((hi - lo) / step)) + 1
    server_view = transcript.view("server") if "server" in transcript.parties else None
    truths = []
    attrs = []
    if server_view is not None:
        seen: set[str] = set()
        for m in server_view.select("grad_V"):
            if m.sender in seen:
                continue
            seen.add(m.sender)
            if "items" in m.payload:
                truths.append(true_ratings(transcript, m.sender, np.asarray(m.payload["items"], dtype=np.int64)))
    for party in transcript.parties:
        if is_client(party):
            x = transcript.private(party).get("attributes")
            if x is not None:
                attrs.append(np.asarray(x, dtype=np.float64))
    nan = float("nan")
    all_truth = np.concatenate(truths) if truths else np.empty(0)
    all_attrs = np.concatenate(attrs) if attrs else np.empty(0)
    out = {
        "rating_accuracy": uniform_guess_accuracy(domain),
        "attribute_accuracy": uniform_guess_accuracy(2),
        "rating_accuracy_majority": majority_guess_accuracy(all_truth) if len(all_truth) else nan,
        "attribute_accuracy_majority": majority_guess_accuracy(all_attrs) if len(all_attrs) else nan,
    }
    if not cfg.get("attribute_names", True):  # a dataset without user attributes: no attribute metrics
        del out["attribute_accuracy"], out["attribute_accuracy_majority"]
    return out


def rated_decisions(recon: Reconstruction, transcript: Transcript) -> dict[str, Decisions]:
    """Rated-vs-unrated decisions over every uploaded (victim, item): truth = really rated;
    ``groups`` is the victim's position in :func:`victim_scores`'s order (its VictimTable row).

    The score is the reconstruction's ``rated_score`` (the attack's log-likelihood ratio of
    "rated" over "unrated") where present, else its 0/1 decision (guessed rating > 0). Empty
    when every uploaded item is rated (ObsOnly without sampling: nothing to decide).
    """
    labels, scores, groups = [], [], []
    private = private_payloads(transcript)
    for k, party in enumerate(sorted(recon.victims, key=client_sort_key)):
        guess = recon.victims[party]
        items = np.asarray(guess.get("items", np.empty(0, np.int64)), dtype=np.int64)
        if not len(items):
            continue
        labels.append(true_ratings(private, party, items) > 0)
        groups.append(np.full(len(items), k, dtype=np.int64))
        s = guess.get("rated_score")
        decided = (np.asarray(guess["ratings"]) > 0).astype(float)
        scores.append(np.asarray(s, dtype=np.float64) if s is not None else decided)
    if not labels:
        return {}
    y, s = np.concatenate(labels), np.nan_to_num(np.concatenate(scores), nan=0.0, posinf=1e300, neginf=-1e300)
    if y.all() or not y.any():
        return {}
    return {
        "rated": Decisions(
            s, y, positive="really rated item", meta={"attack": recon.attack}, groups=np.concatenate(groups)
        )
    }


MVMF_METRIC_SPECS = {
    "rating_accuracy": MetricSpec(
        True, True, "fraction", "share of uploaded items whose rating (0 = unrated) is guessed exactly"
    ),
    "attribute_accuracy": MetricSpec(True, True, "fraction", "share of user attribute dummies guessed exactly"),
    "rated_rating_accuracy": MetricSpec(
        True, True, "fraction", "share of really rated uploaded items whose rating is guessed exactly"
    ),
    "rated_detection_accuracy": MetricSpec(
        True, True, "fraction", "share of uploaded items correctly decided rated or unrated"
    ),
    "victims": MetricSpec(True, False, "count", "number of clients attacked"),
}


class MVMFAttack(Attack):
    """Base of the FedMVMF/PrivMVMF server attacks: what they target and how they are scored
    (eq. 43 through :func:`score_reconstruction`, baselines through :func:`baselines` and
    :func:`prior_baselines`, rated/unrated decisions through :func:`rated_decisions`)."""

    party = "server"
    protocols = FEDMVMF_PROTOCOLS
    primary_metric = "rating_accuracy"
    metric_specs = MVMF_METRIC_SPECS

    def applicable(self, view: View) -> tuple[bool, str]:
        return super().applicable(view)  # the base rule: every kind of ``requires``, in plaintext

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        return score_reconstruction(reconstruction, transcript, self._victim_scores(reconstruction, transcript))

    def _victim_scores(self, reconstruction: Reconstruction, transcript: Transcript) -> tuple[list[str], dict, dict]:
        """:func:`victim_scores`, kept for the last (reconstruction, transcript) pair: :meth:`score`
        and :meth:`victim_table` of one evaluation share it (read only)."""
        last = self.__dict__.get("_last_scores")
        if last is not None and last[0] is reconstruction and last[1] is transcript:
            return last[2]
        out = victim_scores(reconstruction, transcript)
        self.__dict__["_last_scores"] = (reconstruction, transcript, out)
        return out

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        return baselines(transcript)

    def prior_knowledge(self, transcript: Transcript, rng: np.random.Generator) -> dict[str, Any]:
        """The population's published marginals (:class:`PopulationPrior`, built on first use)."""
        return {"population": PopulationPrior(transcript)}

    def _prior_table(self, transcript: Transcript, knowledge: dict[str, Any] | None) -> PriorTable:
        prior = population_prior(knowledge)
        return prior.table if prior is not None and prior._transcript is transcript else prior_table(transcript)

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """The prior library, chosen on held-out victims (:func:`prior_baselines`; hindsight marginals)."""
        return prior_baselines(transcript, self._prior_table(transcript, knowledge))

    def shard_part(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, Any]:
        """One block of a sharded run (:func:`privaudit.sharded.attack_shards`): its victims, the
        sums of :func:`victim_scores`' hits and weights per metric, and the histograms of the true
        values behind the majority baselines (:func:`privaudit.attacks.mvmf._shards.histograms`)."""
        victims, weight, hits = victim_scores(reconstruction, transcript)
        out: dict[str, Any] = {"victims": len(victims), "ratings": {}, "attributes": {}}
        out["hits"] = {m: float(hits[m].sum()) for m in weight}
        out["weight"] = {m: float(weight[m].sum()) for m in weight}
        histograms(transcript, out)
        return out

    @classmethod
    def merge_shards(cls, parts: list[dict[str, Any]], config: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        """The metrics of :func:`score_reconstruction` (hits and weights summed over the blocks,
        equal to the merged transcript's: they are counts) and the uniform and majority-value
        baselines of :func:`baselines` from the summed histograms of true values."""
        hits = {m: sum(p["hits"].get(m, 0.0) for p in parts) for m in parts[0]["hits"]}
        weight = {m: sum(p["weight"].get(m, 0.0) for p in parts) for m in parts[0]["weight"]}
        metrics = {m: hits[m] / weight[m] if weight[m] > 0 else float("nan") for m in hits}
        metrics["victims"] = float(sum(p["victims"] for p in parts))
        lo, hi = rating_domain(config)
        step = float(config.get("rating_step", 1.0) or 1.0)
        baseline = {
            "rating_accuracy": uniform_guess_accuracy(int(round((hi - lo) / step)) + 1),
            "attribute_accuracy": uniform_guess_accuracy(2),
            "rating_accuracy_majority": majority(parts, "ratings"),
            "attribute_accuracy_majority": majority(parts, "attributes"),
        }
        return {"metrics": metrics, "baseline": baseline}

    def victim_table(
        self, reconstruction: Reconstruction, transcript: Transcript, knowledge: dict[str, Any]
    ) -> VictimTable | None:
        """Per-victim parts of :meth:`score`'s accuracies and of :meth:`prior_baseline`'s.

        Holds the metrics whose per-victim denominators agree between the two (the attack scored
        each victim's first upload). With a victim subsample (``mvmf-nonlinear``'s ``users``) the
        prior's rows are those of the attacked victims, so ``value(m, "prior")`` is the prior on
        them (``prior_baseline`` covers every client). None when a victim is not a client the
        prior covers.
        """
        victims, weight, hits = self._victim_scores(reconstruction, transcript)
        table = self._prior_table(transcript, knowledge)
        where = {p: k for k, p in enumerate(table.victims)}
        if not victims or any(p not in where for p in victims):
            return None
        idx = np.fromiter((where[p] for p in victims), dtype=np.int64, count=len(victims))
        scored = set(weight) if transcript.config.get("attribute_names", True) else set(weight) - {"attribute_accuracy"}
        keep = [m for m in table.hits if m in scored and np.array_equal(weight[m], table.weight[m][idx])]
        if not keep:
            return None
        return VictimTable(
            victims,
            {m: weight[m] for m in keep},
            {m: hits[m] for m in keep},
            {m: table.hits[m][idx] for m in keep},
        )

    def decisions(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, Decisions]:
        return rated_decisions(reconstruction, transcript)
