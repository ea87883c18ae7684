"""Summaries over seeds: the keys of a grid's points, seed means with Student-t intervals, the
metrics a report shows, and the utility cost of one seed (its interval:
:mod:`privaudit.results.utility`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from privaudit.results.numbers import num
from privaudit.results.specs import UTILITY_PREFERENCE, utility_spec


def value_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def group_by_value(points: Sequence[Mapping[str, Any]]) -> tuple[list[Any], dict[str, list[Mapping[str, Any]]]]:
    order: list[Any] = []
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for p in points:
        key = value_key(p.get("value"))
        if key not in groups:
            groups[key] = []
            order.append(p.get("value"))
        groups[key].append(p)
    return order, groups


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
        key = value_key(p.get("value"))
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


def utility_cost(reference: float, value: float, metric: str | None, declared: Mapping | None = None) -> float:
    """Utility lost against the reference (positive = worse), in the metric's declared direction."""
    spec = utility_spec(metric, declared)
    return (reference - value) if spec.higher_is_better else (value - reference)
