"""Audit verdicts: every (attack, defense) pair of an audit as experiment-like points, decided as
one Holm family over the whole audit, summarised as a matrix of cells and one sentence per attack."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from privaudit.results.numbers import fmt_value, num
from privaudit.results.stats import (
    decide_rows,
    decide_tests,
    point_random_baseline,
    privacy_metrics,
    strength_rows,
)
from privaudit.results.summary import group_by_value, main_utility, mean_ci95, value_key
from privaudit.results.utility import cost_label, users_by_seed, utility_cost_interval
from privaudit.results.verdicts import NO_POWER, row_text, verdict_from_rows, verdict_label, verdict_margin


def audit_points(audit: Mapping[str, Any], attack: str, defense: str | None) -> list[dict[str, Any]]:
    """The runs of one (attack, defense) pair as experiment-like points (``value``, ``seed``,
    ``attack_metrics``, baselines, ``bootstrap``, ``utility``, ``utility_users``, ``privacy``, ``roc``,
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
            "utility_users": r.get("utility_users") or {},
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


def _undecided_rows(audit: Mapping[str, Any], attack: str) -> tuple[dict[str | None, list[dict[str, Any]]], list]:
    """Rows of every defense of ``attack`` (None: undefended) with their tests, not yet decided."""
    info = _attack_info(audit, attack)
    specs = info.get("metric_specs") or {}
    utility = audit_utility(audit)
    margin = verdict_margin(audit)
    names: list[str | None] = [None] + [d["name"] for d in audit.get("defenses") or []]
    points = {name: audit_points(audit, attack, name) for name in names}
    metrics = privacy_metrics([p for ps in points.values() for p in ps], specs)
    return {name: strength_rows(points[name], metrics, specs, utility, margin) for name in names}, names


#: The Holm family of an audit's verdicts, as the audit states it.
AUDIT_FAMILY = "whole audit"


def _attack_rows(audit: Mapping[str, Any], attack: str) -> dict[str | None, list[dict[str, Any]]]:
    """Decided rows of every defense of ``attack`` (None: undefended). One Holm family over the
    whole audit: every test of every attack, defense, value and metric (so that the audit's
    family-wise error rate is controlled, not each attack's); the undefended run leaking is the
    positive control of every defense."""
    info = _attack_info(audit, attack)
    primary = info.get("primary_metric")
    rows: dict[str | None, list[dict[str, Any]]] = {}
    names: list = []
    family = []
    for a in audit.get("attacks") or []:
        got, got_names = _undecided_rows(audit, a["name"])
        family += [t for rs in got.values() for row in rs for t in row["tests"].values()]
        if a["name"] == attack:
            rows, names = got, got_names
    decide_tests(family)
    for t in family:
        t["family_name"] = AUDIT_FAMILY
    series = [rows[name] for name in names]
    flags = [[name is not None] * len(rows[name]) for name in names]
    decide_rows(series, primary, flags, [False] * len(names), decided=True)
    if any(r["verdict"] == "leaks" for r in rows[None]):
        decide_rows(series, primary, flags, [False] + [True] * (len(names) - 1), decided=True)
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
    order, groups = group_by_value(points)
    errors_by_value: dict[str, set] = {}
    for r in audit.get("runs") or []:
        if r.get("defense") != defense:
            continue
        errs = errors_by_value.setdefault(value_key(r.get("value")), set())
        if "error" in r:
            errs.add(r["error"])
        a = (r.get("attacks") or {}).get(attack) or {}
        if "error" in a:
            errs.add(a["error"])
    for row in rows:
        group = groups[value_key(row["value"])]
        row["metric"] = metric
        row["mean"], row["ci95"] = mean_ci95([(p.get("attack_metrics") or {}).get(metric) for p in group])
        row["baseline_random"] = mean_ci95([point_random_baseline(p).get(metric) for p in group])[0]
        row["baseline_prior"] = mean_ci95([(p.get("baseline_prior") or {}).get(metric) for p in group])[0]
        row["advantage_ci95"] = (
            (row["advantage_high"] - row["advantage"]) if math.isfinite(num(row["advantage_high"])) else math.nan
        )
        row["utility_metric"] = utility
        row["errors"] = sorted(errors_by_value.get(value_key(row["value"]), set()))
        row["reasons"] = sorted({p.get("reason") for p in group if p.get("reason")})
        row["roc"] = next((p.get("roc") for p in group if p.get("roc")), None)
    known = {value_key(r["value"]) for r in rows}
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
                users_by_seed(audit_points(audit, a["name"], None), utility),
                _users_at(audit, a["name"], d["name"], strongest["value"], utility),
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
                    "utility_cost_label": cost_label(cost),
                    "utility_cost_method": cost["method"],
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


def _users_at(audit: Mapping[str, Any], attack: str, defense: str | None, value: Any, utility: str | None) -> dict:
    """``{seed: per-user utility}`` of the runs of ``defense`` at ``value`` (for ``attack``)."""
    points = [p for p in audit_points(audit, attack, defense) if value_key(p.get("value")) == value_key(value)]
    return users_by_seed(points, utility)


def defense_users(audit: Mapping[str, Any], attack: str, defense: str | None, utility: str | None) -> dict:
    """``{value_key(value): {seed: per-user utility}}`` of ``defense``'s runs (for ``attack``)."""
    groups = group_by_value(audit_points(audit, attack, defense))[1]
    return {key: users_by_seed(group, utility) for key, group in groups.items()}


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


def _without_defense(a: Mapping[str, Any], base: Mapping[str, Any], utility: str | None, margin: float) -> dict | None:
    """The verdict of an attack that the undefended cell already settles (it does not apply,
    scores below its prior or has no power), else None."""
    metric = a["primary_metric"]
    if not a.get("applies", True):
        reason = f": {a['reason']}" if a.get("reason") else ""
        return _undefended_verdict(a["name"], metric, utility, None, f"does not apply to the undefended view{reason}.")
    if base.get("verdict") not in ("attack below prior", "no evidence of leakage"):
        return None
    what = (
        "attack below prior: it scores below its baseline even without a defense"
        if base["verdict"] == "attack below prior"
        else f"no evidence of leakage even without a defense ({NO_POWER})"
    )
    text = f"{what} ({row_text(base, margin)}), so its results say nothing about the defenses."
    return _undefended_verdict(a["name"], metric, utility, None, text)


def _defended_rows(audit: Mapping[str, Any], attack: str, defense: str) -> list[dict[str, Any]]:
    """The decided rows of ``defense`` against ``attack`` (values where every run failed left out)."""
    return [r for r in audit_series(audit, attack, defense) if "tests" in r]


def _unprotected_sentence(
    audit: Mapping[str, Any],
    a: Mapping[str, Any],
    base: Mapping[str, Any],
    per_defense: list[dict],
    margin: float,
    rows_of: Callable[[str], list[dict[str, Any]]],
) -> str:
    """Sentence of an attack that no tested defense strength is shown to stop: the undefended
    result and each defense's verdict at its strongest value."""
    name, metric = a["name"], a["primary_metric"]
    if not base:
        sentence = f"{name} ({metric}): no result."
    else:
        undefended = f"undefended, the attack {row_text(base, margin)}"
        sentence = f"{name} ({metric}): no tested defense strength is shown to protect ({undefended})."
        strongest = []
        for d in audit.get("defenses") or []:
            rows = rows_of(d["name"])
            if rows:
                strongest.append(
                    f"{d['name']}.{d['strength']} = {fmt_value(rows[-1]['value'])}: {verdict_label(rows[-1])}"
                )
        if strongest:
            sentence += " At each defense's strongest value: " + "; ".join(strongest) + "."
    notes = [v["notes"] for v in per_defense if v.get("notes")]
    return sentence + (" " + " ".join(notes) if notes else "")


def attack_verdict(
    audit: Mapping[str, Any],
    a: Mapping[str, Any],
    rows_of: Callable[[str], list[dict[str, Any]]] | None = None,
    note: Callable[[str, list[dict[str, Any]]], str] | None = None,
) -> dict[str, Any]:
    """The audit verdict of attack ``a`` (an entry of ``audit["attacks"]``) over every defense:
    the cheapest (least utility cost) defense among those that protect at some tested strength,
    or that no tested defense strength is shown to protect. ``rows_of(defense)``: the decided
    rows to read (default: the audit's own; the DP gate passes its gated rows); ``note(parameter,
    rows)``: a sentence appended to that defense's verdict (empty: none)."""
    rows_of = rows_of or (lambda d: _defended_rows(audit, a["name"], d))
    utility = audit_utility(audit)
    margin = verdict_margin(audit)
    none = audit_series(audit, a["name"], None)
    base = none[0] if none else {}
    metric = a["primary_metric"]
    per_defense = []
    for d in audit.get("defenses") or []:
        rows = rows_of(d["name"])
        parameter = f"{d['name']}.{d['strength']}"
        v = verdict_from_rows(
            a["name"],
            metric,
            parameter,
            rows,
            base.get("utility_by_seed") or {},
            utility,
            True,
            margin,
            audit.get("utility_specs"),
            users_by_seed(audit_points(audit, a["name"], None), utility),
            defense_users(audit, a["name"], d["name"], utility),
        )
        extra = note(parameter, rows) if note is not None else ""
        if extra:  # in the defense's own sentence, and among the notes an unprotected sentence lists
            v["sentence"] += " " + extra
            v["notes"] = " ".join(filter(None, [v.get("notes"), extra]))
        per_defense.append({**v, "defense": d["name"]})
    stopped = [v for v in per_defense if v["strength"] is not None]
    if stopped:
        best = min(stopped, key=lambda v: math.inf if v["utility_cost"] is None else v["utility_cost"])
        others = [v["defense"] for v in per_defense if v["strength"] is None]
        sentence = best["sentence"]
        if others:
            sentence += f" Not shown to protect at any tested strength of {', '.join(others)}."
    else:
        best = {"defense": None, "strength": None, "utility_cost": None}
        sentence = _unprotected_sentence(audit, a, base, per_defense, margin, rows_of)
    return {
        "attack": a["name"],
        "metric": metric,
        "defense": best["defense"],
        "strength": best["strength"],
        "utility_metric": utility,
        "utility_cost": best["utility_cost"],
        "dp_violation": any(v["dp_violation"] for v in per_defense),
        "sentence": sentence,
    }


def audit_verdicts(audit: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One verdict per attack (:func:`attack_verdict`), or the undefended cell's when it settles
    the attack (it does not apply, scores below its prior or has no power)."""
    utility = audit_utility(audit)
    margin = verdict_margin(audit)
    out = []
    for a in audit.get("attacks") or []:
        none = audit_series(audit, a["name"], None)
        settled = _without_defense(a, none[0] if none else {}, utility, margin)
        out.append(settled if settled is not None else attack_verdict(audit, a))
    return out
