"""What an attack's results mean: :class:`MetricSpec` (direction, unit, plotting, testing of a
metric), :class:`Decisions` (per-record scores for ROC-style metrics) and :class:`VictimTable`
(per-victim parts of the metrics, for intervals that resample victims). Attack authors import
this module; the protocol utility metrics' specs live here too."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privaudit.results.numbers import num


@dataclass(frozen=True)
class MetricSpec:
    """What one attack metric means.

    Attributes
    ----------
    higher_is_better : bool
        True when a larger value means a more successful attack (accuracy, AUC); False for
        errors (RMSE, relative error) where the attacker wants the value small.
    plotted : bool
        Whether accuracy-vs-strength figures draw it (counts and sizes are not plotted).
    unit : str
        ``"fraction"`` (in [0, 1]), ``"rating"`` (rating points), ``"count"``, ``"seconds"`` ...
    description : str
        One sentence for the report's glossary.
    perfect : float or None
        The value of a perfect attack (1 for an accuracy or AUC, 0 for an error); the verdict
        margin is a share of the gap between the baseline and this value. None: the default of
        :func:`spec_perfect` (1 for a higher-is-better fraction, 0 for a lower-is-better metric,
        else none: the margin is then in the metric's unit).
    tested : bool
        Whether verdicts test it. False for one half of a trade-off that a message-free guess
        maximises on its own (recall: guess every item; precision: guess one popular item);
        the metric that combines both (F1, AUC, accuracy) is tested instead.
    """

    higher_is_better: bool = True
    plotted: bool = True
    unit: str = "fraction"
    description: str = ""
    perfect: float | None = None
    tested: bool = True


@dataclass
class Decisions:
    """Per-record decisions of an attack: one score per record, higher = more likely positive.

    Attributes
    ----------
    scores : numpy.ndarray of shape (n_records,)
        Finite floats.
    labels : numpy.ndarray of shape (n_records,)
        Bool truth (True = positive: a member, a really rated item, a trained item).
    positive : str
        What a positive is, for the report (``"rated item"``, ``"member row"``).
    """

    scores: np.ndarray
    labels: np.ndarray
    positive: str = "positive"
    meta: dict = field(default_factory=dict)
    groups: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.scores = np.asarray(self.scores, dtype=float).ravel()
        self.labels = np.asarray(self.labels, dtype=bool).ravel()
        if self.scores.shape != self.labels.shape:
            raise ValueError(f"{self.scores.size} scores but {self.labels.size} labels")
        if self.groups is not None:
            self.groups = np.asarray(self.groups, dtype=np.int64).ravel()
            if self.groups.shape != self.scores.shape:
                raise ValueError(f"{self.scores.size} scores but {self.groups.size} group ids")


@dataclass
class VictimTable:
    """Per-victim parts of an attack's metrics and of its prior-only guess, for intervals
    that resample victims (a cluster bootstrap over users).

    For every metric ``M`` it holds, the attack's value is ``sum(attack[M]) / sum(weight[M])``
    over the victims and the prior-only guess's value is ``sum(prior[M]) / sum(weight[M])``;
    with ``M`` in ``root``, the square root of that ratio (an RMSE from squared errors).

    Attributes
    ----------
    victims : list of str
        Victim party ids, length n_victims.
    weight : dict[str, numpy.ndarray of shape (n_victims,)]
        Denominators (e.g. a victim's number of scored ratings).
    attack : dict[str, numpy.ndarray of shape (n_victims,)]
        Numerators of the attack (e.g. its number of correct ratings).
    prior : dict[str, numpy.ndarray of shape (n_victims,)]
        Numerators of the prior-only guess, same metrics.
    root : frozenset of str
        Metrics reported as the square root of the ratio.
    harmonic : dict[str, tuple[str, str]]
        Metrics derived as the harmonic mean of two of the ratios above (F1 from precision and
        recall): ``{"f1": ("precision", "recall")}``; resampled with them.
    null : dict[str, numpy.ndarray of shape (n_victims,)]
        Numerators of the attack's own pipeline on the null view (the victims' messages replaced
        by ones that carry nothing about their data; :mod:`privaudit.attacks.null_view`), same
        weights; filled by :meth:`privaudit.attacks.base.Attack.evaluate` (empty otherwise).
    """

    victims: list[str]
    weight: dict[str, np.ndarray]
    attack: dict[str, np.ndarray]
    prior: dict[str, np.ndarray]
    root: frozenset[str] = frozenset()
    harmonic: dict[str, tuple[str, str]] = field(default_factory=dict)
    null: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.victims)
        for part in (self.weight, self.attack, self.prior, self.null):
            for name in list(part):
                part[name] = np.asarray(part[name], dtype=float).ravel()
                if part[name].shape != (n,):
                    raise ValueError(f"metric {name!r}: {part[name].size} values for {n} victims")
        if set(self.attack) != set(self.weight):
            raise ValueError("attack and weight name different metrics")
        for name, parts in self.harmonic.items():
            if len(parts) != 2 or any(p not in self.attack for p in parts):
                raise ValueError(f"metric {name!r}: harmonic of {parts!r}, which the table does not hold")

    def value(self, metric: str, which: str = "attack", index: np.ndarray | None = None) -> float:
        """The metric over the victims at ``index`` (all by default) for ``which`` in
        {"attack", "prior", "null"}; NaN when the weights sum to 0."""
        if metric in self.harmonic:
            a, b = (self.value(m, which, index) for m in self.harmonic[metric])
            return harmonic_mean(a, b)
        num = getattr(self, which)[metric]
        den = self.weight[metric]
        if index is not None:
            num, den = num[index], den[index]
        total = float(den.sum())
        if total <= 0:
            return math.nan
        v = float(num.sum()) / total
        return math.sqrt(max(v, 0.0)) if metric in self.root else v


def harmonic_mean(a: Any, b: Any) -> Any:
    """2ab / (a + b), elementwise for arrays; 0 where a + b = 0, NaN where either is NaN."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    total = a + b
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(total > 0, 2 * a * b / np.where(total > 0, total, 1.0), np.where(np.isnan(total), np.nan, 0.0))
    return float(out) if out.ndim == 0 else out


#: The explicit fallback for a metric its attack does not declare in ``metric_specs`` (a plugin
#: written before the declarations existed): higher is better; plotted only when every
#: recorded value lies in [0, 1]. Reports mark such metrics as undeclared.
FALLBACK_SPEC = MetricSpec(
    higher_is_better=True,
    plotted=True,
    unit="fraction",
    description="not declared by the attack (assumed: higher = stronger attack)",
)


#: Preference order of the main utility metric when the protocol declares none.
UTILITY_PREFERENCE = ("ndcg@10", "ndcg", "rmse", "hr@10", "f1", "auc")


def spec_to_dict(spec: MetricSpec, declared: bool = True) -> dict[str, Any]:
    """JSON form of a :class:`MetricSpec` (``declared`` False for the fallback)."""
    return {
        "higher_is_better": bool(spec.higher_is_better),
        "plotted": bool(spec.plotted),
        "unit": str(spec.unit),
        "description": str(spec.description),
        "declared": bool(declared),
        "perfect": spec.perfect,
        "tested": bool(spec.tested),
    }


def spec_from_dict(d: Mapping[str, Any] | None) -> MetricSpec:
    """:class:`MetricSpec` from its JSON form (the fallback for None)."""
    if not isinstance(d, Mapping):
        return FALLBACK_SPEC
    return MetricSpec(
        bool(d.get("higher_is_better", True)),
        bool(d.get("plotted", True)),
        str(d.get("unit", "")),
        str(d.get("description", "")),
        None if d.get("perfect") is None or math.isnan(num(d.get("perfect"))) else num(d.get("perfect")),
        bool(d.get("tested", True)),
    )


def declared_specs(attack_cls: Any, metrics: Sequence[str]) -> dict[str, dict[str, Any]]:
    """JSON specs of ``metrics`` from the attack's ``metric_specs``; the explicit
    :data:`FALLBACK_SPEC` (``declared: false``) for a metric it does not declare."""
    specs = dict(getattr(attack_cls, "metric_specs", None) or {})
    return {m: spec_to_dict(specs[m]) if m in specs else spec_to_dict(FALLBACK_SPEC, declared=False) for m in metrics}


def metric_spec(results: Mapping[str, Any], metric: str) -> MetricSpec:
    """The spec of attack metric ``metric`` recorded in ``results["metric_specs"]``."""
    return spec_from_dict((results.get("metric_specs") or {}).get(metric))


def utility_spec(metric: str | None, declared: Mapping[str, Any] | None = None) -> MetricSpec:
    """Spec of utility metric ``metric`` as its protocol declares it (``Protocol.utility_specs``,
    recorded in results as ``utility_specs``); undeclared: higher-is-better, said so."""
    spec = (declared or {}).get(str(metric))
    if spec is None:
        return MetricSpec(
            True, True, "", "protocol utility metric (not declared by the protocol: higher assumed better)"
        )
    return spec if isinstance(spec, MetricSpec) else spec_from_dict(spec)


def spec_perfect(spec: MetricSpec) -> float | None:
    """Value of a perfect attack on ``spec``'s metric: ``spec.perfect`` when declared, else 1
    for a higher-is-better fraction, 0 for a lower-is-better metric (an error), else None."""
    if spec.perfect is not None:
        return float(spec.perfect)
    if spec.higher_is_better and spec.unit == "fraction":
        return 1.0
    if not spec.higher_is_better:
        return 0.0
    return None
