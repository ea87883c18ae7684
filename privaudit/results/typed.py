"""Typed results: the records of ``results.json`` and ``audit.json`` as frozen dataclasses.

The experiment and the audit build their results as plain JSON-able dicts (the wire format,
``docs/results-schema.md``, validated by ``privaudit/schemas/*.json``). This module reads such a
dict into typed records and writes them back:

- :class:`ExperimentRun` (a whole ``results.json``) holds :class:`Point` (one protocol run and
  its attack), :class:`SummaryEntry` (a seed mean) and :class:`Verdict`, whose
  :class:`VerdictRow` (one swept value) holds a :class:`MetricTest` per tested metric;
- :class:`AuditRecord` (a whole ``audit.json``) holds :class:`AuditAttack`, :class:`AuditRun`
  (one protocol run, its attacks' scores as :class:`Point`), :class:`AuditCell` (one cell of the
  matrix), :class:`AuditVerdict` and, for ``privaudit audit --transcript``,
  :class:`TranscriptAuditRow`.

Every record's ``from_dict`` / ``to_dict`` round-trip is lossless: the keys come back in their
order, a key that was absent stays absent, and keys the record does not declare (a field added
by a newer privaudit or another component) are kept in :attr:`Record.extra` and written back in
place. Records are snapshots: ``from_dict`` copies its input, so changing a record never changes
the dict it was read from (records are frozen; use :func:`dataclasses.replace`).

A record is also a read-only mapping of its wire keys (``verdict["sentence"]`` is
``verdict.to_dict()["sentence"]``), so code written against the dicts (the report renderers take
any ``Mapping``) reads records unchanged.

Units: metrics and advantages are in the unit of the attack metric (``metric_specs[m]["unit"]``,
most are fractions in [0, 1]); utility costs in the unit of the utility metric; times in seconds
of wall-clock time; epsilon is the dimensionless privacy-loss bound of (epsilon, delta)-DP
(natural logarithm), delta a probability.

A leaf module (the standard library only), like the rest of :mod:`privaudit.results`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

__all__ = [
    "AuditAttack",
    "AuditCell",
    "AuditRecord",
    "AuditRun",
    "AuditVerdict",
    "ExperimentRun",
    "MetricTest",
    "Point",
    "Record",
    "SummaryEntry",
    "TranscriptAuditRow",
    "Verdict",
    "VerdictRow",
]

R = TypeVar("R", bound="Record")

#: attribute names of :class:`Record` itself (never read from a wire key)
_OWN = ("extra", "order")


def nested(cls: Any, shape: str = "one") -> Any:
    """A record field holding other records: ``shape`` ``"one"`` (a record), ``"list"`` (a list
    of records) or ``"dict"`` (a name -> record mapping). Default None (absent)."""
    return field(default=None, metadata={"record": cls, "shape": shape})


def _load(value: Any, meta: Mapping[str, Any]) -> Any:
    """A wire value as the field stores it: records where the shape says so, a deep copy of
    anything else (an unexpected shape is kept as it is: nothing is dropped)."""
    cls, shape = meta.get("record"), meta.get("shape")
    if cls is None:
        return copy.deepcopy(value)
    one = lambda v: cls.from_dict(v) if isinstance(v, Mapping) else copy.deepcopy(v)  # noqa: E731
    if shape == "list" and isinstance(value, list):
        return [one(v) for v in value]
    if shape == "dict" and isinstance(value, dict):
        return {k: one(v) for k, v in value.items()}
    if shape == "one" and isinstance(value, Mapping):
        return one(value)
    return copy.deepcopy(value)


def _dump(value: Any) -> Any:
    """The wire form of a field value: records as dicts, containers copied."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return copy.deepcopy(value)


@dataclass(frozen=True, kw_only=True)
class Record(Mapping):
    """Base of the typed records (see the module docstring).

    Attributes
    ----------
    extra : dict
        Wire keys the record does not declare, with their values (kept and written back).
    order : tuple of str or None
        The wire keys as they were read, in order (None for a record built in code: then the
        declared fields that are not None and :attr:`ALWAYS` are written, in declaration order).
    """

    #: keys written even when None for a record built in code (the schema requires them)
    ALWAYS: ClassVar[tuple[str, ...]] = ()

    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    order: tuple[str, ...] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def declared(cls) -> dict[str, dataclasses.Field]:
        """The record's wire fields by key (its dataclass fields but ``extra`` and ``order``)."""
        return {f.name: f for f in dataclasses.fields(cls) if f.name not in _OWN}

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """The record of the wire dict ``data`` (copied; see the module docstring)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"{cls.__name__}.from_dict needs a mapping, got {type(data).__name__}")
        fields = cls.declared()
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            if key in fields:
                values[key] = _load(value, fields[key].metadata)
            else:
                extra[key] = copy.deepcopy(value)
        return cls(**values, extra=extra, order=tuple(data))

    def wire_keys(self) -> list[str]:
        """The keys :meth:`to_dict` writes, in order."""
        fields = self.declared()
        if self.order is None:
            keys = [k for k in fields if k in self.ALWAYS or getattr(self, k) is not None]
            return keys + [k for k in self.extra if k not in fields]
        keys = [k for k in self.order if k in fields or k in self.extra]
        seen = set(keys)
        keys += [k for k in fields if k not in seen and getattr(self, k) is not None]  # set by replace()
        return keys + [k for k in self.extra if k not in seen and k not in fields]

    def to_dict(self) -> dict[str, Any]:
        """The wire dict (a new one: changing it leaves the record unchanged)."""
        return {key: self._wire(key) for key in self.wire_keys()}

    def _wire(self, key: str) -> Any:
        if key in self.declared():
            return _dump(getattr(self, key))
        return copy.deepcopy(self.extra[key])

    # read-only mapping of the wire keys (the report renderers take any Mapping)
    def __getitem__(self, key: str) -> Any:
        if key not in self.wire_keys():
            raise KeyError(key)
        return self._wire(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.wire_keys())

    def __len__(self) -> int:
        return len(self.wire_keys())

    def __contains__(self, key: object) -> bool:
        return key in self.wire_keys()

    __hash__ = None  # type: ignore[assignment]  # records hold dicts: unhashable


# ------------------------------------------------------------------------------ results.json


@dataclass(frozen=True, kw_only=True)
class MetricTest(Record):
    """One metric's test at one swept value (a ``tests`` entry of a verdict row).

    Attributes
    ----------
    metric : str
        The attack metric tested.
    advantage : float
        Seed-mean advantage over the strongest message-free guess, in the metric's unit and
        declared direction (positive: the attack learns more than the guess).
    se : float
        Its standard error (same unit), victims bootstrapped and seeds pooled.
    p : float
        One-sided p-value of "leaks" (the largest over the guesses), a probability.
    threshold : float
        The protection threshold: margin times ``gap`` (same unit as the metric).
    gap : float
        Distance from the strongest guess to a perfect attack (metric unit).
    n : int
        Fewest victims (or records) scored in one seed.
    over : str
        ``"victims"`` or ``"records"``: what the bootstrap resampled.
    against : str
        The strongest guess: ``"null"``, ``"prior"`` or ``"random"``.
    seeds : int
        Seeds pooled.
    family : int
        Size of the Holm family the test was corrected in.
    level : float
        The Holm-adjusted one-sided level (a probability).
    low, high : float
        The bounds of the advantage at ``level`` (metric unit).
    status : str
        ``"leaks"``, ``"below prior"``, ``"under margin"``, ``"inconclusive"`` or ``"no interval"``.
    baseline : float
        The strongest guess's score (metric unit).
    arms : dict
        Guess -> ``[advantage, se]`` against each message-free guess.
    between_seeds : bool
        The standard error includes the variance between seeds (two or more seeds).
    """

    metric: str | None = None
    advantage: float | None = None
    se: float | None = None
    p: float | None = None
    threshold: float | None = None
    gap: float | None = None
    n: int | None = None
    over: str | None = None
    against: str | None = None
    seeds: int | None = None
    family: int | None = None
    level: float | None = None
    low: float | None = None
    high: float | None = None
    status: str | None = None
    baseline: float | None = None
    arms: dict[str, Any] | None = None
    between_seeds: bool | None = None


@dataclass(frozen=True, kw_only=True)
class VerdictRow(Record):
    """A verdict's decision at one swept value (docs/verdicts.md has the procedure).

    Attributes
    ----------
    value : Any
        The swept value (None without a sweep).
    tests : dict of str -> MetricTest
        Every privacy metric's test.
    verdict : str
        ``"leaks"``, ``"protected"``, ``"no evidence of leakage"``, ``"attack below prior"``,
        ``"inconclusive"`` or ``"not applicable"``.
    advantage, advantage_low, advantage_high : float
        The primary metric's advantage and its bounds (metric unit).
    bound : float
        The bound the verdict was read from (metric unit).
    against : str
        The guess the primary metric was compared with.
    leak_metrics : list of str
        Metrics whose lower bound is above 0.
    defended : bool
        A defense was active at this value.
    control : bool
        The attack leaks at a weaker row or without a defense (the positive control "protected" needs).
    utility, utility_ci95 : float
        The main utility metric (seed mean) and its Student-t 95 % half-width (utility unit).
    utility_by_seed : dict
        Seed -> utility (utility unit).
    epsilon : float
        Claimed epsilon, total over the run (dimensionless).
    epsilon_lb : float
        In-sample empirical lower bound on epsilon (dimensionless).
    dp_violation : bool
        That bound is above the claim (shown, never a verdict).
    canary : dict or None
        The point's ``canary_audit``.
    supported : bool
        The attack applied to the view.
    """

    ALWAYS = ("value", "verdict", "tests")

    value: Any = None
    tests: dict[str, MetricTest] | None = nested(MetricTest, "dict")
    verdict: str | None = None
    advantage: float | None = None
    advantage_low: float | None = None
    advantage_high: float | None = None
    bound: float | None = None
    against: str | None = None
    leak_metrics: list[str] | None = None
    defended: bool | None = None
    control: bool | None = None
    utility: float | None = None
    utility_ci95: float | None = None
    utility_by_seed: dict[str, float] | None = None
    epsilon: float | None = None
    epsilon_lb: float | None = None
    dp_violation: bool | None = None
    canary: dict[str, Any] | None = None
    supported: bool | None = None


@dataclass(frozen=True, kw_only=True)
class Verdict(Record):
    """The verdict of one attack over a sweep.

    Attributes
    ----------
    attack : str
        Attack name.
    metric : str
        Its primary metric.
    parameter : str or None
        The swept parameter (``laplace.scale``).
    strength : Any
        The weakest tested strength whose row is "protected", or None.
    margin : float
        Protection margin, a share of the gap between the guess and a perfect attack.
    utility_metric : str or None
        The utility metric of the cost.
    utility_cost, utility_cost_low, utility_cost_high : float or None
        Utility lost at ``strength`` against no defense and its 95 % interval over paired seeds
        (utility unit).
    utility_cost_within_noise : bool
        The interval holds 0.
    dp_violation : bool
        A canary audit bounds epsilon above the claim.
    notes : str
        "attack below prior" strengths and canary audits, in words.
    sentence : str
        The verdict in one sentence (the reports).
    plain : str
        The verdict in plain words, at most 160 characters (the console's first line).
    detail : str
        The statistical detail of ``plain``.
    rows : list of VerdictRow
        Per swept value.
    reference_row : VerdictRow
        The undefended reference runs' row, when there are some.
    """

    ALWAYS = ("attack", "metric", "sentence", "dp_violation")

    attack: str | None = None
    metric: str | None = None
    parameter: str | None = None
    strength: Any = None
    margin: float | None = None
    utility_metric: str | None = None
    utility_cost: float | None = None
    utility_cost_low: float | None = None
    utility_cost_high: float | None = None
    utility_cost_within_noise: bool | None = None
    dp_violation: bool | None = None
    notes: str | None = None
    sentence: str | None = None
    plain: str | None = None
    detail: str | None = None
    rows: list[VerdictRow] | None = nested(VerdictRow, "list")
    reference_row: VerdictRow | None = nested(VerdictRow)


@dataclass(frozen=True, kw_only=True)
class Point(Record):
    """One protocol run attacked once: a ``points`` entry (or an audit run's attack entry).

    Attributes
    ----------
    value : Any
        The swept value (None without a sweep).
    seed : int or None
        The protocol's seed.
    attack_metrics : dict of str -> float
        Metric -> score (metric unit).
    baseline_random, baseline_prior, baseline_null : dict of str -> float
        The same metrics for the uniform random guess, the prior-only guess and the attack's
        pipeline on the null view (metric unit).
    supported : bool
        The attack applied to the view (else ``reason`` says why).
    advantage : dict of str -> float
        Metric -> score minus the stronger of the random and prior guesses (metric unit).
    advantage_against : dict of str -> str
        Metric -> ``"prior"`` or ``"random"``.
    roc : dict
        Decision set -> ROC summary (AUC, TPR at 1 % and 0.1 % FPR, the curve).
    empirical_epsilon : dict
        Decision set -> empirical lower bound on epsilon (dimensionless) and its counts.
    bootstrap : dict
        Metric -> the victim bootstrap's standard errors (metric unit) and ``n``.
    canary_audit : dict
        The one-run canary lower bound on epsilon (an audit's DP cell).
    utility : dict of str -> float
        The protocol's utility metrics (their units).
    privacy : dict
        Defense name -> its ``privacy_spent`` for the whole run (epsilon, delta, rounds, unit).
    seconds, protocol_seconds, attack_seconds : float
        Wall-clock seconds (a shared protocol run is split over its attack variants).
    reason : str or None
        Why the attack did not apply.
    reference : bool
        An undefended reference run (the ``reference`` list).
    error : str
        In an audit: the attack failed with this error.
    """

    ALWAYS = ("value", "seed", "attack_metrics")

    value: Any = None
    seed: int | None = None
    attack_metrics: dict[str, float] | None = None
    baseline_random: dict[str, float] | None = None
    baseline_prior: dict[str, float] | None = None
    baseline_null: dict[str, float] | None = None
    supported: bool | None = None
    advantage: dict[str, float] | None = None
    advantage_against: dict[str, str] | None = None
    roc: dict[str, Any] | None = None
    empirical_epsilon: dict[str, Any] | None = None
    bootstrap: dict[str, Any] | None = None
    canary_audit: dict[str, Any] | None = None
    utility: dict[str, float] | None = None
    privacy: dict[str, Any] | None = None
    seconds: float | None = None
    protocol_seconds: float | None = None
    attack_seconds: float | None = None
    reason: str | None = None
    reference: bool | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class SummaryEntry(Record):
    """A seed mean of one quantity at one swept value (a ``summary`` entry).

    Attributes
    ----------
    value : Any
        The swept value.
    metric : str
        An attack metric, or ``baseline.<m>``, ``prior.<m>``, ``advantage.<m>``, ``utility.<m>``.
    mean : float or None
        Mean over seeds (the quantity's unit).
    ci95 : float or None
        Student-t 95 % half-width over seeds (same unit); None with one seed.
    """

    ALWAYS = ("value", "metric", "mean", "ci95")

    value: Any = None
    metric: str | None = None
    mean: float | None = None
    ci95: float | None = None


@dataclass(frozen=True, kw_only=True)
class ExperimentRun(Record):
    """A whole ``results.json``: one experiment (a sweep over seeds) or one attacked transcript.

    Attributes
    ----------
    schema_version : int
        Version of the results schema (present once written).
    privaudit_version : str
        Version that wrote the results.
    protocol : str
        Protocol name.
    protocol_config : dict
        The protocol's full config.
    attack : str
        Attack name.
    sweep : str or None
        ``TARGET.PARAM`` swept, None for a single point.
    defenses : list of dict
        Active defenses with their parameters (``{"name": ..., param: value}``).
    dataset : dict
        The dataset summary (``name``, ``users``, ``items``, ..., ``source``).
    points : list of Point
        One per (swept value, seed).
    summary : list of SummaryEntry
        Seed means per swept value and quantity.
    verdicts : list of Verdict
        One per attack.
    reference : list of Point
        The undefended reference runs, when the sweep needs them.
    attack_params : dict
        The attack's full parameters.
    attack_description : str
        One line.
    sweep_values : list
        The swept values in order (``[None]`` without a sweep).
    defense_strengths : dict
        Defense name -> ``{"strength", "description", "help"}``.
    noise : bool
        The sweep is a noise scale.
    seeds : list of int
        The seeds run.
    primary_metric : str
        The attack metric verdicts and audits use.
    total_seconds : float
        Wall-clock seconds of the whole experiment.
    margin : float
        The ``--margin`` given, a share of the gap to a perfect attack.
    metric_specs : dict
        Attack metric -> its declared spec (direction, unit, description, perfect value).
    utility_metric : str or None
        The utility metric tables and figures show.
    utility_specs : dict
        Utility metric -> its declared spec.
    figure_metrics : list of str
        Attack metrics plotted and tabulated.
    transcript : bool
        A recorded transcript was attacked.
    dp_claims : list of dict
        Recorded apps: per DP component, does the delivered epsilon hold the claim.
    """

    schema_version: int | None = None
    privaudit_version: str | None = None
    protocol: str | None = None
    protocol_config: dict[str, Any] | None = None
    attack: str | None = None
    sweep: str | None = None
    defenses: list[dict[str, Any]] | None = None
    dataset: dict[str, Any] | None = None
    points: list[Point] | None = nested(Point, "list")
    summary: list[SummaryEntry] | None = nested(SummaryEntry, "list")
    verdicts: list[Verdict] | None = nested(Verdict, "list")
    reference: list[Point] | None = nested(Point, "list")
    attack_params: dict[str, Any] | None = None
    attack_description: str | None = None
    sweep_values: list[Any] | None = None
    defense_strengths: dict[str, Any] | None = None
    noise: bool | None = None
    seeds: list[int | None] | None = None
    primary_metric: str | None = None
    total_seconds: float | None = None
    margin: float | None = None
    metric_specs: dict[str, Any] | None = None
    utility_metric: str | None = None
    utility_specs: dict[str, Any] | None = None
    figure_metrics: list[str] | None = None
    transcript: bool | None = None
    dp_claims: list[dict[str, Any]] | None = None


# ------------------------------------------------------------------------------ audit.json


@dataclass(frozen=True, kw_only=True)
class AuditAttack(Record):
    """An attack an audit ran (an ``attacks`` entry).

    Attributes
    ----------
    name : str
        Attack name (``<attack>:rounds=<r>`` for a malicious attack read at several rounds).
    description : str
        One line.
    party : str
        The party it plays.
    requires : list of str
        What it needs from the view.
    primary_metric : str
        The metric its cells show.
    audit_params : dict
        Parameters it ran with.
    threat : str
        ``"honest-but-curious"`` or ``"malicious"``.
    metric_specs : dict
        Metric -> declared spec.
    applies : bool
        It ran on the undefended view.
    reason : str
        Why it does not apply.
    variant_of : str
        The registered attack of a round variant.
    """

    ALWAYS = ("name", "primary_metric", "applies")

    name: str | None = None
    description: str | None = None
    party: str | None = None
    requires: list[str] | None = None
    primary_metric: str | None = None
    audit_params: dict[str, Any] | None = None
    threat: str | None = None
    metric_specs: dict[str, Any] | None = None
    applies: bool | None = None
    reason: str | None = None
    variant_of: str | None = None


@dataclass(frozen=True, kw_only=True)
class AuditRun(Record):
    """One protocol run of an audit and every attack on it (a ``runs`` entry).

    Attributes
    ----------
    defense : str or None
        The defense cell (None: undefended).
    value : Any
        Its grid value.
    seed : int
        The protocol's seed.
    threat : str
        The server the run was simulated with (``honest-but-curious`` or ``malicious``).
    utility : dict of str -> float
        The protocol's utility metrics (their units).
    privacy : dict
        Defense name -> its ``privacy_spent`` over the run.
    protocol_seconds : float
        Wall-clock seconds of the protocol run.
    attacks : dict of str -> Point
        Attack name -> its scores (or ``{"error": ...}``, a :class:`Point` with ``error``).
    error : str
        The protocol run failed with this error.
    canary_audit : dict
        The canary run's lower bound on epsilon (a DP cell).
    """

    ALWAYS = ("defense", "value", "seed")

    defense: str | None = None
    value: Any = None
    seed: int | None = None
    threat: str | None = None
    utility: dict[str, float] | None = None
    privacy: dict[str, Any] | None = None
    protocol_seconds: float | None = None
    attacks: dict[str, Point] | None = nested(Point, "dict")
    error: str | None = None
    canary_audit: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class AuditCell(Record):
    """One cell of the audit matrix: an attack against a defense at its strongest grid value.

    Attributes
    ----------
    attack : str
        Attack name.
    defense : str or None
        Defense cell (None: the undefended column).
    value : Any
        The grid value read (the strongest).
    metric : str
        The attack's primary metric.
    verdict : str
        A row verdict (see :class:`VerdictRow`).
    verdict_label : str
        The verdict as the reports print it.
    advantage, advantage_low, advantage_high : float or None
        Advantage and its bounds (metric unit).
    advantage_ci95 : float or None
        Its half-width (metric unit).
    against : str
        The strongest message-free guess.
    bound : float or None
        The bound the verdict was read from (metric unit).
    leak_metrics : list of str
        Metrics shown to leak.
    utility : float or None
        Main utility there (utility unit).
    utility_cost, utility_cost_low, utility_cost_high : float or None
        Utility lost against no defense and its 95 % interval over paired seeds (utility unit).
    utility_cost_within_noise : bool
        That interval holds 0.
    epsilon : float or None
        Claimed epsilon, total over the run (dimensionless).
    epsilon_lb : float or None
        Empirical lower bound on epsilon (dimensionless).
    dp_violation : bool
        A DP claim is shown violated.
    canary : dict or None
        The canary audit of the cell.
    min_advantage, min_advantage_value : float, Any
        The smallest advantage over the grid and where.
    errors : list of str
        Runs that failed.
    reasons : list of str
        Why the attack did not apply.
    threat : str
        The threat model of the attack.
    """

    ALWAYS = ("attack", "defense", "value", "metric", "verdict", "advantage", "dp_violation")

    attack: str | None = None
    defense: str | None = None
    value: Any = None
    metric: str | None = None
    verdict: str | None = None
    verdict_label: str | None = None
    advantage: float | None = None
    advantage_low: float | None = None
    advantage_high: float | None = None
    advantage_ci95: float | None = None
    against: str | None = None
    bound: float | None = None
    leak_metrics: list[str] | None = None
    utility: float | None = None
    utility_cost: float | None = None
    utility_cost_low: float | None = None
    utility_cost_high: float | None = None
    utility_cost_within_noise: bool | None = None
    epsilon: float | None = None
    epsilon_lb: float | None = None
    dp_violation: bool | None = None
    canary: dict[str, Any] | None = None
    min_advantage: float | None = None
    min_advantage_value: Any = None
    errors: list[str] | None = None
    reasons: list[str] | None = None
    threat: str | None = None


@dataclass(frozen=True, kw_only=True)
class AuditVerdict(Record):
    """An audit's verdict on one attack.

    Attributes
    ----------
    attack : str
        Attack name.
    metric : str
        Its primary metric.
    defense : str or None
        The defense with the lowest utility cost among those that protect, or None.
    strength : Any
        Its weakest protecting grid value.
    utility_metric : str or None
        The utility metric of the cost.
    utility_cost : float or None
        Utility lost there (utility unit).
    dp_violation : bool
        A DP claim is shown violated.
    sentence : str
        The verdict in one sentence.
    threat : str
        The attack's threat model.
    """

    ALWAYS = ("attack", "sentence", "dp_violation")

    attack: str | None = None
    metric: str | None = None
    defense: str | None = None
    strength: Any = None
    utility_metric: str | None = None
    utility_cost: float | None = None
    dp_violation: bool | None = None
    sentence: str | None = None
    threat: str | None = None


@dataclass(frozen=True, kw_only=True)
class TranscriptAuditRow(Record):
    """One attack on a recorded transcript (``privaudit audit --transcript``).

    Attributes
    ----------
    attack : str
        Attack name.
    metric : str
        Its primary metric.
    applies : bool
        It ran on the transcript.
    verdict : str
        A row verdict.
    reason : str or None
        Why it does not apply.
    tests : dict of str -> MetricTest
        Every privacy metric's test.
    leak_metrics : list of str
        Metrics shown to leak.
    advantage, advantage_low, advantage_high : float or None
        The tested metric's advantage and bounds (metric unit).
    tested_metric : str
        The metric the advantage is of.
    metrics, baseline_random, baseline_prior : dict of str -> float
        Scores and guesses (metric unit).
    seconds : float
        Wall-clock seconds.
    """

    ALWAYS = ("attack", "metric", "applies", "verdict")

    attack: str | None = None
    metric: str | None = None
    applies: bool | None = None
    verdict: str | None = None
    reason: str | None = None
    tests: dict[str, MetricTest] | None = nested(MetricTest, "dict")
    leak_metrics: list[str] | None = None
    advantage: float | None = None
    advantage_low: float | None = None
    advantage_high: float | None = None
    tested_metric: str | None = None
    metrics: dict[str, float] | None = None
    baseline_random: dict[str, float] | None = None
    baseline_prior: dict[str, float] | None = None
    seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class AuditRecord(Record):
    """A whole ``audit.json``: a simulated audit (``matrix``) or a transcript audit (``rows``).

    Attributes
    ----------
    schema_version : int
        Version of the audit schema (present once written).
    privaudit_version : str
        Version that wrote the audit.
    protocol : str
        Protocol name.
    protocol_config : dict
        The protocol's full config.
    seeds : list of int
        The seeds of the honest runs.
    attacks : list of AuditAttack
        The attacks run.
    defenses : list of dict
        The defense cells (``name``, ``description``, ``strength``, ``grid`` weakest first,
        ``params``, ``stack``); a transcript audit: the defenses the transcript records.
    skipped_defenses : list of dict
        ``{"name", "reason"}`` of defenses left out.
    threat : str
        The threat models run (``both``, ``honest-but-curious``, ``malicious``).
    dataset : dict
        The dataset summary.
    utility_metric : str or None
        The utility metric of the costs.
    utility_specs : dict
        Utility metric -> declared spec.
    runs : list of AuditRun
        One per (defense cell or none, grid value, seed).
    matrix : list of AuditCell
        One per (attack, defense cell or none).
    verdicts : list of AuditVerdict
        One per attack.
    threat_verdicts : list of dict
        Per threat model and column, in words.
    timing : dict
        ``total_seconds``, ``load_seconds``, ``run_seconds`` (wall-clock seconds), ``runs``, ``backend``.
    margin : float
        The ``--margin`` given.
    app : dict
        A transcript audit: the recorded app.
    private_included : bool
        A transcript audit: the transcript holds the private messages (scores are possible).
    rows : list of TranscriptAuditRow
        A transcript audit: one per attack.
    dp_claims : list of dict
        Recorded apps: per DP component, does the delivered epsilon hold the claim.
    """

    schema_version: int | None = None
    privaudit_version: str | None = None
    protocol: str | None = None
    protocol_config: dict[str, Any] | None = None
    seeds: list[int] | None = None
    attacks: list[AuditAttack] | None = nested(AuditAttack, "list")
    defenses: list[dict[str, Any]] | None = None
    skipped_defenses: list[dict[str, Any]] | None = None
    threat: str | None = None
    dataset: dict[str, Any] | None = None
    utility_metric: str | None = None
    utility_specs: dict[str, Any] | None = None
    runs: list[AuditRun] | None = nested(AuditRun, "list")
    matrix: list[AuditCell] | None = nested(AuditCell, "list")
    verdicts: list[AuditVerdict] | None = nested(AuditVerdict, "list")
    threat_verdicts: list[dict[str, Any]] | None = None
    timing: dict[str, Any] | None = None
    margin: float | None = None
    app: Any = None
    private_included: bool | None = None
    rows: list[TranscriptAuditRow] | None = nested(TranscriptAuditRow, "list")
    dp_claims: list[dict[str, Any]] | None = None
