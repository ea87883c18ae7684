"""Model inconsistency against a recorded Flower SecAgg+ run whose server app is the attacker's.

Pasquini, Francati and Ateniese, "Eluding Secure Aggregation in Federated Learning via Model
Inconsistency" (ACM CCS 2022): secure aggregation shows the server only the sum of a round's
uploads, but nothing stops the server from sending each client its own model. It sends the
target the real model and every other client a *neutral* model on which local training leaves
the uploaded parameters unchanged; their deltas are then known (zero), and the sum is the
target's delta.

The attack reads what the server recorded (``examples/flower-secagg-malicious-mf``): the
models it sent (``state`` messages ``of = "model"``, one per distinct payload and round, with
their receivers) and the sum SecAgg+ gave it (``state`` ``of = "aggregate"``, logged by the
server app through the recorder). A round is *inconsistent* when it sent more than one distinct
model; it is *isolating* when exactly one receiver got a non-neutral model (neutral: every array
zero; for matrix factorization with output weights h, r_hat = h.(u * v_i), V = 0 and h = 0
zero every gradient of the uploaded parameters whatever the client's u and ratings). The rows
of the aggregate's ``V`` above the SecAgg+ quantization noise (``noise`` times the number of
uploads times the quantization step 2 clipping_range / target_range) are the target's trained
items; with the public ``lr`` and ``lam`` and one local step, the rows are the closed form of
``generic-mf-ratings`` (lr e_i (h * u) - lr lam v_i) and decode to ratings on the public grid.
Under consistent models (the honest server app) the attack is not applicable.

Metrics: ``precision``, ``recall``, ``f1`` of the target's training items; ``rating_accuracy``
(share of the target's recovered training items whose rating is exact; NaN when the clients run
more than one local step); ``rounds_used`` (isolating rounds read) and ``sybils`` (0). Baselines:
every item with probability 1/2; prior-only: the target's k items most rated by the other
clients (popularity strategy chosen on the other clients, as ``ncf-model-inconsistency``), and
for ratings the other clients' most frequent rating.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from privaudit.attack_metrics import f1_score, set_precision_recall
from privaudit.attacks.base import Reconstruction
from privaudit.attacks.generic.mf_ratings import LocalSteps, decode, grid_of, snap
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

#: SecAgg+ quantization step when the transcript names no ``flower-secaggplus`` defense
_DEFAULT_STEP = 16.0 / 4194304


def _digest(payload: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(payload):
        h.update(name.encode() + np.ascontiguousarray(payload[name]).tobytes())
    return h.hexdigest()


def _neutral(payload: dict[str, np.ndarray]) -> bool:
    return bool(payload) and all(not np.any(np.asarray(a)) for a in payload.values())


def _step(config: dict) -> float:
    """The SecAgg+ quantization step 2 clipping_range / target_range of the recorded run."""
    for d in config.get("defenses", []) or []:
        if isinstance(d, dict) and d.get("name") == "flower-secaggplus":
            clip, rng = d.get("clipping_range"), d.get("target_range")
            if isinstance(clip, (int, float)) and isinstance(rng, (int, float)) and clip > 0 and rng > 0:
                return 2.0 * float(clip) / float(rng)
    return _DEFAULT_STEP


def sent_by_round(view: View) -> dict[int, dict[str, dict[str, np.ndarray]]]:
    """round -> receiver -> the model the server sent it (from its ``state`` messages; the mapped
    payload names only: unmapped entries such as the SecAgg+ key shares differ per client)."""
    out: dict[int, dict[str, dict[str, np.ndarray]]] = {}
    for m in view.select("state"):
        if (m.meta or {}).get("of") == "model":
            for party in m.meta.get("to", []):
                # the schema map's payload names (unmapped entries, e.g. SecAgg+ ciphertexts, hold a '/')
                model = {k: np.asarray(v) for k, v in m.payload.items() if "/" not in k}
                out.setdefault(m.round, {})[str(party)] = model
    return out


def aggregates(view: View) -> dict[int, Any]:
    """round -> the server's ``state`` message ``of = "aggregate"`` (the secure sum it obtained)."""
    return {m.round: m for m in view.select("state") if (m.meta or {}).get("of") == "aggregate"}


def _readable(agg: Any, sent: dict[str, np.ndarray]) -> bool:
    """Whether an aggregate's ``V`` is a finite float matrix of the shape of the sent ``V``."""
    V, D = sent.get("V"), agg.payload.get("V")
    if not isinstance(V, np.ndarray) or not isinstance(D, np.ndarray) or V.ndim != 2 or D.shape != V.shape:
        return False
    return D.dtype.kind == "f" and bool(np.all(np.isfinite(D))) and bool(np.all(np.isfinite(V)))


def isolating_rounds(view: View) -> tuple[list[int], list[tuple[int, str]]]:
    """(inconsistent rounds, [(round, target)] of the isolating ones whose aggregate is readable)."""
    aggs = aggregates(view)
    inconsistent, isolating = [], []
    for rnd, sent in sorted(sent_by_round(view).items()):
        if len({_digest(p) for p in sent.values()}) < 2:
            continue
        inconsistent.append(rnd)
        live = [party for party, p in sent.items() if not _neutral(p)]
        if len(live) == 1 and rnd in aggs and _readable(aggs[rnd], sent[live[0]]):
            isolating.append((rnd, live[0]))
    return inconsistent, isolating


def _number(x: Any) -> float | None:
    """``x`` as a finite float, None when it is not a finite real number."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not np.isfinite(x):
        return None
    return float(x)


def _secure_sum(view: View) -> bool:
    """Whether the run aggregates under secure aggregation (a recorded SecAgg defense, masked uploads
    or a logged secure ``aggregate``)."""
    names = [str(d.get("name", "")) for d in view.config.get("defenses", []) or [] if isinstance(d, dict)]
    if any("secagg" in n for n in names):
        return True
    return bool(view.select("masked_update")) or bool(aggregates(view))


def _uploads(agg: Any, receivers: int) -> int:
    """The number of uploads summed (the aggregate's ``n``; the receivers when absent or invalid)."""
    n = (agg.meta or {}).get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= receivers else receivers


@register_attack("flower-model-inconsistency")
class FlowerModelInconsistency(OneTarget):
    """Recorded Flower SecAgg+ run, malicious server app: neutral models for all but the target
    make the secure sum its delta (module docstring)."""

    description = (
        "Flower SecAgg+, malicious server app: neutral models for all but the target (CCS 2022); "
        "the secure sum is its delta (items, ratings)"
    )
    party = "server"
    protocols = ("flower",)
    requires = ("state",)
    threat = "malicious"
    #: the server plan of examples/flower-secagg-malicious-mf (run config ``server-plan``)
    plan = "inconsistent"
    deviations = ("inconsistent-models", "craft-items", "craft-network")
    primary_metric = "precision"
    metric_specs = {
        **PRF_SPECS,
        "rating_accuracy": MetricSpec(
            True,
            False,
            "fraction",
            "share of the target's recovered training items whose rating is exact",
            tested=False,
        ),
        "rounds_used": MetricSpec(True, False, "count", "isolating rounds whose aggregate the attack read"),
        "sybils": MetricSpec(False, False, "count", "sybil clients the attack needed (none)"),
    }
    audit_params = {"rounds": 1}
    parameters = (
        Param("rounds", -1, "isolating rounds to read (-1: all)", ge=1, also=(-1,)),
        Param("noise", 8.0, "row threshold in units of (uploads x SecAgg+ quantization step)", gt=0),
    )

    def applicable(self, view: View) -> tuple[bool, str]:
        ok, reason = super().applicable(view)
        if not ok:
            return ok, reason
        if not sent_by_round(view):
            return False, "the server's view holds no record of the models it sent (no 'model' state)"
        inconsistent, isolating = isolating_rounds(view)
        if not inconsistent:
            if _secure_sum(view):
                return False, (
                    "the server sent every client of each round the same model (consistent models): "
                    "the secure sum hides each upload"
                )
            return False, (
                "the run has no secure aggregation (its uploads reach the server in the clear: the other "
                "attacks read them), and model inconsistency isolates an upload inside a secure sum"
            )
        if not isolating:
            errors = [m for m in view.select("flower.error") if m.round in inconsistent]
            if errors:
                return False, (
                    f"rounds {inconsistent} sent inconsistent models, but the clients aborted them "
                    f"({len(errors)} error replies, e.g. {str(errors[0].meta.get('error', ''))[:160]!r}): no aggregate"
                )
            return False, (
                f"rounds {inconsistent} sent inconsistent models, but none left exactly one client with a "
                "non-neutral model and a readable aggregate (state of='aggregate' with a finite V of the model's shape)"
            )
        rows = sent_by_round(view)[isolating[0][0]][isolating[0][1]]["V"].shape[0]
        m = view.config.get("n_items", rows)
        if m != rows:
            return False, f"the public n_items ({m!r}) differs from the {rows} rows of the model sent"
        return True, ""

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        _, isolating = isolating_rounds(view)
        target = isolating[0][1]
        read = [r for r, p in isolating if p == target]
        if self.rounds != -1:
            read = read[: self.rounds]
        sent = sent_by_round(view)
        aggs = aggregates(view)
        m_items = sent[read[0]][target]["V"].shape[0]
        step = _step(view.config)
        votes = np.zeros(m_items)
        strength = np.zeros(m_items)
        ratings = np.full(m_items, np.nan)
        cfg = view.config
        lr, lam = _number(cfg.get("lr")), _number(cfg.get("lam", 0.0))
        decodable = cfg.get("local_steps", 1) == 1 and lr is not None and lr > 0 and lam is not None and lam >= 0
        for r in read:
            agg = aggs[r]
            n = _uploads(agg, len(sent[r]))
            D = np.asarray(agg.payload["V"], dtype=np.float64)  # the others' deltas are 0: D is the target's
            norm = np.abs(D).max(axis=1)
            rows = np.flatnonzero(norm > self.noise * n * step)
            votes[rows] += 1.0
            strength += norm
            if decodable and rows.size >= 2 and np.all(np.isnan(ratings[rows])):
                V = np.asarray(sent[r][target]["V"], dtype=np.float64)
                hp = LocalSteps(lr, lam, 1)
                y, *_ = decode(hp.change(V[rows], D[rows]), V[rows], grid_of(cfg), hp)
                ratings[rows] = y
        score = votes / len(read) + strength / (len(read) * (strength.max() or 1.0) * 1e3)  # ties by row size
        pred = np.flatnonzero(votes / len(read) >= 0.5).astype(np.int64)
        victim = {
            "items": pred,
            "score": score,
            "ratings": snap(ratings[pred], grid_of(cfg)) if decodable else np.full(pred.size, np.nan),
        }
        meta = {"rounds_used": len(read), "sybils": 0, "target": target, "decoded": bool(decodable)}
        return Reconstruction(self.name, self.party, {target: victim}, meta=meta)

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        ((party, rec),) = reconstruction.victims.items()
        p, r = set_precision_recall(rec["items"], client_truth(transcript, party))
        return {
            "precision": p,
            "recall": r,
            "f1": f1_score(p, r),
            "rating_accuracy": _rating_accuracy(transcript, party, rec["items"], rec["ratings"]),
            "rounds_used": float(reconstruction.meta["rounds_used"]),
            "sybils": 0.0,
        }

    def _target(self, transcript: Transcript) -> str | None:
        _, isolating = isolating_rounds(transcript.view(self.party))
        return isolating[0][1] if isolating else None

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        party = self._target(transcript)
        out = guess_baseline(transcript, [party] if party else [])
        return {
            **out,
            "rating_accuracy": float(1.0 / grid_of(transcript.config).size),
            "rounds_used": 0.0,
            "sybils": 0.0,
        }

    def _prior(self, transcript: Transcript) -> tuple[float, float] | None:
        party = self._target(transcript)
        return None if party is None else target_prior(transcript, party)

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """The target's items from popularity alone (:meth:`_prior`); its ratings from the other
        clients' most frequent rating (counted in hindsight from their private ratings)."""
        party, prior = self._target(transcript), self._prior(transcript)
        nan = float("nan")
        if party is None or prior is None:
            return {
                "precision": nan,
                "recall": nan,
                "f1": nan,
                "rating_accuracy": nan,
                "rounds_used": 0.0,
                "sybils": 0.0,
            }
        others = [
            np.asarray(transcript.private(q).get("ratings", np.zeros(0)), dtype=np.float64)
            for q in transcript.clients()
            if q != party
        ]
        pool = np.concatenate(others) if others else np.zeros(0)
        truth = np.asarray(transcript.private(party).get("ratings", np.zeros(0)), dtype=np.float64)
        if pool.size and truth.size:
            values, counts = np.unique(pool, return_counts=True)
            acc = float(np.mean(truth == values[np.argmax(counts)]))
        else:
            acc = nan
        p, r = prior
        return {
            "precision": p,
            "recall": r,
            "f1": f1_score(p, r),
            "rating_accuracy": acc,
            "rounds_used": 0.0,
            "sybils": 0.0,
        }


def _rating_accuracy(transcript: Transcript, party: str, items: np.ndarray, ratings: np.ndarray) -> float:
    """Share of the target's true training items among ``items`` whose rating in ``ratings`` is exact."""
    priv = transcript.private(party)
    lookup = dict(
        zip(
            np.asarray(priv.get("items", np.zeros(0)), dtype=np.int64).tolist(),
            np.asarray(priv.get("ratings", np.zeros(0)), dtype=np.float64).tolist(),
        )
    )
    hits = [float(r == lookup[i]) for i, r in zip(items.tolist(), np.asarray(ratings).tolist()) if i in lookup]
    return float(np.mean(hits)) if hits and not np.isnan(ratings).all() else float("nan")
