"""Result vocabulary shared by attacks, experiments and reports (a leaf: numpy, the standard
library and, inside two functions, :mod:`privaudit.metrics`, itself a leaf).

:class:`MetricSpec` is how an attack declares what its metrics mean (direction, whether a
figure plots it, unit, one-line definition for the report glossary), so nothing downstream
guesses from a metric's name. :class:`Decisions` carries an attack's per-record scores for
the membership-style metrics (ROC, TPR at low FPR, empirical epsilon).

Also here, so that every report reads results the same way: the number formatting
(:func:`fmt`, :func:`fmt_pm`, :func:`fmt_value`), the summaries over seeds
(:func:`summarize_points`, :func:`accuracy_metrics`, :func:`main_utility`), advantages over the
stronger baseline with their 95 % bounds, and the verdicts of experiments and audits
(:func:`experiment_verdicts`, :func:`audit_matrix`, :func:`audit_verdicts`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "MetricSpec",
    "Decisions",
    "VictimTable",
    "FALLBACK_SPEC",
    "UTILITY_SPECS",
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
    "advantage_interval",
    "classify",
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
    """

    higher_is_better: bool = True
    plotted: bool = True
    unit: str = "fraction"
    description: str = ""


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
    """

    victims: list[str]
    weight: dict[str, np.ndarray]
    attack: dict[str, np.ndarray]
    prior: dict[str, np.ndarray]
    root: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        n = len(self.victims)
        for part in (self.weight, self.attack, self.prior):
            for name in list(part):
                part[name] = np.asarray(part[name], dtype=float).ravel()
                if part[name].shape != (n,):
                    raise ValueError(f"metric {name!r}: {part[name].size} values for {n} victims")
        if set(self.attack) != set(self.weight):
            raise ValueError("attack and weight name different metrics")

    def value(self, metric: str, which: str = "attack", index: np.ndarray | None = None) -> float:
        """The metric over the victims at ``index`` (all by default) for ``which`` in
        {"attack", "prior"}; NaN when the weights sum to 0."""
        num = getattr(self, which)[metric]
        den = self.weight[metric]
        if index is not None:
            num, den = num[index], den[index]
        total = float(den.sum())
        if total <= 0:
            return math.nan
        v = float(num.sum()) / total
        return math.sqrt(max(v, 0.0)) if metric in self.root else v


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

#: Protocol utility metrics by exact name (protocols report these; direction for utility costs).
UTILITY_SPECS: dict[str, MetricSpec] = {
    "ndcg@10": MetricSpec(
        True, True, "fraction", "normalized discounted cumulative gain of the top 10 recommendations"
    ),
    "hr@10": MetricSpec(
        True, True, "fraction", "hit ratio at 10: share of users whose held-out item is in their top 10"
    ),
    "precision@10": MetricSpec(
        True, True, "fraction", "share of the top 10 recommendations that are held-out relevant items"
    ),
    "recall@10": MetricSpec(True, True, "fraction", "share of held-out relevant items found in the top 10"),
    "map@10": MetricSpec(True, True, "fraction", "mean average precision of the top 10"),
    "f1": MetricSpec(True, True, "fraction", "F1 score"),
    "auc": MetricSpec(True, True, "fraction", "area under the ROC curve of the recommender"),
    "rmse": MetricSpec(False, True, "rating", "root mean squared error of predicted ratings (lower is better)"),
    "mae": MetricSpec(False, True, "rating", "mean absolute error of predicted ratings (lower is better)"),
    "relative_error": MetricSpec(False, True, "fraction", "relative reconstruction error (lower is better)"),
    "mean_rank": MetricSpec(False, True, "rank", "mean rank of held-out items (lower is better)"),
}

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
    )


def declared_specs(attack_cls: Any, metrics: Sequence[str]) -> dict[str, dict[str, Any]]:
    """JSON specs of ``metrics`` from the attack's ``metric_specs``; the explicit
    :data:`FALLBACK_SPEC` (``declared: false``) for a metric it does not declare."""
    specs = dict(getattr(attack_cls, "metric_specs", None) or {})
    return {m: spec_to_dict(specs[m]) if m in specs else spec_to_dict(FALLBACK_SPEC, declared=False) for m in metrics}


def metric_spec(results: Mapping[str, Any], metric: str) -> MetricSpec:
    """The spec of attack metric ``metric`` recorded in ``results["metric_specs"]``."""
    return spec_from_dict((results.get("metric_specs") or {}).get(metric))


def utility_spec(metric: str | None) -> MetricSpec:
    """Spec of a protocol utility metric (:data:`UTILITY_SPECS`; higher-is-better otherwise)."""
    return UTILITY_SPECS.get(str(metric).lower(), MetricSpec(True, True, "", "protocol utility metric"))


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

#: An attack whose advantage over the stronger baseline has an upper 95 % bound below this
#: (in the metric's unit) is called stopped ("protected").
PROTECTION_MARGIN = 0.05

#: Audit cell verdicts.
CELL_VERDICTS = ("leaks", "protected", "attack not adapted", "not applicable")


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


def record_count(points: Sequence[Mapping[str, Any]]) -> int | None:
    """Records behind one point's fraction metrics, from its decisions' ROC counts (None if unknown)."""
    for p in points:
        for roc in (p.get("roc") or {}).values():
            n = num(roc.get("n_pos")) + num(roc.get("n_neg"))
            if math.isfinite(n) and n > 0:
                return int(n)
    return None


def advantage_interval(
    metric_values: Sequence[Any], baselines: Sequence[Any], spec: MetricSpec, n_records: int | None = None
) -> dict[str, Any]:
    """Mean advantage and its two-sided 95 % interval over seeds.

    Two or more seeds: mean ± Student-t half-width of the per-seed advantages
    (``method`` ``"student-t over N seeds"``). One seed: a Clopper-Pearson interval of the
    metric (a fraction of ``n_records`` records) minus the baseline
    (``"clopper-pearson, one seed, N records"``), or the point estimate when the record count
    or a fraction unit is missing (``"one seed: point estimate"``).
    """
    pairs = [(num(m), num(b)) for m, b in zip(metric_values, baselines)]
    pairs = [(m, b) for m, b in pairs if math.isfinite(m) and math.isfinite(b)]
    out = {"mean": math.nan, "low": math.nan, "high": math.nan, "method": "no finite values", "seeds": len(pairs)}
    if not pairs:
        return out
    adv = [advantage(m, b, spec) for m, b in pairs]
    mean, half = mean_ci95(adv)
    out["mean"] = mean
    if len(pairs) >= 2:
        out.update(low=mean - half, high=mean + half, method=f"student-t over {len(pairs)} seeds")
        return out
    m, b = pairs[0]
    if n_records and spec.unit == "fraction" and 0.0 <= m <= 1.0:
        from privaudit.metrics import clopper_pearson

        lo, hi = clopper_pearson(int(round(m * n_records)), int(n_records))
        lo_adv, hi_adv = (lo - b, hi - b) if spec.higher_is_better else (b - hi, b - lo)
        out.update(low=lo_adv, high=hi_adv, method=f"clopper-pearson, one seed, {n_records} records")
    else:
        out.update(low=mean, high=mean, method="one seed: point estimate, no interval")
    return out


def classify(interval: Mapping[str, Any], supported: bool = True) -> str:
    """Verdict of one (attack, strength) from its advantage interval: ``"not applicable"``
    (the attack did not run), ``"attack not adapted"`` (its mean scores below the stronger
    baseline: a result below the guess is never read as protection), ``"protected"`` (upper
    bound < :data:`PROTECTION_MARGIN`), else ``"leaks"``."""
    hi, mean = num(interval.get("high")), num(interval.get("mean"))
    if not supported or math.isnan(hi):
        return "not applicable"
    if mean < 0:
        return "attack not adapted"
    if hi < PROTECTION_MARGIN:
        return "protected"
    return "leaks"


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
    total epsilon: {"epsilon_lb", "claimed", "violation", "decision"}."""
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


# ------------------------------------------------------------------------------ verdicts


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
    points: Sequence[Mapping[str, Any]], metric: str, spec: MetricSpec, utility: str | None
) -> list[dict[str, Any]]:
    """Per swept value (in order): advantage interval of ``metric`` over the stronger baseline,
    the verdict, the utility mean, the claimed and empirical epsilons."""
    order, groups = _groups(points)
    rows = []
    for v in order:
        group = groups[_value_key(v)]
        ok = [p for p in group if p.get("supported", True)]
        bases, against = [], set()
        for p in ok:
            base, which = stronger_baseline(
                (p.get("baseline_prior") or {}).get(metric), point_random_baseline(p).get(metric), spec
            )
            bases.append(base)
            against.add(which)
        interval = advantage_interval(
            [(p.get("attack_metrics") or {}).get(metric) for p in ok], bases, spec, record_count(ok)
        )
        verdict = classify(interval, supported=bool(ok))
        emp = empirical_summary(group)
        if emp["violation"]:
            verdict = "leaks"
        u = mean_ci95([(p.get("utility") or {}).get(utility) for p in group]) if utility else (math.nan, math.nan)
        rows.append(
            {
                "value": v,
                "advantage": interval["mean"],
                "advantage_low": interval["low"],
                "advantage_high": interval["high"],
                "bound": interval["method"],
                "against": "prior" if against == {"prior"} else ("random" if against == {"random"} else "mixed"),
                "verdict": verdict,
                "utility": u[0],
                "utility_ci95": u[1],
                "epsilon": emp["claimed"],
                "epsilon_lb": emp["epsilon_lb"],
                "dp_violation": emp["violation"],
            }
        )
    return rows


def utility_cost(reference: float, value: float, metric: str | None) -> float:
    """Utility lost against the reference (positive = worse), in the metric's direction."""
    spec = utility_spec(metric)
    return (reference - value) if spec.higher_is_better else (value - reference)


def has_interval(advantage: Any, high: Any) -> bool:
    """Whether ``high`` is an upper bound distinct from the point estimate ``advantage``
    (one seed without a record count gives only the point estimate)."""
    a, h = num(advantage), num(high)
    return math.isfinite(h) and h != a


def fmt_advantage(advantage: Any, high: Any) -> str:
    """``"0.678 (≤ 0.702)"`` with the upper 95 % bound, or ``"0.678 (no interval)"``."""
    bound = f"≤ {fmt(high)}" if has_interval(advantage, high) else "no interval"
    return f"{fmt(advantage)} ({bound})"


def _adv_text(row: Mapping[str, Any]) -> str:
    base = "the prior-only baseline" if row.get("against") == "prior" else "the random guess"
    bound = row["bound"]
    if has_interval(row["advantage"], row["advantage_high"]):
        bound = f"upper 95 % bound {fmt(row['advantage_high'])}, {bound}"
    return f"advantage over {base} {fmt(row['advantage'])} ({bound})"


def verdict_from_rows(
    attack: str,
    metric: str,
    parameter: str | None,
    rows: Sequence[Mapping[str, Any]],
    reference_utility: float,
    utility: str | None,
    is_defense: bool,
) -> dict[str, Any]:
    """The verdict dict (attack, metric, strength, utility_cost, sentence, ...) of one attack
    over rows ordered from the weakest to the strongest tested strength."""
    out: dict[str, Any] = {
        "attack": attack,
        "metric": metric,
        "parameter": parameter,
        "strength": None,
        "utility_metric": utility,
        "utility_cost": None,
        "dp_violation": False,
        "sentence": "",
    }
    violations = [r for r in rows if r.get("dp_violation")]
    crossing = (
        next((r for r in rows if r["verdict"] in ("protected", "attack not adapted")), None) if is_defense else None
    )
    not_adapted = [r for r in rows if r["verdict"] == "attack not adapted" and r is not crossing]
    tail = ""
    if not_adapted:
        tail += (
            f" It also scores below its baseline at {parameter} = "
            f"{', '.join(fmt_value(r['value']) for r in not_adapted)} (attack not adapted: its result there falls "
            "back to the baseline guess and is not counted as protection)."
        )
    if violations:
        out["dp_violation"] = True
        tail += (
            " DP violation: the empirical ε lower bound exceeds the claimed ε at "
            + ", ".join(
                f"{parameter} = {fmt_value(r['value'])} ({fmt(r['epsilon_lb'], 2)} > {fmt(r['epsilon'], 2)})"
                for r in violations
            )
            + "."
        )
    out["notes"] = tail.strip()
    name = f"{attack} ({metric})"
    if not rows:
        out["sentence"] = f"{name}: no result." + tail
        return out
    if not is_defense:
        worst = max(rows, key=lambda r: -math.inf if math.isnan(num(r["advantage_high"])) else r["advantage_high"])
        leaks = worst["verdict"] == "leaks"
        where = "" if parameter is None else f" at {parameter} = {fmt_value(worst['value'])}"
        what = "no defense strength was swept" if parameter is None else f"{parameter} is not a defense strength"
        out["sentence"] = (
            f"{name}: {what}; {_adv_text(worst)}{where}: the attack "
            f"{'leaks' if leaks else 'does not beat its baseline by ' + str(PROTECTION_MARGIN) + ' or more'}." + tail
        )
        return out
    hit = crossing
    if hit is None:
        last = rows[-1]
        out["sentence"] = (
            f"{name}: no tested strength stops the attack; at the strongest, {parameter} = "
            f"{fmt_value(last['value'])}, the {_adv_text(last)}." + tail
        )
        return out
    out["strength"] = hit["value"]
    out["crossover"] = "protected" if hit["verdict"] == "protected" else "attack not adapted"
    cost = utility_cost(reference_utility, num(hit["utility"]), utility) if utility else math.nan
    out["utility_cost"] = cost if math.isfinite(cost) else None
    cost_text = (
        f"where {utility} costs {fmt(cost, 4)} against no defense ({fmt(reference_utility, 4)} → "
        f"{fmt(hit['utility'], 4)})"
        if math.isfinite(cost)
        else "utility cost unknown (no undefended run)"
    )
    later = rows[rows.index(hit) + 1 :]
    again = [r for r in later if r["verdict"] == "leaks"]
    if again:
        tail = (
            f" It leaks again at {parameter} = "
            + ", ".join(f"{fmt_value(r['value'])} (upper bound {fmt(r['advantage_high'])})" for r in again)
            + "."
        ) + tail
    on = "" if again else " on"
    if hit["verdict"] == "protected":
        out["sentence"] = (
            f"{name}: stopped {'at' if again else 'from'} {parameter} = {fmt_value(hit['value'])}{on} "
            f"({_adv_text(hit)} < {PROTECTION_MARGIN}), {cost_text}." + tail
        )
    else:
        base = "prior-only baseline" if hit.get("against") == "prior" else "random guess"
        out["sentence"] = (
            f"{name}: reaches its {base} {'at' if again else 'from'} {parameter} = "
            f"{fmt_value(hit['value'])}{on}, {cost_text}; "
            f"there it scores below that baseline ({_adv_text(hit)}): the attack is not adapted to this "
            "defense, so this is no evidence of protection against a better attack." + tail
        )
    return out


def experiment_verdicts(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``verdicts`` list of an experiment's results (one entry: its attack's primary metric)."""
    points = results.get("points") or []
    metric = results.get("primary_metric")
    if not metric or not any(metric in (p.get("attack_metrics") or {}) for p in points):
        metrics = ordered_keys(points, "advantage")
        metric = metrics[0] if metrics else None
    if metric is None:
        return []
    spec = metric_spec(results, metric)
    utility = main_utility(results)
    sweep = results.get("sweep")
    target = str(sweep).split(".", 1)[0] if sweep else None
    is_defense = bool(sweep) and target not in ("attack", "protocol")
    use = points
    if is_defense and results.get("noise"):
        use = sorted(points, key=lambda p: num(p.get("value")))  # noise scales: weakest first
    rows = strength_rows(use, metric, spec, utility)
    reference = math.nan
    if utility:
        ref_points = list(results.get("reference") or [])
        if not ref_points and results.get("noise"):
            ref_points = [p for p in points if num(p.get("value")) == 0]
        if ref_points:
            reference = mean_ci95([(p.get("utility") or {}).get(utility) for p in ref_points])[0]
    verdict = verdict_from_rows(str(results.get("attack")), metric, sweep, rows, reference, utility, is_defense)
    verdict["rows"] = rows
    return [verdict]


# ------------------------------------------------------------------------------ audits


def audit_points(audit: Mapping[str, Any], attack: str, defense: str | None) -> list[dict[str, Any]]:
    """The runs of one (attack, defense) pair as experiment-like points (``value``, ``seed``,
    ``attack_metrics``, baselines, ``utility``, ``privacy``, ``roc``, ``empirical_epsilon``,
    ``supported``); runs where the protocol or the attack failed are left out."""
    out = []
    for r in audit.get("runs") or []:
        if r.get("defense") != defense or "attacks" not in r:
            continue
        a = (r.get("attacks") or {}).get(attack) or {}
        if "error" in a or not a:
            continue
        out.append(
            {
                "value": r.get("value"),
                "seed": r.get("seed"),
                **a,
                "utility": r.get("utility") or {},
                "privacy": r.get("privacy") or {},
            }
        )
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


def _attack_spec(info: Mapping[str, Any]) -> MetricSpec:
    return spec_from_dict((info.get("metric_specs") or {}).get(info.get("primary_metric")))


def audit_series(audit: Mapping[str, Any], attack: str, defense: str | None) -> list[dict[str, Any]]:
    """Per grid value of ``defense`` (one entry for no defense): the seed-mean metric, both
    baselines, the advantage interval over the stronger baseline, the verdict, the utility,
    the claimed total epsilon and the empirical epsilon lower bound."""
    info = _attack_info(audit, attack)
    metric = info["primary_metric"]
    spec = _attack_spec(info)
    utility = audit_utility(audit)
    points = audit_points(audit, attack, defense)
    rows = strength_rows(points, metric, spec, utility)
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
    """One cell per (attack, defense): the advantage undefended and at the strongest grid
    value, its verdict, the utility cost there, the claimed total epsilon and the empirical
    lower bound there."""
    utility = audit_utility(audit)
    cells = []
    for a in audit.get("attacks") or []:
        none = audit_series(audit, a["name"], None)
        base = none[0] if none else {}
        verdict = base.get("verdict", "not applicable") if a.get("applies", True) else "not applicable"
        cells.append(
            {
                "attack": a["name"],
                "defense": None,
                "value": None,
                "metric": a["primary_metric"],
                "advantage": base.get("advantage"),
                "advantage_high": base.get("advantage_high"),
                "advantage_ci95": base.get("advantage_ci95"),
                "against": base.get("against"),
                "bound": base.get("bound"),
                "verdict": verdict,
                "utility": base.get("utility"),
                "utility_cost": 0.0,
                "epsilon": None,
                "epsilon_lb": None,
                "dp_violation": False,
                "errors": base.get("errors", []),
                "reasons": base.get("reasons", []),
            }
        )
        for d in audit.get("defenses") or []:
            series = audit_series(audit, a["name"], d["name"])
            if not series:
                continue
            strongest = series[-1]
            cost = utility_cost(num(base.get("utility")), num(strongest.get("utility")), utility)
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
                    "advantage": strongest.get("advantage"),
                    "advantage_high": strongest.get("advantage_high"),
                    "advantage_ci95": strongest.get("advantage_ci95"),
                    "against": strongest.get("against"),
                    "bound": strongest.get("bound"),
                    "verdict": verdict,
                    "utility": strongest.get("utility"),
                    "utility_cost": cost,
                    "epsilon": strongest.get("epsilon"),
                    "epsilon_lb": strongest.get("epsilon_lb"),
                    "dp_violation": any(s.get("dp_violation") for s in series),
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
    """One verdict per attack: the cheapest (least utility cost) defense among those whose
    weakest stopping strength exists, or that no tested defense strength stops it."""
    utility = audit_utility(audit)
    out = []
    for a in audit.get("attacks") or []:
        none = audit_series(audit, a["name"], None)
        base = none[0] if none else {}
        reference = num(base.get("utility"))
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
        if base.get("verdict") == "attack not adapted":
            out.append(
                _undefended_verdict(
                    a["name"],
                    metric,
                    utility,
                    None,
                    f"attack not adapted: it scores below its prior-only baseline even without a defense "
                    f"({_adv_text(base)}), so its results fall back to the prior-only guess and say nothing "
                    "about the defenses.",
                )
            )
            continue
        if base.get("verdict") == "protected":
            out.append(
                _undefended_verdict(
                    a["name"],
                    metric,
                    utility,
                    0.0,
                    f"no leak even without a defense ({_adv_text(base)} < {PROTECTION_MARGIN}).",
                )
            )
            continue
        per_defense = []
        for d in audit.get("defenses") or []:
            rows = audit_series(audit, a["name"], d["name"])
            rows = [r for r in rows if "bound" in r]
            v = verdict_from_rows(a["name"], metric, f"{d['name']}.{d['strength']}", rows, reference, utility, True)
            v["defense"] = d["name"]
            per_defense.append(v)
        stopped = [v for v in per_defense if v["strength"] is not None]
        violation = any(v["dp_violation"] for v in per_defense)
        if stopped:
            # a defense that stops an adapted attack first, then the smallest utility cost
            best = min(
                stopped,
                key=lambda v: (
                    v.get("crossover") != "protected",
                    math.inf if v["utility_cost"] is None else v["utility_cost"],
                ),
            )
            others = [v["defense"] for v in per_defense if v["strength"] is None]
            sentence = best["sentence"]
            if others:
                sentence += f" Not stopped by any tested strength of {', '.join(others)}."
        else:
            best = {"defense": None, "strength": None, "utility_cost": None}
            sentence = (
                f"{a['name']} ({metric}): no tested defense strength stops the attack (undefended {_adv_text(base)})."
                if base
                else f"{a['name']} ({metric}): no result."
            )
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
