"""Result vocabulary shared by attacks, experiments and reports (a leaf: numpy, the standard
library and, inside two functions, :mod:`privaudit.metrics`, itself a leaf).

:class:`MetricSpec` is how an attack declares what its metrics mean (direction, whether a
figure plots it, unit, one-line definition for the report glossary), so nothing downstream
guesses from a metric's name. :class:`Decisions` carries an attack's per-record scores for
the membership-style metrics (ROC, TPR at low FPR, empirical epsilon).

Also here, so that every report reads results the same way: the number formatting
(:func:`fmt`, :func:`fmt_pm`, :func:`fmt_value`), the summaries over seeds
(:func:`summarize_points`, :func:`accuracy_metrics`, :func:`main_utility`), advantages over the
stronger baseline with their cluster-bootstrap bounds (resampling victims), and the verdicts of
experiments and audits as tests with a Holm correction over a grid's points and metrics
(:func:`experiment_verdicts`, :func:`audit_matrix`, :func:`audit_verdicts`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = [
    "MetricSpec",
    "Decisions",
    "VictimTable",
    "FALLBACK_SPEC",
    "num",
    "floats",
    "jsonable",
    "fmt",
    "fmt_pm",
    "fmt_value",
    "declared_specs",
    "metric_spec",
    "utility_spec",
    "summarize_points",
    "accuracy_metrics",
    "main_utility",
    "PROTECTION_MARGIN",
    "advantage",
    "stronger_baseline",
    "ALPHA",
    "spec_perfect",
    "privacy_metrics",
    "bootstrap_counts",
    "table_replicates",
    "weighted_auc",
    "point_bootstrap",
    "holm",
    "metric_test",
    "decide_tests",
    "decide_rows",
    "row_verdict",
    "classify",
    "verdict_label",
    "utility_cost_interval",
    "canary_text",
    "verdict_margin",
    "experiment_verdicts",
    "audit_series",
    "audit_matrix",
    "audit_verdicts",
]


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
    """

    victims: list[str]
    weight: dict[str, np.ndarray]
    attack: dict[str, np.ndarray]
    prior: dict[str, np.ndarray]
    root: frozenset[str] = frozenset()
    harmonic: dict[str, tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.victims)
        for part in (self.weight, self.attack, self.prior):
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
        {"attack", "prior"}; NaN when the weights sum to 0."""
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


# ------------------------------------------------------------------------------ numbers


def num(v: Any) -> float:
    """``v`` as a float; NaN for None and anything that is not a number."""
    if isinstance(v, bool):
        return float(v)
    try:
        return math.nan if v is None else float(v)
    except (TypeError, ValueError):
        return math.nan


def floats(d: Mapping[str, Any] | None) -> dict[str, float]:
    """The numeric entries of ``d`` as floats (others dropped)."""
    out: dict[str, float] = {}
    for k, v in (d or {}).items():
        if isinstance(v, (str, bytes)) or v is None:
            continue
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            continue
    return out


def jsonable(obj: Any) -> Any:
    """``obj`` with NaN/inf -> None, numpy scalars/arrays -> Python, tuples -> lists."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def fmt(x: Any, digits: int = 3) -> str:
    """A number for a table: ``digits`` decimals, 3 significant digits from 10^4 on, ``n/a``
    for NaN/None. The one number format of every report."""
    x = num(x)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}f}" if abs(x) < 1e4 else f"{x:.3g}"


def fmt_pm(mean: Any, ci: Any, digits: int = 3) -> str:
    """``mean ± ci`` (just the mean when the half-width is 0 or unknown)."""
    mean, ci = num(mean), num(ci)
    if math.isnan(mean):
        return "n/a"
    if math.isnan(ci) or ci == 0:
        return fmt(mean, digits)
    return f"{fmt(mean, digits)} ± {fmt(ci, digits)}"


def fmt_value(v: Any) -> str:
    """A swept value or defense strength: ``0``, ``0.5``, ``1e-4``, ``1.51e4``; ``-`` for None."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, (int, float)):
        if v == 0:
            return "0"
        a = abs(float(v))
        if not math.isfinite(a):
            return str(v)
        if 1e-2 <= a < 1e4:
            return f"{float(v):g}"
        text = f"{float(v):.3g}" if a >= 1e4 else f"{float(v):.0e}"  # 15100 -> 1.51e4, not 2e4
        return text.replace("e-0", "e-").replace("e+0", "e").replace("e+", "e")
    return str(v)


# ------------------------------------------------------------------------------ metric meaning

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


# ------------------------------------------------------------------------------ summaries


def _value_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def ordered_keys(points: Sequence[Mapping], field_name: str) -> list[str]:
    """Keys of ``point[field_name]`` over ``points``, in order of first appearance."""
    keys: list[str] = []
    for p in points:
        for k in p.get(field_name) or {}:
            if k not in keys:
                keys.append(k)
    return keys


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and 95 % Student-t half-width over ``values`` (NaNs ignored; (nan, nan) if none)."""
    from privaudit.metrics import mean_ci95 as _mean_ci95

    vals = [v for v in (num(x) for x in values) if not math.isnan(v)]
    return _mean_ci95(vals) if vals else (math.nan, math.nan)


#: Fields of a point summarized by :func:`summarize_points`, with their metric prefixes.
SUMMARY_FIELDS = (
    ("attack_metrics", ""),
    ("baseline_random", "baseline."),
    ("baseline_prior", "prior."),
    ("advantage", "advantage."),
    ("utility", "utility."),
)


def summarize_points(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Seed-mean and 95 % CI half-width (Student t) per value and metric.

    Attack metrics keep their names; the random-guess and prior-only baselines, the advantages
    and the utility metrics are listed as ``baseline.<name>``, ``prior.<name>``,
    ``advantage.<name>`` and ``utility.<name>``.
    """
    groups: dict[str, list[Mapping]] = {}
    order: list[tuple[str, Any]] = []
    for p in points:
        key = _value_key(p.get("value"))
        if key not in groups:
            groups[key] = []
            order.append((key, p.get("value")))
        groups[key].append(p)
    summary = []
    for key, value in order:
        group = groups[key]
        for field_name, prefix in SUMMARY_FIELDS:
            if field_name == "baseline_random" and not any("baseline_random" in p for p in group):
                field_name = "baseline"  # a results.json written before the prior baselines
            for metric in ordered_keys(group, field_name):
                vals = [num((p.get(field_name) or {}).get(metric)) for p in group]
                mean, ci = mean_ci95(vals)
                summary.append({"value": value, "metric": prefix + metric, "mean": mean, "ci95": ci})
    return summary


def accuracy_metrics(results: Mapping[str, Any]) -> list[str]:
    """Attack metrics a report plots and tabulates: the primary metric first, then every
    metric its spec marks ``plotted`` (for undeclared metrics: every recorded value in [0, 1])."""
    points = results.get("points") or []
    primary = results.get("primary_metric")
    specs = results.get("metric_specs") or {}
    out = []
    for metric in ordered_keys(points, "attack_metrics"):
        if metric == primary:
            out.insert(0, metric)
            continue
        d = specs.get(metric)
        if isinstance(d, Mapping) and d.get("declared", True):
            if d.get("plotted", True):
                out.append(metric)
            continue
        vals = np.array([num((p.get("attack_metrics") or {}).get(metric)) for p in points], dtype=float)
        finite = vals[np.isfinite(vals)]
        if finite.size and finite.min() >= 0.0 and finite.max() <= 1.0:
            out.append(metric)
    return out


def main_utility(results: Mapping[str, Any]) -> str | None:
    """The utility metric shown in tables and figures: ``results["utility_metric"]`` when it
    is recorded (the protocol's declared ``main_utility``), else the first of
    :data:`UTILITY_PREFERENCE` the points report, else the first reported."""
    keys = ordered_keys(results.get("points") or [], "utility")
    declared = results.get("utility_metric") or results.get("protocol_main_utility")
    for preferred in ((declared,) if declared else ()) + UTILITY_PREFERENCE:
        for k in keys:
            if k.lower() == str(preferred).lower():
                return k
    return keys[0] if keys else None


# ------------------------------------------------------------------------------ advantages and bounds

#: Default verdict margin: an attack whose advantage has an upper bound below this share of the
#: gap between its baseline and a perfect attack (:func:`spec_perfect`) does not leak materially.
PROTECTION_MARGIN = 0.05

#: Family-wise error rate of the verdicts of one experiment (or of one attack in an audit).
ALPHA = 0.05

#: Cluster-bootstrap replicates per point and their fixed random stream (results are reproducible).
BOOTSTRAP_REPLICATES = 1000
BOOTSTRAP_SEED = 0xB0075

#: Fewest victims (or decision clusters) a bootstrap interval is computed from.
MIN_VICTIMS = 5

#: Verdicts of one (attack, strength).
CELL_VERDICTS = (
    "leaks",
    "protected",
    "no evidence of leakage",
    "inconclusive",
    "attack below prior",
    "not applicable",
)

#: What a "no evidence" cell means, for sentences and legends.
NO_POWER = "attack has no power here"


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


def stronger_baseline(prior: Any, random: Any, spec: MetricSpec) -> tuple[float, str]:
    """(value, "prior" | "random") of the stronger of the two baselines for ``spec``'s direction
    (a missing prior falls back to the random guess)."""
    p, r = num(prior), num(random)
    if math.isnan(p):
        return r, "random"
    if math.isnan(r):
        return p, "prior"
    if spec.higher_is_better:
        return (p, "prior") if p >= r else (r, "random")
    return (p, "prior") if p <= r else (r, "random")


def advantage(metric: Any, baseline: Any, spec: MetricSpec) -> float:
    """Attack advantage over ``baseline`` (positive = the attack learns more than the guess)."""
    m, b = num(metric), num(baseline)
    return (m - b) if spec.higher_is_better else (b - m)


def point_random_baseline(point: Mapping[str, Any]) -> dict[str, Any]:
    """A point's random-guess baseline (``baseline_random``; ``baseline`` in older files)."""
    return point.get("baseline_random", point.get("baseline")) or {}


def point_advantages(point: Mapping[str, Any], specs: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """({metric: advantage over the stronger baseline}, {metric: "prior" | "random"}) of a point,
    for every attack metric that has a baseline."""
    metrics = point.get("attack_metrics") or {}
    random = point_random_baseline(point)
    prior = point.get("baseline_prior") or {}
    adv, against = {}, {}
    for m, v in metrics.items():
        if m not in random and m not in prior:
            continue
        spec = spec_from_dict(specs.get(m))
        base, which = stronger_baseline(prior.get(m), random.get(m), spec)
        adv[m] = advantage(v, base, spec)
        against[m] = which
    return adv, against


def add_advantages(results: dict[str, Any]) -> None:
    """Add ``advantage`` and ``advantage_against`` to every point (and reference point)."""
    specs = results.get("metric_specs") or {}
    for p in list(results.get("points") or []) + list(results.get("reference") or []):
        p["advantage"], p["advantage_against"] = point_advantages(p, specs)


def privacy_metrics(points: Sequence[Mapping[str, Any]], specs: Mapping[str, Any]) -> list[str]:
    """The metrics a verdict tests: every attack metric with a baseline whose spec is plotted
    (counts and sizes are not privacy metrics) and tested (not one half of a trade-off), in
    order of first appearance."""
    out = []
    for p in points:
        random, prior = point_random_baseline(p), p.get("baseline_prior") or {}
        for m in p.get("attack_metrics") or {}:
            if m in out or (m not in random and m not in prior):
                continue
            d = specs.get(m)
            if isinstance(d, Mapping) and not (d.get("plotted", True) and d.get("tested", True)):
                continue
            out.append(m)
    return out


# ------------------------------------------------------------------------------ cluster bootstrap


def bootstrap_counts(n: int, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """(replicates, n) int matrix: how often each of ``n`` clusters is drawn in each resample
    of ``n`` clusters with replacement (a multinomial count per row)."""
    return rng.multinomial(int(n), np.full(int(n), 1.0 / int(n)), size=int(replicates))


def table_replicates(table: VictimTable, metric: str, which: str, counts: np.ndarray) -> np.ndarray:
    """(replicates,) values of ``metric`` (``which`` in {"attack", "prior"}) over the victim
    resamples ``counts`` (replicates, n_victims); NaN where a resample has no weight."""
    if metric in table.harmonic:
        a, b = (table_replicates(table, m, which, counts) for m in table.harmonic[metric])
        return harmonic_mean(a, b)
    num_ = counts @ getattr(table, which)[metric]
    den = counts @ table.weight[metric]
    with np.errstate(invalid="ignore", divide="ignore"):
        v = np.where(den > 0, num_ / np.where(den > 0, den, 1.0), np.nan)
    return np.sqrt(np.maximum(v, 0.0)) if metric in table.root else v


def weighted_auc(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """ROC AUC of ``scores`` (n,) against bool ``labels`` (n,) with record weights ``weights``
    (replicates, n), ties counted one half -> (replicates,); NaN without weight in a class."""
    order = np.argsort(scores, kind="mergesort")
    s, y, w = scores[order], labels[order], weights[:, order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])  # tie blocks of equal scores
    pos = np.add.reduceat(w * y, starts, axis=1)
    neg = np.add.reduceat(w * ~y, starts, axis=1)
    below = np.cumsum(neg, axis=1) - neg  # negative weight strictly below each block
    total = pos.sum(axis=1) * neg.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (pos * (below + 0.5 * neg)).sum(axis=1) / total, np.nan)


def decision_replicates(decisions: Decisions, rng: np.random.Generator, replicates: int) -> tuple[np.ndarray, str]:
    """(replicates,) bootstrap AUCs of ``decisions`` resampling its victims (``groups``), or its
    records when ``groups`` is None -> (values, "victims" | "records")."""
    if decisions.groups is not None:
        _, cluster = np.unique(decisions.groups, return_inverse=True)
        over = "victims"
    else:
        cluster, over = np.arange(decisions.scores.size), "records"
    n = int(cluster.max()) + 1 if cluster.size else 0
    counts = bootstrap_counts(n, replicates, rng).astype(float)
    out = np.empty(int(replicates))
    step = max(1, 2_000_000 // max(1, cluster.size))  # bounded memory: (step, n_records) weights
    for i in range(0, int(replicates), step):
        out[i : i + step] = weighted_auc(decisions.scores, decisions.labels, counts[i : i + step][:, cluster])
    return out, over


def _se(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.std(finite, ddof=1)) if finite.size >= 2 else math.nan


def point_bootstrap(
    metrics: Mapping[str, Any],
    table: VictimTable | None,
    decisions: Mapping[str, Decisions] | None = None,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, dict[str, Any]]:
    """Cluster-bootstrap summary of one point, per metric: ``{"attack", "prior", "se",
    "se_vs_prior", "n", "over"}`` -- the metric and its prior-only guess over all victims, the
    bootstrap standard errors of the metric and of (metric - prior) over ``replicates``
    resamples of the victims, the number of victims ``n``, ``over`` = "victims" (or "records"
    for decisions without victim ids). Metrics of ``table``, and every attack metric equal to
    the ROC AUC of a decision set (resampled by its ``groups``). Metrics without either, or
    with fewer than :data:`MIN_VICTIMS` victims, have no entry (no valid interval)."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, Any]] = {}
    if table is not None and len(table.victims) >= MIN_VICTIMS:
        counts = bootstrap_counts(len(table.victims), replicates, rng).astype(float)
        for m in [*table.attack, *table.harmonic]:
            att = table_replicates(table, m, "attack", counts)
            entry = {"attack": table.value(m), "prior": None, "se": _se(att), "se_vs_prior": None}
            if all(part in table.prior for part in table.harmonic.get(m, (m,))):
                entry["prior"] = table.value(m, "prior")
                entry["se_vs_prior"] = _se(att - table_replicates(table, m, "prior", counts))
            out[m] = {**entry, "n": len(table.victims), "over": "victims"}
    for d in (decisions or {}).values():
        if not isinstance(d, Decisions) or d.labels.all() or not d.labels.any():
            continue
        full = float(weighted_auc(d.scores, d.labels, np.ones((1, d.scores.size)))[0])
        names = [m for m, v in metrics.items() if m not in out and abs(num(v) - full) <= 1e-9]
        if not names:
            continue
        n = int(np.unique(d.groups).size) if d.groups is not None else int(d.scores.size)
        if n < MIN_VICTIMS:
            continue
        reps, over = decision_replicates(d, rng, replicates)
        for m in names:
            out[m] = {"attack": full, "prior": None, "se": _se(reps), "se_vs_prior": None, "n": n, "over": over}
    return out


# ------------------------------------------------------------------------------ tests over a grid


def _norm_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _norm_isf(p: float) -> float:
    return NormalDist().inv_cdf(1.0 - p)


def holm(pvalues: Sequence[float], alpha: float = ALPHA) -> tuple[list[bool], list[float]]:
    """Holm's step-down test of ``pvalues`` at family-wise level ``alpha`` -> (rejected, the
    level each p-value was compared with: alpha / (m - rank) up to the first acceptance, then
    alpha / m). NaN p-values are never rejected and do not count in m."""
    idx = [i for i, p in enumerate(pvalues) if math.isfinite(num(p))]
    m = len(idx)
    rejected = [False] * len(pvalues)
    levels = [alpha / m if m else alpha] * len(pvalues)
    going = True
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        if going:
            levels[i] = alpha / (m - rank)
            rejected[i] = going = pvalues[i] <= levels[i]
        else:
            levels[i] = alpha / m
    return rejected, levels


def _stronger(points: Sequence[Mapping[str, Any]], metric: str, spec: MetricSpec) -> tuple[list[float], set[str]]:
    bases, against = [], set()
    for p in points:
        base, which = stronger_baseline(
            (p.get("baseline_prior") or {}).get(metric), point_random_baseline(p).get(metric), spec
        )
        bases.append(base)
        against.add(which)
    return bases, against


def metric_test(
    points: Sequence[Mapping[str, Any]], metric: str, spec: MetricSpec, margin: float = PROTECTION_MARGIN
) -> dict[str, Any]:
    """The advantage of ``metric`` over the stronger baseline at one grid value, pooled over the
    seeds' ``points``: ``advantage`` (seed mean), ``se`` (mean of the seeds' cluster-bootstrap
    standard errors: an upper bound on the standard error of the mean however the seeds
    correlate; NaN when a seed has no bootstrap), ``p`` (one-sided normal p-value of advantage
    <= 0), ``threshold`` (the margin in the metric's unit: ``margin`` times the gap between the
    baseline and a perfect attack, or ``margin`` itself without a perfect value), ``n`` and
    ``over`` (victims resampled), ``against``, ``seeds``. Against the prior-only baseline the
    standard error is that of the paired difference (metric - prior on the same resamples); a
    bootstrap without the prior's replicates (a decision set's AUC) gives no interval there."""
    bases, against = _stronger(points, metric, spec)
    advs, ses, ns, overs = [], [], [], set()
    for p, base in zip(points, bases):
        which = stronger_baseline(
            (p.get("baseline_prior") or {}).get(metric), point_random_baseline(p).get(metric), spec
        )[1]
        b = (p.get("bootstrap") or {}).get(metric)
        value = (p.get("attack_metrics") or {}).get(metric)
        se = math.nan
        if isinstance(b, Mapping):
            value = b.get("attack", value)
            if which == "random":
                se = num(b.get("se"))  # the random guess is a constant
            elif b.get("prior") is not None:
                base = num(b["prior"])
                se = num(b.get("se_vs_prior"))
            # else: a data-dependent prior without paired replicates: no valid interval
            ns.append(int(num(b.get("n"))) if math.isfinite(num(b.get("n"))) else 0)
            overs.add(str(b.get("over", "victims")))
        advs.append(advantage(value, base, spec))
        ses.append(se)
    out: dict[str, Any] = {
        "metric": metric,
        "advantage": math.nan,
        "se": math.nan,
        "p": math.nan,
        "threshold": math.nan,
        "n": min(ns) if ns else 0,
        "over": "records" if "records" in overs else "victims",
        "against": "prior" if against == {"prior"} else ("random" if against == {"random"} else "mixed"),
        "seeds": len(points),
    }
    pairs = list(zip(advs, ses))
    if not pairs or not all(math.isfinite(a) for a, _ in pairs):
        return out
    out["advantage"] = float(np.mean([a for a, _ in pairs]))
    finite_bases = [b for b in bases if math.isfinite(num(b))]
    perfect = spec_perfect(spec)
    if perfect is not None and finite_bases:
        gap = abs(perfect - float(np.mean(finite_bases)))
        out["gap"] = gap
        out["threshold"] = margin * gap
        if gap <= 1e-12:  # the baseline is already perfect: no attack can beat it, nothing to test
            out["ceiling"] = True
            return out
    else:
        out["threshold"] = margin
    if all(math.isfinite(s) for _, s in pairs):
        se = float(np.mean([s for _, s in pairs]))
        out["se"] = se
        if se > 0:
            out["p"] = _norm_sf(out["advantage"] / se)
        else:
            out["p"] = 0.0 if out["advantage"] > 0 else 1.0
    return out


def decide_tests(tests: Sequence[dict[str, Any]], alpha: float = ALPHA) -> None:
    """Holm over ``tests`` (in place): each gets ``level``, ``low`` (one-sided lower bound at its
    Holm level), ``high`` (one-sided upper bound at alpha / m), ``family`` (m) and ``status``:
    "leaks" (Holm rejects advantage <= 0), "below prior" (high < 0), "under margin"
    (high < threshold), "inconclusive", "no interval" (no per-victim scores) or "at ceiling"
    (the baseline is already a perfect attack: not tested, not counted in m)."""
    rejected, levels = holm([t["p"] for t in tests], alpha)
    m = sum(1 for t in tests if math.isfinite(num(t["p"])))
    for t, rej, level in zip(tests, rejected, levels):
        t["family"] = m
        t["level"] = level
        if t.get("ceiling"):
            t["low"] = t["high"] = math.nan
            t["status"] = "at ceiling"
            continue
        if not math.isfinite(num(t["p"])):
            t["low"] = t["high"] = math.nan
            t["status"] = "no interval"
            continue
        se = t["se"]
        t["low"] = t["advantage"] - _norm_isf(level) * se
        t["high"] = t["advantage"] + _norm_isf(alpha / m) * se
        if rej:
            t["status"] = "leaks"
        elif t["high"] < 0:
            t["status"] = "below prior"
        elif t["high"] < t["threshold"]:
            t["status"] = "under margin"
        else:
            t["status"] = "inconclusive"


def row_verdict(tests: Mapping[str, Mapping[str, Any]], supported: bool, defended: bool, control: bool) -> str:
    """Verdict of one grid value from its metrics' decided tests: "leaks" on any metric, else
    "attack below prior" on any, else "protected" when every metric is under the margin, the
    value is defended and the same attack leaks at a weaker value or without defense
    (``control``), "no evidence of leakage" without that control, else "inconclusive"."""
    if not supported or not tests:
        return "not applicable"
    status = [t["status"] for t in tests.values() if t["status"] != "at ceiling"]
    if "leaks" in status:
        return "leaks"
    if "no interval" in status:
        return "inconclusive"
    if "below prior" in status:
        return "attack below prior"
    if not status:  # every baseline is already a perfect attack
        return "no evidence of leakage"
    if all(s == "under margin" for s in status):
        return "protected" if defended and control else "no evidence of leakage"
    return "inconclusive"


def classify(interval: Mapping[str, Any], supported: bool = True, defended: bool = False, control: bool = False) -> str:
    """Verdict of a single decided test (:func:`decide_tests`) as one grid value's only metric."""
    return row_verdict({"m": interval}, supported, defended, control)


# ------------------------------------------------------------------------------ epsilons


def _claimed_epsilon(privacy: Mapping[str, Any] | None) -> float:
    """Total claimed epsilon over the DP defenses of a point (sum; NaN without one)."""
    eps = [num((v or {}).get("epsilon")) for v in (privacy or {}).values() if isinstance(v, Mapping)]
    eps = [e for e in eps if math.isfinite(e)]
    return float(sum(eps)) if eps else math.nan


def privacy_label(privacy_entries: Sequence[Mapping[str, Any]]) -> str:
    """Column header of the one epsilon a report shows: ``ε total (δ=…, per <unit>, <accountant>)``."""
    delta = unit = accountant = None
    for entry in privacy_entries:
        for v in (entry or {}).values():
            if isinstance(v, Mapping) and "epsilon" in v:
                delta = v.get("delta", delta)
                unit = v.get("unit", unit)
                accountant = v.get("accountant", accountant)
    parts = [
        f"δ={fmt_value(num(delta))}" if delta is not None and math.isfinite(num(delta)) else None,
        f"per {unit}" if unit else None,
        str(accountant) if accountant else None,
    ]
    inner = ", ".join(p for p in parts if p)
    return "ε total over the run" + (f" ({inner})" if inner else "")


def strength_label(defense: str, strength: str, privacy_entries: Sequence[Mapping[str, Any]] = ()) -> str:
    """How a defense strength is named in headers: ``defense.param``, with an epsilon parameter
    called "ε per round" when the defense accounts per round (so that it is never mistaken for
    the total ε over the run, the only number a report calls "ε total")."""
    label = f"{defense}.{strength}"
    if "epsilon" in str(strength).lower():
        per_round = any(
            isinstance(v, Mapping) and ("epsilon_per_round" in v or "epsilon_round" in v)
            for entry in privacy_entries
            for v in (entry or {}).values()
        )
        label += " (ε per round)" if per_round else " (the defense's ε parameter, not the total)"
    return label


def empirical_summary(points: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Largest empirical epsilon lower bound over the points' decisions against the claimed
    total epsilon: {"epsilon_lb", "claimed", "violation", "decision"} (in-sample: shown, never
    a verdict)."""
    best = {"epsilon_lb": math.nan, "claimed": math.nan, "violation": False, "decision": None}
    for p in points:
        claimed = _claimed_epsilon(p.get("privacy"))
        if math.isfinite(claimed):
            best["claimed"] = claimed if math.isnan(best["claimed"]) else max(best["claimed"], claimed)
        for name, e in (p.get("empirical_epsilon") or {}).items():
            lb = num((e or {}).get("epsilon_lb"))
            if math.isfinite(lb) and (math.isnan(best["epsilon_lb"]) or lb > best["epsilon_lb"]):
                best["epsilon_lb"], best["decision"] = lb, name
            if (e or {}).get("violation"):
                best["violation"] = True
    return best


def canary_text(canary: Mapping[str, Any] | None) -> str | None:
    """The DP claim read from a canary audit (``point["canary_audit"]``): "DP claim consistent
    (ε_lb x ≤ ε y, <neighbour>-level)" or "DP claim violated (ε_lb x > ε y, ...)"; None
    without a usable audit."""
    if not isinstance(canary, Mapping):
        return None
    lb, eps = num(canary.get("epsilon_lb")), num(canary.get("epsilon"))
    if math.isnan(lb) or math.isnan(eps):
        return None
    level = f", {canary['neighbour']}-level" if canary.get("neighbour") else ""
    conf = num(canary.get("confidence"))
    at = f", {fmt(100 * conf, 0)} % confidence" if math.isfinite(conf) else ""
    if lb > eps:
        return f"DP claim violated (ε_lb {fmt(lb, 2)} > ε {fmt(eps, 2)}{level}{at})"
    return f"DP claim consistent (ε_lb {fmt(lb, 2)} ≤ ε {fmt(eps, 2)}{level}{at})"


def _canary(points: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The canary audit of the value's points with the largest ε_lb (None without one)."""
    audits = [p["canary_audit"] for p in points if isinstance(p.get("canary_audit"), Mapping)]
    return max(
        audits,
        key=lambda c: num(c.get("epsilon_lb")) if math.isfinite(num(c.get("epsilon_lb"))) else -math.inf,
        default=None,
    )


# ------------------------------------------------------------------------------ grid rows


def _groups(points: Sequence[Mapping[str, Any]]) -> tuple[list[Any], dict[str, list[Mapping[str, Any]]]]:
    order: list[Any] = []
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for p in points:
        key = _value_key(p.get("value"))
        if key not in groups:
            groups[key] = []
            order.append(p.get("value"))
        groups[key].append(p)
    return order, groups


def strength_rows(
    points: Sequence[Mapping[str, Any]],
    metrics: Sequence[str],
    specs: Mapping[str, Any],
    utility: str | None,
    margin: float = PROTECTION_MARGIN,
) -> list[dict[str, Any]]:
    """Per swept value (in order), undecided: the :func:`metric_test` of every metric in
    ``metrics`` under ``tests``, the utility mean (and per seed), the claimed and empirical
    epsilons and the canary audit. :func:`decide_rows` then tests them and gives verdicts."""
    order, groups = _groups(points)
    rows = []
    for v in order:
        group = groups[_value_key(v)]
        ok = [p for p in group if p.get("supported", True)]
        tests = {m: metric_test(ok, m, spec_from_dict(specs.get(m)), margin) for m in metrics} if ok else {}
        emp = empirical_summary(group)
        u = mean_ci95([(p.get("utility") or {}).get(utility) for p in group]) if utility else (math.nan, math.nan)
        rows.append(
            {
                "value": v,
                "supported": bool(ok),
                "tests": tests,
                "utility": u[0],
                "utility_ci95": u[1],
                "utility_by_seed": {
                    str(p.get("seed")): num((p.get("utility") or {}).get(utility)) for p in group if utility
                },
                "epsilon": emp["claimed"],
                "epsilon_lb": emp["epsilon_lb"],
                "dp_violation": emp["violation"],
                "canary": _canary(group),
            }
        )
    return rows


def _bound_text(t: Mapping[str, Any]) -> str:
    if not math.isfinite(num(t.get("se"))):
        return "no per-victim scores: no interval"
    seeds = f"{t['seeds']} seed{'s' if t['seeds'] != 1 else ''}"
    fallback = ", records resampled as if independent: no victim ids" if t.get("over") == "records" else ""
    return (
        f"cluster bootstrap over {t['n']} {t.get('over', 'victims')}, {seeds}{fallback}; Holm over {t['family']} tests"
    )


def decide_rows(
    series: Sequence[Sequence[dict[str, Any]]],
    primary: str | None,
    defended: Sequence[Sequence[bool]],
    control: Sequence[bool],
    alpha: float = ALPHA,
) -> None:
    """Test every metric of every row of ``series`` as one Holm family and give each row its
    ``verdict`` (in place). ``defended[i][j]``: row j of series i ran with a defense;
    ``control[i]``: series i has a positive control before its first row (e.g. the attack leaks
    without defense). Rows are ordered weakest first, so an earlier leak is a positive control
    for a later row. Each row also gets the ``advantage``, ``advantage_low``,
    ``advantage_high``, ``bound`` and ``against`` of ``primary`` (the first metric if absent)
    and ``leak_metrics`` (metrics that leak, smallest p first)."""
    decide_tests([t for rows in series for row in rows for t in row["tests"].values()], alpha)
    for rows, flags, ctrl in zip(series, defended, control):
        leaked = bool(ctrl)
        for row, flag in zip(rows, flags):
            tests = row["tests"]
            row["defended"] = bool(flag)
            row["control"] = leaked
            row["verdict"] = row_verdict(tests, row["supported"], bool(flag), leaked)
            leaks = sorted((t for t in tests.values() if t["status"] == "leaks"), key=lambda t: t["p"])
            row["leak_metrics"] = [t["metric"] for t in leaks]
            t = tests.get(primary) if primary in tests else next(iter(tests.values()), None)
            if t is None:
                row.update(advantage=math.nan, advantage_low=math.nan, advantage_high=math.nan, against=None)
                row["bound"] = "the attack did not run"
            else:
                row.update(
                    advantage=t["advantage"], advantage_low=t["low"], advantage_high=t["high"], against=t["against"]
                )
                row["bound"] = _bound_text(t)
            leaked = leaked or row["verdict"] == "leaks"


def verdict_label(row: Mapping[str, Any]) -> str:
    """The verdict of a row as a table shows it: the leaking metrics after "leaks", "(no
    per-victim scores)" after an "inconclusive" without interval."""
    verdict = str(row.get("verdict", "n/a"))
    if verdict == "leaks" and row.get("leak_metrics"):
        return f"leaks ({', '.join(row['leak_metrics'])})"
    tests = row.get("tests") or {}
    if verdict == "inconclusive" and any(t.get("status") == "no interval" for t in tests.values()):
        return "inconclusive (no per-victim scores)"
    return verdict


def utility_cost(reference: float, value: float, metric: str | None, declared: Mapping | None = None) -> float:
    """Utility lost against the reference (positive = worse), in the metric's declared direction."""
    spec = utility_spec(metric, declared)
    return (reference - value) if spec.higher_is_better else (value - reference)


def utility_cost_interval(
    reference: Mapping[str, float], values: Mapping[str, float], metric: str | None, declared: Mapping | None = None
) -> dict[str, Any]:
    """Utility cost paired by seed (``{seed: utility}`` without and with the defense: the
    protocol runs with the same seed): ``cost`` (mean), ``low``/``high`` (95 % Student-t over
    the paired seeds, NaN with one), ``seeds``, ``within_noise`` (the interval holds 0)."""
    costs = [
        utility_cost(num(reference[s]), num(values[s]), metric, declared)
        for s in values
        if s in reference and math.isfinite(utility_cost(num(reference[s]), num(values[s]), metric, declared))
    ]
    out = {"cost": math.nan, "low": math.nan, "high": math.nan, "seeds": len(costs), "within_noise": False}
    if not costs:
        return out
    mean, half = mean_ci95(costs)
    out["cost"] = mean
    if len(costs) >= 2:
        out.update(low=mean - half, high=mean + half, within_noise=bool(mean - half <= 0.0 <= mean + half))
    return out


def fmt_interval(low: Any, high: Any) -> str:
    """``[low, high]``."""
    return f"[{fmt(low)}, {fmt(high)}]"


def has_interval(advantage: Any, high: Any) -> bool:
    """Whether ``high`` is a finite bound (a point without per-victim scores has none)."""
    return math.isfinite(num(high))


def fmt_advantage(advantage: Any, high: Any, low: Any = math.nan) -> str:
    """``"0.678 [0.650, 0.702]"`` (lower and upper bound), ``"0.678 (≤ 0.702)"`` without a lower
    bound, or ``"0.678 (no interval)"``."""
    if not has_interval(advantage, high):
        return f"{fmt(advantage)} (no interval)"
    if math.isfinite(num(low)):
        return f"{fmt(advantage)} {fmt_interval(low, high)}"
    return f"{fmt(advantage)} (≤ {fmt(high)})"


def _test_text(t: Mapping[str, Any], name: bool = True) -> str:
    base = "the prior-only baseline" if t.get("against") == "prior" else "the random guess"
    what = f"{t['metric']}: advantage" if name else "advantage"
    if not math.isfinite(num(t.get("se"))):
        return f"{what} over {base} {fmt(t['advantage'])} (no per-victim scores: no interval)"
    return f"{what} over {base} {fmt(t['advantage'])} {fmt_interval(t['low'], t['high'])} ({_bound_text(t)})"


def _adv_text(row: Mapping[str, Any]) -> str:
    base = "the prior-only baseline" if row.get("against") == "prior" else "the random guess"
    if not has_interval(row.get("advantage"), row.get("advantage_high")):
        return f"advantage over {base} {fmt(row.get('advantage'))} ({row.get('bound')})"
    return (
        f"advantage over {base} {fmt(row['advantage'])} "
        f"{fmt_interval(row.get('advantage_low'), row['advantage_high'])} ({row['bound']})"
    )


def _margin_text(t: Mapping[str, Any], margin: float) -> str:
    if math.isfinite(num(t.get("gap"))):
        return f"{fmt(t['threshold'])} = {fmt_value(margin)} of the gap {fmt(t['gap'])} to a perfect attack"
    return f"{fmt(t['threshold'])} (absolute margin)"


def _under_margin_text(row: Mapping[str, Any], margin: float) -> str:
    text = "; ".join(
        f"{m} upper bound {fmt(t['high'])} < {_margin_text(t, margin)}"
        for m, t in (row.get("tests") or {}).items()
        if t.get("status") != "at ceiling"
    )
    return text or "every baseline is already a perfect attack"


def _row_text(row: Mapping[str, Any], margin: float) -> str:
    """What the attack does at one row, as a clause."""
    verdict = row.get("verdict")
    tests = row.get("tests") or {}
    if verdict == "leaks":
        t = tests[row["leak_metrics"][0]]
        return f"leaks on {t['metric']} (lower bound {fmt(t['low'])} > 0; {_test_text(t, False)})"
    if verdict == "attack below prior":
        t = next(t for t in tests.values() if t["status"] == "below prior")
        return f"scores below its baseline on {t['metric']} ({_test_text(t, False)}): no evidence of protection"
    if verdict == "no evidence of leakage":
        return f"shows no evidence of leakage ({NO_POWER}: {_under_margin_text(row, margin)})"
    if verdict == "protected":
        return f"is held under the margin ({_under_margin_text(row, margin)})"
    if verdict == "not applicable":
        return "does not apply"
    open_ = [t for t in tests.values() if t["status"] in ("inconclusive", "no interval")]
    if not open_:
        return "is not tested (every baseline is already a perfect attack)"
    return "is inconclusive (" + "; ".join(_test_text(t) for t in open_) + ")"


def _cost_text(cost: Mapping[str, Any], utility: str, reference: float, value: float) -> str:
    if not math.isfinite(num(cost.get("cost"))):
        return "utility cost unknown (no undefended run)"
    change = f"({fmt(reference, 4)} → {fmt(value, 4)})"
    if cost["seeds"] < 2:
        return f"where {utility} costs {fmt(cost['cost'], 4)} against no defense {change}, one seed: no interval"
    interval = f"[{fmt(cost['low'], 4)}, {fmt(cost['high'], 4)}] over {cost['seeds']} paired seeds"
    if cost["within_noise"]:
        return f"where the {utility} cost is within noise ({fmt(cost['cost'], 4)}, 95 % interval {interval}) {change}"
    return f"where {utility} costs {fmt(cost['cost'], 4)} (95 % interval {interval}) against no defense {change}"


def verdict_from_rows(
    attack: str,
    metric: str,
    parameter: str | None,
    rows: Sequence[Mapping[str, Any]],
    reference: Mapping[str, float] | None,
    utility: str | None,
    is_defense: bool,
    margin: float = PROTECTION_MARGIN,
    utility_specs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The verdict dict (attack, metric, strength, utility_cost, sentence, ...) of one attack
    over decided rows (:func:`decide_rows`) ordered from the weakest to the strongest tested
    strength; ``reference`` is the undefended utility per seed."""
    reference = dict(reference or {})
    ref_mean = float(np.mean([v for v in reference.values() if math.isfinite(num(v))] or [math.nan]))
    out: dict[str, Any] = {
        "attack": attack,
        "metric": metric,
        "parameter": parameter,
        "strength": None,
        "utility_metric": utility,
        "utility_cost": None,
        "utility_cost_low": None,
        "utility_cost_high": None,
        "dp_violation": False,
        "margin": margin,
        "sentence": "",
    }
    tail = ""
    below = [r for r in rows if r.get("verdict") == "attack below prior"]
    if below and is_defense:
        tail += (
            f" It scores below its baseline at {parameter} = {', '.join(fmt_value(r['value']) for r in below)} "
            "(attack below prior: never counted as protection)."
        )
    canaries = [(r, canary_text(r.get("canary"))) for r in rows if canary_text(r.get("canary"))]
    if canaries:
        tail += " Canary audit: " + "; ".join(f"{parameter} = {fmt_value(r['value'])}: {c}" for r, c in canaries) + "."
        out["dp_violation"] = any(c.startswith("DP claim violated") for _, c in canaries)
    out["notes"] = tail.strip()
    name = f"{attack} ({metric})"
    if not rows:
        out["sentence"] = f"{name}: no result." + tail
        return out
    family = max((t.get("family", 0) for r in rows for t in (r.get("tests") or {}).values()), default=0)
    tested = f" [Holm over {family} tests at {fmt_value(ALPHA)}]" if family else ""
    if not is_defense:
        what = "no defense strength was swept" if parameter is None else f"{parameter} is not a defense strength"
        leaking = [r for r in rows if r.get("verdict") == "leaks"]
        shown = (
            min(leaking, key=lambda r: r["tests"][r["leak_metrics"][0]]["p"])
            if leaking
            else max(rows, key=lambda r: -math.inf if math.isnan(num(r.get("advantage_high"))) else r["advantage_high"])
        )
        where = "" if parameter is None else f" at {parameter} = {fmt_value(shown['value'])}"
        out["sentence"] = f"{name}: {what}; the attack {_row_text(shown, margin)}{where}.{tested}" + tail
        return out
    hit = next((r for r in rows if r.get("verdict") == "protected"), None)
    if hit is None:
        last = rows[-1]
        out["sentence"] = (
            f"{name}: no tested strength is shown to protect; at the strongest, {parameter} = "
            f"{fmt_value(last['value'])}, the attack {_row_text(last, margin)}.{tested}" + tail
        )
        return out
    out["strength"] = hit["value"]
    out["crossover"] = "protected"
    cost = utility_cost_interval(reference, hit.get("utility_by_seed") or {}, utility, utility_specs) if utility else {}
    if utility and math.isfinite(num(cost.get("cost"))):
        out["utility_cost"] = cost["cost"]
        out["utility_cost_low"] = cost["low"] if math.isfinite(cost["low"]) else None
        out["utility_cost_high"] = cost["high"] if math.isfinite(cost["high"]) else None
        out["utility_cost_within_noise"] = cost["within_noise"]
    cost_text = _cost_text(cost, utility, ref_mean, num(hit.get("utility"))) if utility else "no utility metric"
    later = rows[rows.index(hit) + 1 :]
    again = [r for r in later if r.get("verdict") == "leaks"]
    if again:
        tail = (
            f" It leaks again at {parameter} = "
            + ", ".join(f"{fmt_value(r['value'])} ({', '.join(r['leak_metrics'])})" for r in again)
            + "."
        ) + tail
    on = "" if again else " on"
    out["sentence"] = (
        f"{name}: protected {'at' if again else 'from'} {parameter} = {fmt_value(hit['value'])}{on}: every metric's "
        f"upper bound is below the margin ({_under_margin_text(hit, margin)}) and the attack leaks at a weaker "
        f"strength or without defense, {cost_text}.{tested}" + tail
    )
    return out


def verdict_margin(results: Mapping[str, Any]) -> float:
    """The verdict margin recorded in ``results["margin"]`` (:data:`PROTECTION_MARGIN` by default)."""
    m = num(results.get("margin"))
    return m if math.isfinite(m) and m > 0 else PROTECTION_MARGIN


def experiment_verdicts(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``verdicts`` list of an experiment's results (one entry: its attack, tested on every
    privacy metric it declares; named by its primary metric)."""
    points = results.get("points") or []
    specs = results.get("metric_specs") or {}
    metrics = privacy_metrics(points, specs)
    metric = results.get("primary_metric")
    if not metric or metric not in metrics:
        metric = metrics[0] if metrics else None
    if metric is None:
        return []
    margin = verdict_margin(results)
    utility = main_utility(results)
    sweep = results.get("sweep")
    target = str(sweep).split(".", 1)[0] if sweep else None
    is_defense = bool(sweep) and target not in ("attack", "protocol")
    use = points
    if is_defense and results.get("noise"):
        use = sorted(points, key=lambda p: num(p.get("value")))  # noise scales: weakest first
    rows = strength_rows(use, metrics, specs, utility, margin)
    ref_points = list(results.get("reference") or [])
    ref_rows = strength_rows([{**p, "value": None} for p in ref_points], metrics, specs, utility, margin)
    noise_zero = bool(results.get("noise"))
    defended = [is_defense and not (noise_zero and num(r["value"]) == 0) for r in rows]
    decide_rows([ref_rows, rows], metric, [[False] * len(ref_rows), defended], [False, False])
    ref_leaks = any(r["verdict"] == "leaks" for r in ref_rows)
    if ref_leaks:  # the undefended reference is a positive control for every defended row
        decide_rows([ref_rows, rows], metric, [[False] * len(ref_rows), defended], [False, True])
    reference: dict[str, float] = {}
    if utility:
        source = ref_points or ([p for p in points if num(p.get("value")) == 0] if results.get("noise") else [])
        reference = {str(p.get("seed")): num((p.get("utility") or {}).get(utility)) for p in source}
    verdict = verdict_from_rows(
        str(results.get("attack")),
        metric,
        sweep,
        rows,
        reference,
        utility,
        is_defense,
        margin,
        results.get("utility_specs"),
    )
    verdict["rows"] = rows
    if ref_rows:
        verdict["reference_row"] = ref_rows[0]
    return [verdict]


# ------------------------------------------------------------------------------ audits


def audit_points(audit: Mapping[str, Any], attack: str, defense: str | None) -> list[dict[str, Any]]:
    """The runs of one (attack, defense) pair as experiment-like points (``value``, ``seed``,
    ``attack_metrics``, baselines, ``bootstrap``, ``utility``, ``privacy``, ``roc``,
    ``empirical_epsilon``, ``canary_audit``, ``supported``); runs where the protocol or the
    attack failed are left out."""
    out = []
    for r in audit.get("runs") or []:
        if r.get("defense") != defense or "attacks" not in r:
            continue
        a = (r.get("attacks") or {}).get(attack) or {}
        if "error" in a or not a:
            continue
        point = {
            "value": r.get("value"),
            "seed": r.get("seed"),
            **a,
            "utility": r.get("utility") or {},
            "privacy": r.get("privacy") or {},
        }
        if r.get("canary_audit") is not None and "canary_audit" not in point:
            point["canary_audit"] = r["canary_audit"]
        out.append(point)
    return out


def audit_utility(audit: Mapping[str, Any]) -> str | None:
    """The audit's main utility metric."""
    return main_utility(
        {
            "points": [r for r in audit.get("runs") or [] if "utility" in r],
            "utility_metric": audit.get("utility_metric"),
        }
    )


def _attack_info(audit: Mapping[str, Any], attack: str) -> Mapping[str, Any]:
    return next(a for a in audit.get("attacks") or [] if a["name"] == attack)


def _attack_rows(audit: Mapping[str, Any], attack: str) -> dict[str | None, list[dict[str, Any]]]:
    """Decided rows of every defense of ``attack`` (None: undefended), one Holm family; the
    undefended run leaking is the positive control of every defense."""
    info = _attack_info(audit, attack)
    specs = info.get("metric_specs") or {}
    utility = audit_utility(audit)
    margin = verdict_margin(audit)
    names: list[str | None] = [None] + [d["name"] for d in audit.get("defenses") or []]
    points = {name: audit_points(audit, attack, name) for name in names}
    metrics = privacy_metrics([p for ps in points.values() for p in ps], specs)
    primary = info.get("primary_metric")
    rows = {name: strength_rows(points[name], metrics, specs, utility, margin) for name in names}
    series = [rows[name] for name in names]
    flags = [[name is not None] * len(rows[name]) for name in names]
    decide_rows(series, primary, flags, [False] * len(names))
    if any(r["verdict"] == "leaks" for r in rows[None]):
        decide_rows(series, primary, flags, [False] + [True] * (len(names) - 1))
    return rows


def audit_series(audit: Mapping[str, Any], attack: str, defense: str | None) -> list[dict[str, Any]]:
    """Per grid value of ``defense`` (one entry for no defense): the seed-mean primary metric,
    both baselines, the tests of every privacy metric, the advantage interval of the primary
    metric, the verdict, the utility, the claimed total epsilon, the empirical epsilon lower
    bound and the canary audit."""
    info = _attack_info(audit, attack)
    metric = info["primary_metric"]
    utility = audit_utility(audit)
    points = audit_points(audit, attack, defense)
    rows = _attack_rows(audit, attack).get(defense, [])
    order, groups = _groups(points)
    errors_by_value: dict[str, set] = {}
    for r in audit.get("runs") or []:
        if r.get("defense") != defense:
            continue
        errs = errors_by_value.setdefault(_value_key(r.get("value")), set())
        if "error" in r:
            errs.add(r["error"])
        a = (r.get("attacks") or {}).get(attack) or {}
        if "error" in a:
            errs.add(a["error"])
    for row in rows:
        group = groups[_value_key(row["value"])]
        row["metric"] = metric
        row["mean"], row["ci95"] = mean_ci95([(p.get("attack_metrics") or {}).get(metric) for p in group])
        row["baseline_random"] = mean_ci95([point_random_baseline(p).get(metric) for p in group])[0]
        row["baseline_prior"] = mean_ci95([(p.get("baseline_prior") or {}).get(metric) for p in group])[0]
        row["advantage_ci95"] = (
            (row["advantage_high"] - row["advantage"]) if math.isfinite(num(row["advantage_high"])) else math.nan
        )
        row["utility_metric"] = utility
        row["errors"] = sorted(errors_by_value.get(_value_key(row["value"]), set()))
        row["reasons"] = sorted({p.get("reason") for p in group if p.get("reason")})
        row["roc"] = next((p.get("roc") for p in group if p.get("roc")), None)
    known = {_value_key(r["value"]) for r in rows}
    for key, errs in errors_by_value.items():  # values where every run failed
        if key not in known and errs:
            rows.append(
                {
                    "value": json.loads(key),
                    "metric": metric,
                    "verdict": "not applicable",
                    "advantage": math.nan,
                    "errors": sorted(errs),
                    "reasons": [],
                }
            )
    return rows


def audit_matrix(audit: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One cell per (attack, defense): the verdict and primary-metric advantage interval
    undefended and at the strongest grid value, the leaking metrics, the utility cost there
    (paired over seeds, with its interval), the claimed total epsilon, the empirical lower
    bound and the canary audit there."""
    utility = audit_utility(audit)
    cells = []
    for a in audit.get("attacks") or []:
        none = audit_series(audit, a["name"], None)
        base = none[0] if none else {}
        verdict = base.get("verdict", "not applicable") if a.get("applies", True) else "not applicable"
        common = ("advantage", "advantage_low", "advantage_high", "advantage_ci95", "against", "bound", "utility")
        cells.append(
            {
                "attack": a["name"],
                "defense": None,
                "value": None,
                "metric": a["primary_metric"],
                **{k: base.get(k) for k in common},
                "verdict": verdict,
                "verdict_label": verdict_label(base) if verdict != "not applicable" else verdict,
                "leak_metrics": base.get("leak_metrics", []),
                "utility_cost": 0.0,
                "epsilon": None,
                "epsilon_lb": None,
                "dp_violation": False,
                "canary": None,
                "errors": base.get("errors", []),
                "reasons": base.get("reasons", []),
            }
        )
        for d in audit.get("defenses") or []:
            series = audit_series(audit, a["name"], d["name"])
            if not series:
                continue
            strongest = series[-1]
            cost = utility_cost_interval(
                base.get("utility_by_seed") or {},
                strongest.get("utility_by_seed") or {},
                utility,
                audit.get("utility_specs"),
            )
            finite = [s for s in series if math.isfinite(num(s.get("advantage")))]
            best = min(finite, key=lambda s: s["advantage"], default=None)
            verdict = strongest.get("verdict", "not applicable") if a.get("applies", True) else "not applicable"
            cells.append(
                {
                    "attack": a["name"],
                    "defense": d["name"],
                    "value": strongest["value"],
                    "strength": d["strength"],
                    "metric": a["primary_metric"],
                    **{k: strongest.get(k) for k in common},
                    "verdict": verdict,
                    "verdict_label": verdict_label(strongest) if verdict != "not applicable" else verdict,
                    "leak_metrics": strongest.get("leak_metrics", []),
                    "utility_cost": cost["cost"],
                    "utility_cost_low": cost["low"],
                    "utility_cost_high": cost["high"],
                    "utility_cost_within_noise": cost["within_noise"],
                    "epsilon": strongest.get("epsilon"),
                    "epsilon_lb": strongest.get("epsilon_lb"),
                    "dp_violation": any(s.get("dp_violation") for s in series),
                    "canary": strongest.get("canary"),
                    "min_advantage": best["advantage"] if best else None,
                    "min_advantage_value": best["value"] if best else None,
                    "errors": sorted({e for s in series for e in s.get("errors", [])}),
                    "reasons": sorted({e for s in series for e in s.get("reasons", [])}),
                }
            )
    return cells


def _undefended_verdict(attack: str, metric: str, utility: str | None, cost: float | None, text: str) -> dict[str, Any]:
    """An audit verdict decided by the undefended cell alone (no defense named)."""
    return {
        "attack": attack,
        "metric": metric,
        "defense": None,
        "strength": None,
        "utility_metric": utility,
        "utility_cost": cost,
        "dp_violation": False,
        "sentence": f"{attack} ({metric}): {text}",
    }


def audit_verdicts(audit: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One verdict per attack: the cheapest (least utility cost) defense among those that
    protect at some tested strength, or that no tested defense strength is shown to protect."""
    utility = audit_utility(audit)
    margin = verdict_margin(audit)
    out = []
    for a in audit.get("attacks") or []:
        none = audit_series(audit, a["name"], None)
        base = none[0] if none else {}
        reference = base.get("utility_by_seed") or {}
        metric = a["primary_metric"]
        if not a.get("applies", True):
            out.append(
                _undefended_verdict(
                    a["name"],
                    metric,
                    utility,
                    None,
                    f"does not apply to the undefended view{': ' + a['reason'] if a.get('reason') else ''}.",
                )
            )
            continue
        if base.get("verdict") in ("attack below prior", "no evidence of leakage"):
            what = (
                "attack below prior: it scores below its baseline even without a defense"
                if base["verdict"] == "attack below prior"
                else f"no evidence of leakage even without a defense ({NO_POWER})"
            )
            out.append(
                _undefended_verdict(
                    a["name"],
                    metric,
                    utility,
                    None,
                    f"{what} ({_row_text(base, margin)}), so its results say nothing about the defenses.",
                )
            )
            continue
        per_defense = []
        for d in audit.get("defenses") or []:
            rows = [r for r in audit_series(audit, a["name"], d["name"]) if "tests" in r]
            v = verdict_from_rows(
                a["name"],
                metric,
                f"{d['name']}.{d['strength']}",
                rows,
                reference,
                utility,
                True,
                margin,
                audit.get("utility_specs"),
            )
            v["defense"] = d["name"]
            per_defense.append(v)
        stopped = [v for v in per_defense if v["strength"] is not None]
        violation = any(v["dp_violation"] for v in per_defense)
        if stopped:
            best = min(stopped, key=lambda v: math.inf if v["utility_cost"] is None else v["utility_cost"])
            others = [v["defense"] for v in per_defense if v["strength"] is None]
            sentence = best["sentence"]
            if others:
                sentence += f" Not shown to protect at any tested strength of {', '.join(others)}."
        else:
            best = {"defense": None, "strength": None, "utility_cost": None}
            undefended = f"undefended, the attack {_row_text(base, margin)}" if base else "no undefended result"
            sentence = f"{a['name']} ({metric}): no tested defense strength is shown to protect ({undefended})."
            strongest = []
            for d in audit.get("defenses") or []:
                rows = [r for r in audit_series(audit, a["name"], d["name"]) if "tests" in r]
                if rows:
                    strongest.append(
                        f"{d['name']}.{d['strength']} = {fmt_value(rows[-1]['value'])}: {verdict_label(rows[-1])}"
                    )
            if strongest:
                sentence += " At each defense's strongest value: " + "; ".join(strongest) + "."
            if not base:
                sentence = f"{a['name']} ({metric}): no result."
            notes = [v["notes"] for v in per_defense if v.get("notes")]
            if notes:
                sentence += " " + " ".join(notes)
        out.append(
            {
                "attack": a["name"],
                "metric": metric,
                "defense": best["defense"],
                "strength": best["strength"],
                "utility_metric": utility,
                "utility_cost": best["utility_cost"],
                "dp_violation": violation,
                "sentence": sentence,
            }
        )
    return out
