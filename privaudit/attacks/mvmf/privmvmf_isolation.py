"""``privmvmf-isolated-decryption``: a malicious PrivMVMF server has one client's upload decrypted alone.

Threat ``malicious``. PrivMVMF's Paillier aggregation hides each upload from the server only if
the decrypting clients decrypt nothing but sums of many uploads. In the protocol as implemented
(:mod:`privaudit.defenses.paillier`, PrivMVMF paper Algorithm 2) a decryptor receives a
``ciphertext_sum`` and returns its plaintext; it cannot tell a product of many ciphertexts from
one ciphertext (both are uniform-looking elements of Z*_{n^2}) and checks nothing else. The
protocol's ``server=isolate`` plan (:mod:`privaudit.protocols.privmvmf`) uses this: in each
deviation round the server, after the honest aggregation, sends a decryptor the target's
``grad_V`` rows and ``grad_P`` ciphertexts alone (cohort label -1, recorded with meta
``deviation`` on the server's ``state`` and ``ciphertext_sum`` messages). The decryptor's
``plaintext_sum`` is then the target's upload in plaintext, and the attack is ``mvmf-analytic``
on it (through ``mvmf-aggregate`` with a cohort of one member): every upload row is a multiple
of the target's latent vector, so its ratings, which uploaded items are rated and which are
``sampling``'s virtual items, and its attributes follow in closed form from one round.

Metrics: the MVMF accuracies of the target (``rating_accuracy``, primary; ``rated_detection_accuracy``,
``rated_rating_accuracy``, ``attribute_accuracy``), ``precision`` / ``recall`` / ``f1`` of the set of
items it decides rated against the target's training ratings, ``rounds_used`` (isolated
decryptions read) and ``sybils`` (0). Baselines: the uniform guess (precision = the target's share
of rated items among its uploads, recall 1/2) and the prior library's message-free guesses for the
target (:class:`privaudit.attacks.mvmf._core.PriorTable`; for the rated set, the uploads it deems most
likely rated, as many as the public ``rho`` of ``sampling`` implies). Per-record decisions: rated versus virtual
per uploaded item. With ``model-consistency`` the decryptors refuse a sum that is not a posted
cohort's; no isolated decryption exists and the attack does not apply.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.attack_metrics import f1_score, set_precision_recall
from privaudit.attacks.mvmf._core import MVMF_METRIC_SPECS, baselines, true_ratings
from privaudit.attacks.mvmf.aggregate import MVMFAggregate
from privaudit.params import Param
from privaudit.registry import register_attack
from privaudit.results import MetricSpec
from privaudit.transcript import Message, Transcript, View

#: the privmvmf ``server`` plan of the deviation and the cohort label of its requests
PLAN = "isolate"
ISOLATED_COHORT = -1
_EXTRA = ("precision", "recall", "f1", "rounds_used", "sybils")


def _target(transcript_or_view: Any) -> str | None:
    target = int((transcript_or_view.config or {}).get("target", -1))
    return f"client:{target}" if target >= 0 else None


def _rho(config: dict[str, Any]) -> float:
    """The public ``rho`` of the run's ``sampling`` defense (0 without one)."""
    for d in config.get("defenses", []) or []:
        if isinstance(d, dict) and d.get("name") == "sampling":
            return float(d.get("rho", 0.0) or 0.0)
    return 0.0


def _rated_prf(items: np.ndarray, decided: np.ndarray, truth_items: np.ndarray) -> tuple[float, float]:
    """(precision, recall) of the items ``decided`` rated among ``items`` (unique ids) against the
    rated items ``truth_items``."""
    return set_precision_recall(np.asarray(items)[np.asarray(decided, dtype=bool)], truth_items)


@register_attack("privmvmf-isolated-decryption")
class PrivMVMFIsolatedDecryption(MVMFAggregate):
    """PrivMVMF, malicious server: the target's ciphertexts decrypted alone give its ratings."""

    description = (
        "PrivMVMF, malicious server: a decryptor is sent one client's ciphertexts as a 'sum'; its ratings leak"
    )
    protocols = ("privmvmf",)
    requires = ("state", "plaintext_sum")
    threat = "malicious"
    #: the protocol settings the deviation needs (the audit runs the protocol with them)
    plan = {"server": PLAN}
    #: what the server does (a key of :data:`DEVIATIONS`; the audit names it from there)
    deviations = ("isolated-decryption",)
    metric_specs = {
        **MVMF_METRIC_SPECS,
        "precision": MetricSpec(
            True, True, "fraction", "share of the items decided rated that the target rated", tested=False
        ),
        "recall": MetricSpec(
            True, True, "fraction", "share of the target's rated training items decided rated", tested=False
        ),
        "f1": MetricSpec(True, True, "fraction", "harmonic mean of precision and recall"),
        "rounds_used": MetricSpec(True, False, "count", "isolated decryptions (deviation rounds) the attack read"),
        "sybils": MetricSpec(False, False, "count", "sybil clients the server ran (none)"),
    }
    parameters = (Param("rounds", -1, "isolated decryptions to read (-1: all)", ge=1, also=(-1,)),)
    cohort_size = 1  # mvmf-aggregate's settings: every decrypted sum, every round
    max_rounds = -1

    def applicable(self, view: View) -> tuple[bool, str]:
        plan = view.config.get("server", "honest")
        if plan != PLAN:
            return False, f"the server followed plan {plan!r}; this attack needs protocol server={PLAN}"
        if not any(self._reads(m) for m in view.select("plaintext_sum")):
            names = [d.get("name") for d in view.config.get("defenses", []) or [] if isinstance(d, dict)]
            why = (
                " (model-consistency: decryptors decrypt only posted cohorts' sums)"
                if "model-consistency" in names
                else ""
            )
            return False, f"no decryptor decrypted the target's ciphertexts alone in a recorded deviation round{why}"
        return super().applicable(view)

    def _reads(self, m: Message) -> bool:
        return int(m.meta.get("cohort", 0)) == ISOLATED_COHORT

    def _cohorts(self, view: View) -> tuple[dict, dict, list]:
        V, P, cohorts = super()._cohorts(view)
        target = _target(view)
        cohorts = [c for c in cohorts if c.members == [target]]
        return V, P, cohorts[: self.rounds] if self.rounds != -1 else cohorts

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Any:
        rec = super().run(view, knowledge, rng)
        if rec.supported:
            rec.meta["rounds_used"] = int(rec.meta.get("cohorts", 0))
            target = _target(view)
            rec.victims = {u: v for u, v in rec.victims.items() if u == target}
        return rec

    def score(self, reconstruction: Any, transcript: Transcript) -> dict[str, float]:
        out = super().score(reconstruction, transcript)
        ((party, guess),) = reconstruction.victims.items()
        items = np.asarray(guess["items"], dtype=np.int64)
        decided = np.asarray(guess.get("rated", np.asarray(guess["ratings"]) > 0), dtype=bool)
        p, r = _rated_prf(items, decided, transcript.private(party).get("items", np.empty(0)))
        out.update(precision=p, recall=r, f1=f1_score(p, r))
        out.update(rounds_used=float(reconstruction.meta["rounds_used"]), sybils=0.0)
        return out

    def _uploaded(self, transcript: Transcript, party: str) -> np.ndarray:
        first = next((m for m in transcript.view("server").select("grad_V") if m.sender == party), None)
        return np.asarray(first.payload["items"], dtype=np.int64) if first is not None else np.empty(0, np.int64)

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        """The uniform guess: :func:`baselines`, and for the rated set each uploaded item with
        probability 1/2 (precision = the target's share of rated items among its uploads)."""
        out = dict(baselines(transcript))
        party = _target(transcript)
        items = self._uploaded(transcript, party) if party else np.empty(0, np.int64)
        share = float(np.mean(true_ratings(transcript, party, items) > 0)) if len(items) else float("nan")
        out.update(precision=share, recall=0.5, f1=f1_score(share, 0.5), rounds_used=0.0, sybils=0.0)
        return out

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """The prior library's message-free guesses for the target: its rows of the prior table
        (as :meth:`victim_table`) and the rated set they decide."""
        nan = float("nan")
        out = dict.fromkeys(list(MVMF_METRIC_SPECS) + ["precision", "recall", "f1"], nan)
        out.update(rounds_used=0.0, sybils=0.0, victims=1.0)
        table = self._prior_table(transcript, knowledge)
        party = _target(transcript)
        if party not in table.victims:
            return out
        k = table.victims.index(party)
        for m in table.hits:
            w = float(table.weight[m][k])
            out[m] = float(table.hits[m][k]) / w if w > 0 else nan
        items = table.items[table.offsets[k] : table.offsets[k + 1]]
        rows = np.full(len(items), k, dtype=np.int64)
        p_rated = table.predictive("rated_detection_accuracy", rows, items)[:, 1]
        # the set guess: the uploads most likely rated, as many as sampling's public rho implies
        n_rated = int(round(len(items) / (1.0 + _rho(transcript.config))))
        decided = np.zeros(len(items), dtype=bool)
        decided[np.argsort(-p_rated, kind="stable")[:n_rated]] = True
        p, r = _rated_prf(items, decided, transcript.private(party).get("items", np.empty(0)))
        out.update(precision=p, recall=r, f1=f1_score(p, r))
        return out
