"""``ncf-active-saturation``: a malicious server crafts the FedNCF model it sends so that only a
client's positives move (threat ``malicious``, active data manipulation).

Idea (Pham, Kulkarni and Houmansadr, "RAIFLE: Reconstruction Attacks on Interaction-based
Federated Learning with Adversarial Data Manipulation", NDSS 2025): the server chooses the item
features it sends so that the gradients a client uploads reveal its interactions. Here the
honest-but-curious attacks fail on the sampled negatives: a client uploads the rows of its
positives and of ``negatives`` x as many sampled items, and under secure aggregation the server
sees only which rows the cohort updated. The ``saturate`` plan (FedNCF ``server=saturate``,
:meth:`privaudit.protocols.fedncf.FedNCF.saturated_model`) sends every member of a cohort the
same model (so a model-consistency check passes): item rows 0 (``craft_items`` zero, or the
global rows: keep) and prediction bias -``craft_bias`` (50). Every score is then ~ -50,
sigmoid(score) ~ 2e-22, so a negative's BCE gradient on its row, sigmoid(s) ds/dq, is far below
Adam's epsilon (1e-8) and the row moves by ~1e-17, while a positive's, (sigmoid(s) - 1) ds/dq,
moves its row a full Adam step (~lr per coordinate per step). A row "moved" when its largest
absolute change exceeds ``tol``; by default (-1) the threshold is the widest gap, of at least
a factor ``gap`` (10), between a round's sorted row changes (none: every changed row moved).

What the server reads in each deviation round r (``deviation_rounds``, after ``deviation_start``
regular rounds; the target is in every deviation cohort, the other members re-drawn):

- ``source=upload`` (plain uploads): the target's own ``item_update``; the rows it moved are
  exactly its positives, from one round.
- ``source=aggregate`` (``secagg``: the uploads are masked): the server learns the aggregate by
  applying it to its item table (it keeps its own network), so the rows that changed from the
  ``state`` of round r to that of r + 1 are the union of the cohort's positives. Over the rounds
  read the target stays and the others change, so an item is predicted when it moved in at least
  ``threshold`` of them (1: every round).
- ``auto`` (default): ``upload`` when the target's uploads are plaintext, else ``aggregate``.

Same-target comparison: ``honest_precision`` / ``honest_f1`` read the same rounds as an
honest-but-curious server does (the rows the target's upload holds, or the rows the aggregate's
``counts`` show updated: positives and negatives alike, which crafting does not change).

Metrics: ``precision``, ``recall``, ``f1`` of the target's training positives, the honest
reading's, ``rounds_used`` (deviation rounds read), ``sybils`` (0) and ``k`` (mean cohort
size). Baseline: every item with probability 1/2; prior-only: the target's k items most rated by
the other clients. Decisions: one record per item of the target, score = share of the rounds
read in which its row moved. Defense: :mod:`privaudit.defenses.feature_bounds` (a bound on the
received prediction bias closes the saturation; item-row bounds alone do not).

``ncf-unit-saturation`` is the same reading of a server that saturates the logit through one
last-layer MLP unit instead (``craft_via=mlp-unit``: incoming weights 0, bias +``craft_bias``,
output weight -1; ``predict.bias`` untouched; models mlp and neumf), which a bound on the
prediction bias does not see; ``feature-bounds`` ``max_score`` (a bound on the received scores)
stops both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privaudit.attack_metrics import f1_score, set_precision_recall
from privaudit.attacks.base import Reconstruction
from privaudit.attacks.ncf.malicious import IsolationAttack
from privaudit.attacks.ncf.update_leak import client_truth
from privaudit.params import Param
from privaudit.registry import register_attack
from privaudit.results import MetricSpec
from privaudit.transcript import Transcript, View


@register_attack("ncf-active-saturation")
class NCFActiveSaturation(IsolationAttack):
    """FedNCF: a saturated model (scores ~ -50) leaves negatives' rows still; moved rows = positives."""

    description = (
        "FedNCF, malicious server: a crafted model with saturated scores makes only positives' rows move "
        "(RAIFLE-style active manipulation; plain uploads or secure aggregate)"
    )
    plan = "saturate"
    deviations = ("choose-cohorts", "craft-items", "craft-network")
    #: deviation rounds the attack needs (one with plain uploads; the aggregate path reads more)
    rounds_needed = 1
    #: sybil clients it needs
    sybils_needed = 0
    metric_specs = {
        **IsolationAttack.metric_specs,
        "honest_precision": MetricSpec(
            True, False, "fraction", "precision of the same rounds read as an honest server does", tested=False
        ),
        "honest_f1": MetricSpec(True, False, "fraction", "F1 of the same rounds read as an honest server does"),
    }
    default_sweep = ("rounds", (1, 2, 3, 4))
    parameters = (
        Param("rounds", -1, "deviation rounds to read (-1: all usable in the view)", ge=1, also=(-1,)),
        Param(
            "source",
            "auto",
            "upload (the target's plain item_update), aggregate (the change of the global item table) or auto",
            choices=("auto", "upload", "aggregate"),
        ),
        Param(
            "tol",
            -1.0,
            "a row moved when its largest absolute change exceeds tol (-1: at the widest gap, of at least "
            "a factor gap, between the rows' sorted changes)",
            gt=0,
            also=(-1.0,),
        ),
        Param("gap", 10.0, "tol -1: the smallest ratio between the moved rows' changes and the still rows'", gt=1),
        Param("threshold", 1.0, "predict an item that moved in at least this share of the rounds read", gt=0, le=1),
    )

    def _target_uploads(self, view: View, target: str) -> dict[int, Any]:
        """The target's plaintext ``item_update`` messages by round (empty when masked)."""
        ups = {m.round: m for m in view.select("item_update") if m.sender == target}
        if any(m.meta.get("masked") or m.meta.get("encrypted") for m in ups.values()):
            return {}
        return ups

    def _readings(self, view: View) -> tuple[str, list[tuple[int, np.ndarray, np.ndarray]], dict]:
        """Source used and per round read: (round, rows moved, rows an honest server sees updated)."""
        states, aggs, usable, _ = self._rounds(view)
        dev = sorted(r for r, m in states.items() if (m.meta or {}).get("deviation") == self.server_plan)
        target = f"client:{int(states[dev[0]].meta['target'])}" if dev else ""
        ups = self._target_uploads(view, target) if dev else {}
        source = self.source if self.source != "auto" else ("upload" if ups else "aggregate")
        out = []
        if source == "upload":
            for r in (r for r in dev if r in ups):
                items = np.asarray(ups[r].payload["items"], dtype=np.int64)
                values = np.abs(np.asarray(ups[r].payload["values"], dtype=np.float64))
                moved = self._moved(values.max(axis=1)) if values.size else np.zeros(0, dtype=bool)
                out.append((r, items[moved], items))
        else:
            for r in usable:
                diff = np.abs(np.asarray(states[r + 1].payload["items"]) - np.asarray(states[r].payload["items"]))
                counts = np.asarray(aggs[r].payload["counts"])
                updated = np.flatnonzero(counts > 0)
                moved = self._moved(diff.max(axis=1)[updated])
                out.append((r, updated[moved], updated))
        return source, out, {"states": states, "aggs": aggs, "target": target}

    def _moved(self, change: np.ndarray) -> np.ndarray:
        """Bool per row: its largest absolute change (``change``, (L,)) marks it as moved (``tol``)."""
        if self.tol > 0 or change.size == 0:
            return change > max(self.tol, 0.0)
        order = np.sort(change)
        logs = np.log10(np.maximum(order, 1e-300))
        steps = np.diff(logs)
        if steps.size == 0 or steps.max() < np.log10(self.gap):
            return change > 0  # no gap: every row that changed moved (the honest reading)
        cut = int(np.argmax(steps))
        return change > order[cut]

    def applicable(self, view: View) -> tuple[bool, str]:
        ok, reason = super(IsolationAttack, self).applicable(view)
        if not ok:
            return ok, reason
        mismatch = self.plan_mismatch(view)
        if mismatch:
            return False, mismatch
        source, read, _ = self._readings(view)
        if not read:
            _, _, _, aborted = self._rounds(view)
            if aborted:
                return False, f"the clients aborted every deviation round ({aborted[0]})"
            if source == "upload":
                return False, "the target's uploads of the deviation rounds are not recorded (record_rounds)"
            return False, "no deviation round has its aggregate and the next global model recorded (record_rounds)"
        return True, ""

    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        source, read, ctx = self._readings(view)
        m = int(view.config["n_items"])
        if self.rounds != -1:
            read = read[: self.rounds]
        n = len(read)
        moved, seen = np.zeros(m), np.zeros(m)
        for _, rows, updated in read:
            moved[rows] += 1.0
            seen[updated] += 1.0
        score = moved / max(n, 1)
        pred = np.flatnonzero(score >= self.threshold - 1e-12) if n else np.zeros(0, dtype=np.int64)
        honest = np.flatnonzero(seen / max(n, 1) >= self.threshold - 1e-12) if n else np.zeros(0, dtype=np.int64)
        aggs, states = ctx["aggs"], ctx["states"]
        meta = {
            "source": source,
            "rounds_used": n,
            "sybils": 0,
            "k": float(np.mean([int(aggs[r].meta.get("k", 0)) for r, _, _ in read])) if n else float("nan"),
            "honest_items": honest.astype(np.int64).tolist(),
            "crafted": str(states[read[0][0]].meta.get("crafted", "")) if n else "",
        }
        victim = {"items": pred.astype(np.int64), "score": score}
        return Reconstruction(self.name, self.party, {ctx["target"]: victim}, meta=meta)

    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        out = super().score(reconstruction, transcript)
        ((party, _),) = reconstruction.victims.items()
        hp, hr = set_precision_recall(
            np.asarray(reconstruction.meta["honest_items"], dtype=np.int64), client_truth(transcript, party)
        )
        return {**out, "honest_precision": hp, "honest_f1": f1_score(hp, hr)}

    def baseline(self, transcript: Transcript) -> dict[str, float]:
        out = super().baseline(transcript)
        return {**out, "honest_precision": out["precision"], "honest_f1": out["f1"]}

    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        out = super().prior_baseline(transcript, knowledge)
        return {**out, "honest_precision": out["precision"], "honest_f1": out["f1"]}


@register_attack("ncf-unit-saturation")
class NCFUnitSaturation(NCFActiveSaturation):
    """FedNCF (MLP, NeuMF): the logit saturated through one last-layer MLP unit, past a bias bound."""

    description = (
        "FedNCF, malicious server: one MLP unit (weights 0, bias +50, output weight -1) saturates every score; "
        "predict.bias is untouched, so a bound on it does not see the craft"
    )
    plan = {"server": "saturate", "craft_via": "mlp-unit"}
    deviations = ("choose-cohorts", "craft-network", "craft-items")
