"""The :class:`Attack` base class and :class:`Reconstruction` (set and ROC scoring helpers: :mod:`privaudit.metrics`).

An attack plays one party (``party``, usually ``server``). It receives that party's
:class:`~privaudit.transcript.View` and the prior knowledge the experiment grants it
(:meth:`Attack.prior_knowledge`, e.g. a fraction of a victim's ratings), and returns a
:class:`Reconstruction`. Scoring reads the victims' ``private`` messages from the full
transcript; the attack itself never sees them.

An attack that finds its view lacks what it needs (``requires``: message kinds holding
per-client plaintext) says why and scores as the random-guess baseline; it never crashes.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privaudit.attacks.null_view import null_view
from privaudit.params import Configurable
from privaudit.registry import RegisteredName
from privaudit.results import Decisions, MetricSpec, VictimTable
from privaudit.transcript import Transcript, View


@dataclass
class Reconstruction:
    """What an attack recovered.

    Attributes
    ----------
    attack : str
    party : str
        The party the attacker played.
    victims : dict[str, dict[str, numpy.ndarray]]
        Victim party id -> reconstructed fields (e.g. ``items``, ``ratings``, ``attributes``).
    supported : bool
        False when the view lacked what the attack needs (then ``reason`` says why).
    reason : str
    meta : dict
        JSON-able details (solver used, seconds, per-user diagnostics summary).
    """

    attack: str
    party: str
    victims: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    supported: bool = True
    reason: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


class Attack(Configurable, metaclass=ABCMeta):
    """Base class of attacks.

    A subclass implements the abstract methods :meth:`applicable`, :meth:`run`, :meth:`score`,
    :meth:`baseline` and :meth:`prior_baseline` (it cannot be instantiated otherwise);
    :meth:`prior_knowledge`, :meth:`decisions` and :meth:`victim_table` are optional, and so is
    per-shard scoring of a sharded run (:meth:`shard_part` with :meth:`merge_shards`).

    Class attributes
    ----------------
    party : str
        The party the attacker plays.
    protocols : tuple[str, ...]
        Protocol names whose transcripts it reads.
    requires : tuple[str, ...]
        Message kinds the view must hold (in plaintext) for the attack to apply.
    default_sweep : tuple[str, tuple] | None
        ``(param, values)`` swept when an experiment names no sweep (e.g. an aux fraction).
    primary_metric : str
        The metric an audit summarises (accuracy minus baseline).
    metric_specs : dict[str, MetricSpec]
        What each metric :meth:`score` returns means (direction, plotted, unit, glossary line).
    """

    kind_label = "attack"
    #: the registered name (looked up in the registry; registering never sets it)
    name = RegisteredName()
    party: str = "server"
    protocols: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    default_sweep: tuple[str, tuple] | None = None
    primary_metric: str = "accuracy"
    metric_specs: dict[str, MetricSpec] = {}
    #: Threat model: ``"honest-but-curious"`` (reads what the protocol gives its party) or
    #: ``"malicious"`` (its party deviates from the protocol; the attack declares how).
    threat: str = "honest-but-curious"
    #: Parameters ``privaudit audit`` uses for this attack (e.g. a victim subsample for a slow
    #: attack, so that a whole attack x defense grid stays affordable); the audit report lists them.
    audit_params: dict[str, Any] = {}
    #: Whether :meth:`evaluate` also runs the attack on the null view
    #: (:mod:`privaudit.attacks.null_view`) for the ``baseline_null`` arm of the verdicts (never for
    #: a malicious-threat attack: its crafted rounds, not the victims' data, decide what it reads).
    null_arm: bool = True
    #: Whether the null view keeps the victims' own item ids (True: the metrics are defined on the
    #: uploaded ids, e.g. the rating of every uploaded item) or takes the donor's whole messages
    #: (False: the id set is what leaks, e.g. which items a client trained).
    null_keeps_ids: bool = True

    @abstractmethod
    def applicable(self, view: View) -> tuple[bool, str]:
        """Whether ``view`` holds what this attack needs, and if not, why.

        Parameters
        ----------
        view : View
            What the attacker's ``party`` saw (never another party's ``private`` messages).

        Returns
        -------
        (bool, str)
            ``(True, "")``, or ``(False, reason)`` with a one-line reason the report shows; the
            attack then scores as the random-guess baseline. ``super().applicable(view)`` gives
            the usual rule: every kind in :attr:`requires` present, none only masked or encrypted.
        """
        kinds = view.kinds()
        missing = [k for k in self.requires if kinds.get(k, 0) == 0]
        if missing:
            return False, f"the {view.party}'s view holds no {', '.join(missing)} messages"
        encrypted = [
            k for k in self.requires if any(m.meta.get("encrypted") or m.meta.get("masked") for m in view.select(k))
        ]
        if encrypted:
            return False, (
                f"the {view.party}'s view holds {', '.join(encrypted)} only as ciphertexts or masked values "
                "(no per-client plaintext)"
            )
        return True, ""

    def prior_knowledge(self, transcript: Transcript, rng: np.random.Generator) -> dict[str, Any]:
        """Side knowledge granted to the attacker (default: none)."""
        return {}

    @abstractmethod
    def run(self, view: View, knowledge: dict[str, Any], rng: np.random.Generator) -> Reconstruction:
        """Reconstruct the victims' private data from what the attacker's party saw.

        Parameters
        ----------
        view : View
            The messages ``party`` received (its own ``state`` included) and the public config;
            never another party's ``private`` messages.
        knowledge : dict
            Side knowledge from :meth:`prior_knowledge` (e.g. an auxiliary fraction of ratings).
        rng : numpy.random.Generator
            The attack's only source of randomness.

        Returns
        -------
        Reconstruction
            Per victim party, the reconstructed fields; ``supported`` False with a ``reason``
            when the view turns out to lack what the attack needs.
        """

    @abstractmethod
    def score(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, float]:
        """Score ``reconstruction`` against the victims' ``private`` messages of ``transcript``.

        Parameters
        ----------
        reconstruction : Reconstruction
            What :meth:`run` returned (``supported`` is True here).
        transcript : Transcript
            The full transcript, victims' ``private`` messages included (the ground truth).

        Returns
        -------
        dict[str, float]
            Metric name -> value, one entry per metric :attr:`metric_specs` declares (NaN where
            undefined); :meth:`baseline` and :meth:`prior_baseline` return the same keys.
        """

    @abstractmethod
    def baseline(self, transcript: Transcript) -> dict[str, float]:
        """The same metrics as :meth:`score` for the uniform random guess over each value domain
        (required: an attack that does not apply scores as this guess).

        Returns
        -------
        dict[str, float]
            Metric name -> value of the random guess (its expectation where it has one).
        """

    @abstractmethod
    def prior_baseline(self, transcript: Transcript, knowledge: dict[str, Any]) -> dict[str, float]:
        """The same metrics for the best guess from the attacker's prior knowledge alone.

        The strongest strategy an attacker with ``knowledge`` (and the public config) but
        without the victims' messages has: the majority value, per-attribute prior, item
        popularity, its auxiliary data. Scored against the same truth as :meth:`score`.

        Parameters
        ----------
        transcript : Transcript
            The full transcript (ground truth; the strategy itself must not read the victims'
            ``private`` messages or uploads).
        knowledge : dict
            What :meth:`prior_knowledge` granted.

        Returns
        -------
        dict[str, float]
            Metric name -> value, the keys of :meth:`score`; verdicts test the attack's
            advantage over the stronger of this and :meth:`baseline`.
        """

    def decisions(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, Decisions]:
        """Per-record scores and truth of the attack's binary decisions (default: none).

        Keyed by decision name (``"rated"``, ``"member"``); experiments turn each into a
        ROC curve, AUC, TPR at 1 % and 0.1 % FPR and, under DP, an empirical epsilon.
        """
        return {}

    def victim_table(
        self, reconstruction: Reconstruction, transcript: Transcript, knowledge: dict[str, Any]
    ) -> VictimTable | None:
        """Per-victim numerators and denominators of :meth:`score`'s metrics and of
        :meth:`prior_baseline`'s (default: none, and verdicts then have no per-victim interval).

        Its values must agree with :meth:`score` and :meth:`prior_baseline` on every metric it
        holds (``VictimTable.value``).
        """
        return None

    def shard_part(self, reconstruction: Reconstruction, transcript: Transcript) -> dict[str, Any] | None:
        """What this attack's scores on one block of a sharded run contribute
        (:func:`privaudit.sharded.attack_shards`, on the worker that reads the block's shards):
        plain sums (hits, weights, counts) that :meth:`merge_shards` adds over the blocks.
        None (the default): the attack is not scored per shard."""
        return None

    @classmethod
    def merge_shards(cls, parts: list[dict[str, Any]], config: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        """``{"metrics": ..., "baseline": ...}`` of the whole sharded run from the blocks'
        :meth:`shard_part` (in block order) and the run's public ``config``."""
        raise NotImplementedError(f"attack {cls.name!r} declares shard_part without merge_shards")

    def unsupported(self, reason: str) -> Reconstruction:
        return Reconstruction(self.name, self.party, {}, supported=False, reason=reason)

    def evaluate(self, transcript: Transcript, rng: np.random.Generator) -> AttackOutcome:
        """Run the attack on its party's view of ``transcript`` and score it.

        When the attack does not apply, the metrics equal the random baseline and ``reason``
        says why. ``baseline_prior`` is :meth:`prior_baseline` with the same prior knowledge;
        ``decisions`` is :meth:`decisions` of a supported reconstruction. ``baseline_null`` is
        the same attack (same knowledge, an independent random stream) on the null view of
        :mod:`privaudit.attacks.null_view`, scored against the same truth; its per-victim
        numerators go into the victim table's ``null`` (when its victims and weights match).
        """
        view = transcript.view(self.party)
        ok, reason = self.applicable(view)
        knowledge = self.prior_knowledge(transcript, rng)
        recon = self.run(view, knowledge, rng) if ok else self.unsupported(reason)
        base = self.baseline(transcript)
        metrics = self.score(recon, transcript) if recon.supported else dict(base)
        prior = self.prior_baseline(transcript, knowledge)
        decisions = self.decisions(recon, transcript) if recon.supported else {}
        victims = self.victim_table(recon, transcript, knowledge) if recon.supported else None
        null_metrics: dict[str, float] = {}
        if recon.supported and self.null_arm and self.threat != "malicious":  # its own plan decides what it reads
            null_metrics = self._null_arm(view, transcript, knowledge, rng, victims)
        return AttackOutcome(metrics, base, recon, prior, decisions, victims, null_metrics)

    def _null_arm(
        self,
        view: View,
        transcript: Transcript,
        knowledge: dict[str, Any],
        rng: np.random.Generator,
        victims: VictimTable | None,
    ) -> dict[str, float]:
        """Metrics of the attack on the null view (empty when it does not run there); fills
        ``victims.null`` in place where the null table scores the same victims and weights."""
        try:  # an independent stream that leaves ``rng`` where the real arm left it
            null_rng = rng.spawn(1)[0]
        except (AttributeError, TypeError, ValueError):
            null_rng = np.random.default_rng(np.random.SeedSequence([int(transcript.seed or 0), 0x4E11]))
        nv = null_view(view, null_rng, keep_ids=self.null_keeps_ids)
        if nv is view:
            return {}
        recon = self.run(nv, knowledge, null_rng)
        if not recon.supported:
            return {}
        out = self.score(recon, transcript)
        table = self.victim_table(recon, transcript, knowledge) if victims is not None else None
        if table is not None and victims is not None and list(table.victims) == list(victims.victims):
            for m in victims.attack:
                if m in table.attack and np.array_equal(table.weight[m], victims.weight[m]):
                    victims.null[m] = table.attack[m]
        return out


@dataclass
class AttackOutcome:
    """Scored result of :meth:`Attack.evaluate`.

    Attributes
    ----------
    metrics : dict[str, float]
        What :meth:`Attack.score` returned (the random baseline when the attack did not apply).
    baseline : dict[str, float]
        The uniform random guess (:meth:`Attack.baseline`), same keys.
    reconstruction : Reconstruction
    baseline_prior : dict[str, float]
        The prior-only guess (:meth:`Attack.prior_baseline`), same keys; empty if undefined.
    decisions : dict[str, Decisions]
        Per-record scores and truth (:meth:`Attack.decisions`); empty if none.
    victims : VictimTable or None
        Per-victim parts of the metrics and of the prior (:meth:`Attack.victim_table`).
    baseline_null : dict[str, float]
        The attack's own pipeline on the null view (:mod:`privaudit.attacks.null_view`), same
        keys; empty when it did not run.
    """

    metrics: dict[str, float]
    baseline: dict[str, float]
    reconstruction: Reconstruction
    baseline_prior: dict[str, float] = field(default_factory=dict)
    decisions: dict[str, Decisions] = field(default_factory=dict)
    victims: VictimTable | None = None
    baseline_null: dict[str, float] = field(default_factory=dict)
