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
|positives| / m, recall 1/2). Prior-only baseline: the k items most rated by the other clients
(:func:`popularity_strategies`, k chosen on held-out clients). Under ``secagg`` the uploads are masked and the attack does not
apply; under ``dp-sgd`` every row is noised and uploaded, so precision falls to |positives| / m.

Decoders (``decoder``). ``intersection`` is the read above (every item of the intersected
uploads: recall 1). The default ``posterior`` combines the uploads with the popularity the
attacker knows without them (:class:`ItemPopularity`, each client left out) by Bayes' rule: per
item a popularity prior, a likelihood of "in how many of the r uploads" fitted by EM from the
uploads alone (:func:`_posterior_decode`), and each client's posterior-expected number of items
of highest posterior. When every client uploads every row (or sets unrelated to its positives)
the likelihood is flat and the decoder is the popularity guess of the prior library; with one
plain upload it beats both the read above and the prior (F1 0.518 vs 0.396 and 0.442 in
``tests/test_ncf_attacks.py``). The prior library's "own k" is the k the client's first upload
size reveals (:func:`upload_k`), not its true count, which no message-free guess knows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.attack_metrics import f1_score, set_precision_recall
from privaudit.attacks.base import Attack, Reconstruction
from privaudit.attacks.generic._uploads import cross_fit, n_items, ratio
from privaudit.params import Param
from privaudit.registry import register_attack
from privaudit.results import Decisions, MetricSpec, VictimTable
from privaudit.transcript import Transcript, View


def client_truth(transcript: Transcript, party: str) -> np.ndarray:
    return np.asarray(transcript.private(party).get("items", np.zeros(0, dtype=np.int64)), dtype=np.int64)


def guess_baseline(transcript: Transcript, parties: list[str]) -> dict[str, float]:
    """Guess every item with probability 1/2: precision |pos|/m, recall 1/2."""
    m = int(transcript.config.get("n_items", 0)) or 1
    ps = [client_truth(transcript, p).size / m for p in parties]
    p = float(np.mean(ps)) if ps else float("nan")
    return {"precision": p, "recall": 0.5, "f1": f1_score(p, 0.5)}


def popularity_strategies(
    transcript: Transcript, parties: list[str], n_items: int | None = None, own_k: dict[str, int] | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """Per party, precision, recall and F1 of the message-free guesses "the k items most
    rated by the other clients" (leave-one-out popularity, counted in hindsight from their
    positives: an upper bound of public popularity data) for two k:

    - ``popularity top-k, own k``: k = the party's number of positives (what the size of any
      upload reveals: (1 + negatives) x positives, negatives public);
    - ``popularity top-k, median k``: k = the median number of positives of the other clients.

    Returns strategy -> {"precision", "recall", "f1", "scored"} arrays of shape (len(parties),)
    (recall 0 and ``scored`` 0 for a party without positives). ``n_items`` defaults to the
    public ``n_items``. ``own_k``: the k each party's messages reveal (e.g. from its upload size),
    in place of its true number of positives.
    """
    m = n_items or int(transcript.config.get("n_items", 0)) or 1
    everyone = transcript.clients()
    truths = {p: client_truth(transcript, p) for p in set(everyone) | set(parties)}
    counts = np.zeros(m)
    for p in everyone:
        counts += np.bincount(truths[p][truths[p] < m], minlength=m)[:m]
    sizes = {p: truths[p].size for p in everyone}
    out: dict[str, dict[str, list[float]]] = {}
    for party in parties:
        truth = truths[party]
        own = np.zeros(m)
        if party in sizes:
            own[truth[truth < m]] = 1.0
        order = np.argsort(-(counts - own), kind="stable")
        others = [n for q, n in sizes.items() if q != party and n]
        for name, k in (
            ("popularity top-k, own k", truth.size if own_k is None else int(own_k.get(party, truth.size))),
            ("popularity top-k, median k", int(np.median(others)) if others else 0),
        ):
            p, r = set_precision_recall(order[: max(k, 0)], truth)
            row = out.setdefault(name, {"precision": [], "recall": [], "f1": [], "scored": []})
            row["precision"].append(p)
            row["recall"].append(0.0 if np.isnan(r) else r)
            row["f1"].append(0.0 if np.isnan(r) else f1_score(p, r))
            row["scored"].append(float(truth.size > 0))
    return {name: {k: np.asarray(v, dtype=float) for k, v in row.items()} for name, row in out.items()}


def target_prior(transcript: Transcript, party: str) -> tuple[float, float]:
    """One target's (precision, recall) under the popularity strategy with the best mean F1 over
    the other clients (:func:`popularity_strategies`: chosen without the target)."""
    others = [q for q in transcript.clients() if q != party]
    held_out = popularity_strategies(transcript, others)
    mine = popularity_strategies(transcript, [party])
    best = max(mine, key=lambda s: ratio(held_out[s]["f1"], held_out[s]["scored"]) if others else 0.0)
    return float(mine[best]["precision"][0]), float(mine[best]["recall"][0])


def target_table(transcript: Transcript, party: str, items: np.ndarray, prior: tuple[float, float]) -> VictimTable:
    """The one target's precision and recall of ``items`` and of ``prior`` (weight 1; F1 their
    harmonic mean). One victim: a bootstrap over victims has nothing to resample, the table
    only carries the numbers."""
    truth = client_truth(transcript, party)
    p, r = set_precision_recall(items, truth)
    scored = float(truth.size > 0)
    return VictimTable(
        [party],
        {"precision": [1.0], "recall": [scored]},
        {"precision": [p], "recall": [r if scored else 0.0]},
        {"precision": [prior[0]], "recall": [prior[1]]},
        harmonic={"f1": ("precision", "recall")},
    )


def item_decisions(
    party_scores: dict[str, np.ndarray], transcript: Transcript, positive: str, victims: list[str]
) -> dict[str, Decisions]:
    """One record per (victim, item): the attack's item score (m,) and whether it is a positive;
    ``groups`` = the victim's index in ``victims``."""
    m = int(transcript.config.get("n_items", 0))
    labels, scores, groups = [], [], []
    for party, sc in party_scores.items():
        truth = client_truth(transcript, party)
        labels.append(np.isin(np.arange(m), truth))
        scores.append(np.asarray(sc, dtype=np.float64)[:m])
        groups.append(np.full(m, victims.index(party), dtype=np.int64))
    if not labels:
        return {}
    y = np.concatenate(labels)
    if y.all() or not y.any():
        return {}
    return {"positive": Decisions(np.concatenate(scores), y, positive=positive, groups=np.concatenate(groups))}


class OneTarget(Attack):
    """An attack on one target client's item set: its :meth:`victim_table` and :meth:`decisions`
    from the reconstruction's ``items`` and ``score`` and the subclass's ``_prior`` (the
    target's (precision, recall) under the popularity prior, or None without a target)."""

    def _prior(self, transcript: Transcript) -> tuple[float, float] | None:
        raise NotImplementedError

    def victim_table(
        self, reconstruction: Reconstruction, transcript: Transcript, knowledge: dict[str, Any]
    ) -> VictimTable | None:
        """The one target's table (:func:`target_table`)."""
        ((party, rec),) = reconstruction.victims.items()
        prior = self._prior(transcript)
        return None if prior is None else target_table(transcript, party, rec["items"], prior)

    def decisions(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, Decisions]:
        """Per item: the reconstruction's ``score``, truth = the target's training positive."""
        return item_decisions(
            {p: rec["score"] for p, rec in reconstruction.victims.items()},
            transcript,
            "target's training positive",
            list(reconstruction.victims),
        )


PRF_SPECS = {
    "precision": MetricSpec(
        True,
        True,
        "fraction",
        "share of the items guessed as a client's positives that are positives",
        tested=False,
    ),
    "recall": MetricSpec(True, True, "fraction", "share of a client's positives that are guessed", tested=False),
    "f1": MetricSpec(True, True, "fraction", "harmonic mean of precision and recall"),
}


@register_attack("ncf-update-leak")
class NCFUpdateLeak(Attack):
    """Recover a FedNCF client's positives from the rows its plain uploads changed (module docstring)."""

    null_keeps_ids = False  # the leak is the id set: the null arm reads a donor's uploads

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
            f"{k}_r{j}": MetricSpec(
                True, True, "fraction", f"{k} after intersecting the first {j} uploads", tested=False
            )
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
        Param(
            "decoder",
            "posterior",
            "'posterior': item sets from the popularity prior times the upload likelihood fitted by EM "
            "(falls back to the prior when the uploads carry nothing); 'intersection': the paper's read, "
            "every item of the intersected uploads",
            choices=("posterior", "intersection"),
        ),
    )

    def applicable(self, view: View) -> tuple[bool, str]:
        return super().applicable(view)  # the base rule: every kind of ``requires``, in plaintext

    def prior_knowledge(self, transcript: Transcript, rng: np.random.Generator) -> dict[str, Any]:
        """The item popularity among the other clients (:class:`ItemPopularity`, each client left
        out of its own counts): the same hindsight counts as the prior library's."""
        return {"popularity": ItemPopularity(transcript)}

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
        meta: dict[str, Any] = {"clients": len(victims), "decoder": self.decoder}
        popularity = knowledge.get("popularity")
        if self.decoder == "posterior" and isinstance(popularity, ItemPopularity):
            meta.update(_posterior_decode(victims, popularity, n_items(view), self.rounds))
        return Reconstruction(self.name, self.party, victims, meta=meta)

    def _keys(self, uploads: int) -> list[str]:
        """The reconstruction keys a client with ``uploads`` recorded uploads gets (:meth:`run`)."""
        r = uploads if self.rounds == -1 else self.rounds
        keys = ["items"] if uploads >= r else []
        return keys + [f"items_r{j}" for j in range(1, self.table_rounds + 1) if uploads >= j]

    def _metric(self, key: str, kind: str) -> str:
        return kind if key == "items" else f"{kind}_{key.split('_')[1]}"

    def _weights(self, transcript: Transcript, keys: dict[str, list[str]]) -> dict[str, np.ndarray]:
        """Per victim, 1 where it counts in a metric's mean (recall: only with positives)."""
        has = {p: client_truth(transcript, p).size > 0 for p in keys}
        weight = {}
        for key in ["items"] + [f"items_r{j}" for j in range(1, self.table_rounds + 1)]:
            weight[self._metric(key, "precision")] = np.array([key in ks for ks in keys.values()], dtype=float)
            weight[self._metric(key, "recall")] = np.array(
                [key in ks and has[p] for p, ks in keys.items()], dtype=float
            )
        return weight

    def _attack_parts(self, reconstruction: Reconstruction, transcript: Transcript):
        keys = {p: [k for k in rec if k.startswith("items")] for p, rec in reconstruction.victims.items()}
        weight = self._weights(transcript, keys)
        num = {name: np.zeros(len(keys)) for name in weight}
        for i, (party, rec) in enumerate(reconstruction.victims.items()):
            truth = client_truth(transcript, party)
            for key in keys[party]:
                p, r = set_precision_recall(rec[key], truth)
                num[self._metric(key, "precision")][i] = p
                num[self._metric(key, "recall")][i] = 0.0 if np.isnan(r) else r
        return list(keys), weight, num

    def _prior_parts(self, transcript: Transcript):
        """Victims, weights and cross-fitted numerators of the popularity prior (chosen by F1)."""
        view = transcript.view(self.party)
        counts: dict[str, int] = {}
        for m in view.select("item_update"):
            counts[m.sender] = counts.get(m.sender, 0) + 1
        keys = {p: self._keys(n) for p, n in counts.items()}
        weight = self._weights(transcript, keys)
        strategies = popularity_strategies(transcript, list(keys), own_k=upload_k(view))
        if not keys:
            return [], weight, {name: np.zeros(0) for name in weight}
        best, _ = cross_fit(strategies, "f1", next(iter(strategies.values()))["scored"])
        num = {name: best["precision" if name.startswith("precision") else "recall"] for name in weight}
        return list(keys), weight, num

    def _values(self, weight: dict[str, np.ndarray], num: dict[str, np.ndarray]) -> dict[str, float]:
        out = {name: ratio(num[name], weight[name]) for name in weight}
        scored = bool(weight["precision"].sum())
        out["f1"] = f1_score(out["precision"], out["recall"]) if scored else float("nan")
        out["victims"] = float(weight["precision"].sum())
        return out

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        _, weight, num = self._attack_parts(reconstruction, transcript)
        return self._values(weight, num)

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        parties = sorted({m.sender for m in transcript.select("item_update")})
        return guess_baseline(transcript, parties)

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """The best of :func:`popularity_strategies`, chosen by F1 on held-out halves of the
        clients (:func:`~privaudit.attacks.generic._uploads.cross_fit`; "own k" is the k a client's first
        upload size reveals, :func:`upload_k`, not its true count), averaged over the same clients
        as every metric of :meth:`score` (precision and recall as the mean of per-client values,
        F1 of those means)."""
        _, weight, num = self._prior_parts(transcript)
        return self._values(weight, num)

    def victim_table(
        self, reconstruction: Reconstruction, transcript: Transcript, knowledge: dict[str, Any]
    ) -> VictimTable | None:
        """Per client: its precision and recall (weight 1 where it counts in the mean); F1, the
        harmonic mean of the two means, resampled with them."""
        victims, weight, num = self._attack_parts(reconstruction, transcript)
        prior_victims, _, prior = self._prior_parts(transcript)
        if not victims:
            return None
        idx = np.array([prior_victims.index(p) for p in victims])
        prior_num = {name: v[idx] for name, v in prior.items()}
        return VictimTable(victims, weight, num, prior_num, harmonic={"f1": ("precision", "recall")})

    def decisions(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, Decisions]:
        """Per (client, item): the share of the client's first r uploads holding the item."""
        m = int(transcript.config.get("n_items", 0))
        scores = {}
        for party, rec in reconstruction.victims.items():
            if "posterior" in rec:
                scores[party] = rec["posterior"]
            elif "seen_items" in rec:
                sc = np.zeros(m)
                sc[rec["seen_items"]] = rec["seen_counts"] / max(int(rec["seen_counts"].max(initial=1)), 1)
                scores[party] = sc
        return item_decisions(scores, transcript, "training positive", list(reconstruction.victims))


def upload_k(view: View) -> dict[str, int]:
    """Per client, the number of positives its first ``item_update`` reveals: round(|rows| /
    (1 + negatives)), ``negatives`` the public negatives per positive (a client trains its
    positives and that many sampled negatives per positive)."""
    neg = float(view.config.get("negatives", 4) or 0)
    out: dict[str, int] = {}
    for m in view.select("item_update"):
        if m.sender not in out and "items" in m.payload:
            size = np.unique(np.asarray(m.payload["items"], dtype=np.int64)).size
            out[m.sender] = int(np.floor(size / (1.0 + neg) + 0.5))
    return out


def _intersect(seq: list[np.ndarray]) -> np.ndarray:
    out = seq[0]
    for s in seq[1:]:
        out = np.intersect1d(out, s, assume_unique=True)
    return out


class ItemPopularity:
    """What the attacker knows besides the messages: how many of the other clients have each
    item among their positives (each client left out of its own counts; counted in hindsight
    from their private positives, as the prior library does: an upper bound of public
    popularity data). Built on first use."""

    def __init__(self, transcript: Transcript) -> None:
        self._transcript = transcript
        self._counts: np.ndarray | None = None
        self._own: dict[str, np.ndarray] = {}

    def others(self, party: str, m: int) -> tuple[np.ndarray, int]:
        """(counts (m,) of the item among the other clients' positives, number of other clients)."""
        t = self._transcript
        if self._counts is None or self._counts.size != m:
            clients = t.clients()
            self._own = {p: client_truth(t, p) for p in clients}
            self._counts = np.zeros(m)
            for items in self._own.values():
                self._counts += np.bincount(items[(items >= 0) & (items < m)], minlength=m)[:m]
        own = np.zeros(m)
        mine = self._own.get(party)
        if mine is not None:
            own[mine[(mine >= 0) & (mine < m)]] = 1.0
        return self._counts - own, len(self._own) - (mine is not None)


def _posterior_decode(
    victims: dict[str, dict[str, np.ndarray]], popularity: ItemPopularity, m: int, rounds: int, iters: int = 100
) -> dict[str, Any]:
    """Replace each victim's ``items`` by the Bayes decision combining the popularity prior with
    what its uploads say (in place; adds ``posterior``, (m,) P(positive | uploads)).

    Per (client, item): prior pi = (others' count + 1/2) / (others + 1); observation s = in how
    many of the client's first r uploads the item was (0..r). The likelihoods P(s | positive) and
    P(s | not) are shared by all clients and fitted by EM (maximum marginal likelihood, pi fixed,
    1/2 pseudo-count per value), started from the protocol's model (a positive is in every upload).
    The prior is rescaled to sum to the other clients' mean number of positives. Uploads that
    carry nothing (every item in every upload, or sets independent of the positives) give equal
    likelihoods, so the posterior is the prior; uploads that follow the protocol give
    P(s < r | positive) ~ 0. Each client's set is its top-j items by posterior with j = round(sum
    of its posteriors), the posterior expected number of positives: with uninformative uploads the
    prior's top-(others' mean count) items, the popularity strategy of the prior library; measured
    on the calibration's FedNCF (40 x 60, one upload), F1 0.457 against 0.454 for the plug-in
    expected-F1 size (2 sum_{top j} q / (j + sum q)), which on null uploads fell 0.013 below the
    prior. Returns diagnostics for the reconstruction's meta.
    """
    parties = [p for p, rec in victims.items() if "seen_items" in rec]
    if not parties or m <= 0:
        return {}
    r = max(int(max(int(victims[p]["seen_counts"].max(initial=0)) for p in parties)), 1)
    if rounds != -1:
        r = max(int(rounds), 1)
    S = np.zeros((len(parties), m), dtype=np.int64)
    P = np.zeros((len(parties), m))
    for row, party in enumerate(parties):
        rec = victims[party]
        keep = (rec["seen_items"] >= 0) & (rec["seen_items"] < m)
        S[row, rec["seen_items"][keep]] = np.minimum(rec["seen_counts"][keep], r)
        counts, n_others = popularity.others(party, m)
        pi = (counts + 0.5) / (n_others + 1.0)
        P[row] = pi * (counts.sum() / max(n_others, 1)) / pi.sum()  # sums to the others' mean |positives|
    P = np.clip(P, 1e-6, 1 - 1e-6)
    values = r + 1
    f1 = np.full(values, 0.1 / max(values - 1, 1))
    f1[r] = 0.9 if values > 1 else 1.0
    f0 = (np.bincount(S.ravel(), minlength=values) + 0.5) / (S.size + 0.5 * values)
    for _ in range(iters):
        a, b = P * f1[S], (1 - P) * f0[S]
        Q = a / (a + b)
        new1 = (np.bincount(S.ravel(), weights=Q.ravel(), minlength=values) + 0.5) / (Q.sum() + 0.5 * values)
        new0 = (np.bincount(S.ravel(), weights=(1 - Q).ravel(), minlength=values) + 0.5) / (
            (1 - Q).sum() + 0.5 * values
        )
        done = np.allclose(new1, f1, atol=1e-9) and np.allclose(new0, f0, atol=1e-9)
        f1, f0 = new1, new0
        if done:
            break
    a, b = P * f1[S], (1 - P) * f0[S]
    Q = a / (a + b)
    for row, party in enumerate(parties):
        q = Q[row]
        order = np.argsort(-q, kind="stable")
        j = max(int(np.floor(q.sum() + 0.5)), 1)
        victims[party]["items"] = np.sort(order[:j])
        victims[party]["posterior"] = q
    return {"likelihood_positive": f1.tolist(), "likelihood_other": f0.tolist()}
