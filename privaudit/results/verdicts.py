"""Verdict text: table labels of a decided row, the sentence of an attack over a swept grid, and
the verdicts of one experiment."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from privaudit.results.numbers import fmt, fmt_interval, fmt_value, num
from privaudit.results.stats import (
    ALPHA,
    BASELINE_NAMES,
    PROTECTION_MARGIN,
    bound_text,
    decide_rows,
    privacy_metrics,
    strength_rows,
)
from privaudit.results.summary import group_by_value, main_utility, value_key
from privaudit.results.utility import cost_summary, users_by_seed, utility_cost_interval

#: What a "no evidence" cell means, for sentences and legends.
NO_POWER = "attack has no power here"


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


def verdict_label(row: Mapping[str, Any]) -> str:
    """The verdict of a row as a table shows it: the leaking metrics after "leaks", "(no
    per-victim scores)" after an "inconclusive" without interval."""
    verdict = str(row.get("verdict", "n/a"))
    if row.get("verdict_label"):  # set by the audit's DP gate (privaudit.audit.gate_dp_cells)
        return str(row["verdict_label"])
    if verdict == "leaks" and row.get("leak_metrics"):
        return f"leaks ({', '.join(row['leak_metrics'])})"
    tests = row.get("tests") or {}
    if verdict == "inconclusive" and any(t.get("status") == "no interval" for t in tests.values()):
        return "inconclusive (no per-victim scores)"
    few = [int(num(t.get("n"))) for t in tests.values() if t.get("status") == "too few victims"]
    if verdict == "inconclusive" and few:
        return f"inconclusive ({min(few)} victims)"
    return verdict


def _test_text(t: Mapping[str, Any], name: bool = True) -> str:
    base = BASELINE_NAMES.get(str(t.get("against")), "the random guess")
    what = f"{t['metric']}: advantage" if name else "advantage"
    if not math.isfinite(num(t.get("se"))):
        return f"{what} over {base} {fmt(t['advantage'])} (no per-victim scores: no interval)"
    return f"{what} over {base} {fmt(t['advantage'])} {fmt_interval(t['low'], t['high'])} ({bound_text(t)})"


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


def row_text(row: Mapping[str, Any], margin: float) -> str:
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
    open_ = [t for t in tests.values() if t["status"] in ("inconclusive", "no interval", "too few victims")]
    if not open_:
        return "is not tested (every baseline is already a perfect attack)"
    return "is inconclusive (" + "; ".join(_test_text(t) for t in open_) + ")"


def cost_text(cost: Mapping[str, Any], utility: str, reference: float, value: float) -> str:
    """The utility cost of a defended point as a clause: "within noise" (the whole 95 % interval
    within +- the margin), "costs X" (the interval excludes 0), "not resolved" (it holds 0 and
    reaches beyond the margin), or the cost without an interval."""
    if not math.isfinite(num(cost.get("cost"))):
        return "utility cost unknown (no undefended run)"
    change = f"({fmt(reference, 4)} → {fmt(value, 4)})"
    if not math.isfinite(num(cost.get("low"))):
        why = str(cost.get("method") or "")
        why = why.split(": ", 1)[1] if why.startswith("no interval: ") else "one seed"
        return f"where {utility} costs {fmt(cost['cost'], 4)} against no defense {change}, {why}: no interval"
    x = fmt(cost["cost"], 4)
    interval = f"95 % interval [{fmt(cost['low'], 4)}, {fmt(cost['high'], 4)}], {cost.get('method') or 'paired seeds'}"
    margin = f"± {fmt(cost['margin'], 4)} = 5 % of the reference"
    if cost["within_noise"]:
        return f"where the {utility} cost is within noise ({x}, {interval}: inside {margin}) {change}"
    if cost.get("unresolved"):
        return f"where the {utility} cost is not resolved ({x}, {interval}: holds 0, wider than {margin}) {change}"
    return f"where {utility} costs {x} ({interval}) against no defense {change}"


def _notes(rows: Sequence[Mapping[str, Any]], parameter: str | None, is_defense: bool) -> tuple[str, bool]:
    """(the below-prior and canary-audit notes that end a verdict sentence, whether a canary
    audit shows the DP claim violated)."""
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
    return tail, any(c.startswith("DP claim violated") for _, c in canaries)


def _holm_note(body: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """``body`` stating the Holm family once: where an interval's bound text already names it
    ("Holm over m tests" gains "at alpha"), else as a closing "[Holm over m tests at alpha]"."""
    family = max((t.get("family", 0) for r in rows for t in (r.get("tests") or {}).values()), default=0)
    if not family:
        return body
    inner = f"Holm over {family} tests"
    stated = f"{inner} at {fmt_value(ALPHA)}"
    return body.replace(inner, stated) if inner in body else f"{body} [{stated}]"


def _undefended_sentence(name: str, parameter: str | None, rows: Sequence[Mapping[str, Any]], margin: float) -> str:
    """Sentence over a sweep that is not a defense strength: the most significant leak, or the
    row with the largest upper bound when nothing leaks."""
    what = "no defense strength was swept" if parameter is None else f"{parameter} is not a defense strength"
    leaking = [r for r in rows if r.get("verdict") == "leaks"]
    shown = (
        min(leaking, key=lambda r: r["tests"][r["leak_metrics"][0]]["p"])
        if leaking
        else max(rows, key=lambda r: -math.inf if math.isnan(num(r.get("advantage_high"))) else r["advantage_high"])
    )
    where = "" if parameter is None else f" at {parameter} = {fmt_value(shown['value'])}"
    return f"{name}: {what}; the attack {row_text(shown, margin)}{where}."


def _protected_cost(out: dict[str, Any], cost: Mapping[str, Any]) -> None:
    """Record the utility cost (and its interval) of the protecting strength in ``out``."""
    if math.isfinite(num(cost.get("cost"))):
        out["utility_cost"] = cost["cost"]
        out["utility_cost_low"] = cost["low"] if math.isfinite(cost["low"]) else None
        out["utility_cost_high"] = cost["high"] if math.isfinite(cost["high"]) else None
        out["utility_cost_within_noise"] = cost["within_noise"]
        out["utility_cost_method"] = cost.get("method")


def _leaks_again(rows: Sequence[Mapping[str, Any]], hit: Mapping[str, Any], parameter: str | None) -> str:
    """ " It leaks again at ..." for rows stronger than the protecting one that leak ("" if none)."""
    again = [r for r in rows[rows.index(hit) + 1 :] if r.get("verdict") == "leaks"]
    if not again:
        return ""
    return (
        f" It leaks again at {parameter} = "
        + ", ".join(f"{fmt_value(r['value'])} ({', '.join(r['leak_metrics'])})" for r in again)
        + "."
    )


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
    reference_users: Mapping[str, Any] | None = None,
    users: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The verdict dict (attack, metric, strength, utility_cost, sentence, ...) of one attack
    over decided rows (:func:`decide_rows`) ordered from the weakest to the strongest tested
    strength; ``reference`` is the undefended utility per seed, ``reference_users`` its per-user
    contributions per seed and ``users`` those of the rows (``{value_key(value): {seed: ...}}``),
    which give the utility cost its paired bootstrap over users
    (:func:`~privaudit.results.utility.utility_cost_interval`)."""
    reference = dict(reference or {})
    ref_mean = float(np.mean([v for v in reference.values() if math.isfinite(num(v))] or [math.nan]))
    tail, violation = _notes(rows, parameter, is_defense)
    out: dict[str, Any] = {
        "attack": attack,
        "metric": metric,
        "parameter": parameter,
        "strength": None,
        "utility_metric": utility,
        "utility_cost": None,
        "utility_cost_low": None,
        "utility_cost_high": None,
        "dp_violation": violation,
        "margin": margin,
        "sentence": "",
        "notes": tail.strip(),
    }
    name = f"{attack} ({metric})"
    if not rows:
        out["sentence"] = f"{name}: no result." + tail
        return out
    if not is_defense:
        out["sentence"] = _holm_note(_undefended_sentence(name, parameter, rows, margin), rows) + tail
        return out
    hit = next((r for r in rows if r.get("verdict") == "protected"), None)
    if hit is None:
        last = rows[-1]
        body = (
            f"{name}: no tested strength is shown to protect; at the strongest, {parameter} = "
            f"{fmt_value(last['value'])}, the attack {row_text(last, margin)}."
        )
        out["sentence"] = _holm_note(body, rows) + tail
        return out
    out.update(strength=hit["value"], crossover="protected")
    cost = (
        utility_cost_interval(
            reference,
            hit.get("utility_by_seed") or {},
            utility,
            utility_specs,
            reference_users,
            (users or {}).get(value_key(hit["value"])),
        )
        if utility
        else {}
    )
    _protected_cost(out, cost)
    cost_clause = cost_text(cost, utility, ref_mean, num(hit.get("utility"))) if utility else "no utility metric"
    again = _leaks_again(rows, hit, parameter)
    body = (
        f"{name}: protected {'at' if again else 'from'} {parameter} = {fmt_value(hit['value'])}"
        f"{'' if again else ' on'}: every metric's upper bound is below the margin "
        f"({_under_margin_text(hit, margin)}) and the attack leaks at a weaker strength or without "
        f"defense, {cost_clause}."
    )
    out["sentence"] = _holm_note(body, rows) + again + tail
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
    source: list = []
    if utility:
        source = ref_points or ([p for p in points if num(p.get("value")) == 0] if results.get("noise") else [])
        reference = {str(p.get("seed")): num((p.get("utility") or {}).get(utility)) for p in source}
    groups = group_by_value(points)[1]
    if reference:  # every defended row: its utility cost against the undefended run, with its interval
        for row, flag in zip(rows, defended):
            if flag:
                cost = utility_cost_interval(
                    reference,
                    row.get("utility_by_seed") or {},
                    utility,
                    results.get("utility_specs"),
                    users_by_seed(source, utility),
                    users_by_seed(groups[value_key(row["value"])], utility),
                )
                row["utility_cost"] = cost_summary(cost)
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
        users_by_seed(source, utility),
        {key: users_by_seed(group, utility) for key, group in groups.items()},
    )
    verdict["rows"] = rows
    if ref_rows:
        verdict["reference_row"] = ref_rows[0]
    verdict["plain"], verdict["detail"] = verdict_lines(verdict, results)
    return [verdict]


#: Plain words for common metrics: "it {phrase}" with the attack's value in ``{}``.
METRIC_PHRASES = {
    "rating_accuracy": "recovers {} of ratings exactly",
    "rated_rating_accuracy": "recovers {} of ratings exactly",
    "accuracy": "recovers {} of what it targets exactly",
    "attribute_accuracy": "recovers {} of user attributes",
    "auc": "tells the targeted records apart with AUC {}",
    "f1": "finds clients' items with F1 {}",
    "relative_error": "has a relative error of {}",
    "rmse": "has an RMSE of {}",
}

#: Longest plain first line (issue 35: about 160 characters).
PLAIN_MAX = 160


def _pct(value: float, spec: Mapping[str, Any] | None, metric: str = "") -> str:
    unit = (spec or {}).get("unit") if isinstance(spec, Mapping) else None
    if "auc" in metric:
        return fmt(value, 2)
    if unit == "fraction" or unit is None and 0 <= value <= 1:
        return f"{100 * value:.0f} %"
    return fmt(value)


def _strength_words(results: Mapping[str, Any], value: Any) -> str:
    sweep = str(results.get("sweep") or "")
    defense, _, param = sweep.partition(".")
    if results.get("noise"):
        name = defense.capitalize() + ("" if "noise" in defense else " noise")
        return f"{name} up to scale {fmt_value(value)}"
    return f"{defense} at {param} = {fmt_value(value)}"


def verdict_lines(verdict: Mapping[str, Any], results: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """(plain line, detail line) of an experiment's verdict (:func:`experiment_verdicts`): the
    first at most :data:`PLAIN_MAX` characters in plain words, what a newcomer reads ("Laplace
    noise up to scale 4 does not stop the server: it recovers 39 % of ratings exactly, against
    37 % by guessing without the messages."); the second the statistical detail (advantage,
    interval, test, Holm family). Reports and the audit use it for their own rows."""
    results = results or {}
    rows = list(verdict.get("rows") or [])
    metric = str(verdict.get("metric"))
    specs = results.get("metric_specs") or {}
    spec = specs.get(metric) if isinstance(specs, Mapping) else None
    attacker = "the " + str(results.get("party") or "server")
    if not rows:
        return f"{verdict.get('attack')}: no result.", ""
    hit = next((r for r in rows if r.get("verdict") == "protected"), None)
    row = hit or rows[-1]
    t = (row.get("tests") or {}).get(metric) or {}
    adv, base = num(t.get("advantage")), num(t.get("baseline"))
    higher = not (isinstance(spec, Mapping) and spec.get("higher_is_better") is False)
    value = base + adv if higher else base - adv
    recovers = ""
    if math.isfinite(value) and math.isfinite(base):
        phrase = METRIC_PHRASES.get(metric, f"reaches {metric} {{}}").format(_pct(value, spec, metric))
        recovers = f"it {phrase}, against {_pct(base, spec, metric)} by guessing without the messages"
    sweep = verdict.get("parameter")
    is_defense = bool(sweep) and str(sweep).split(".", 1)[0] not in ("attack", "protocol")
    fixed = [d for d in results.get("defenses") or [] if isinstance(d, Mapping) and d.get("name")]
    with_ = ", ".join(
        str(d["name"]) + "".join(f" {k}={fmt_value(v)}" for k, v in d.items() if k != "name") for d in fixed
    )
    where = (
        _strength_words(results, row.get("value"))
        if is_defense
        else (f"With {with_}" if with_ else "Without a defense")
    )
    v = row.get("verdict")
    if v == "leaks":
        plain = f"{where} does not stop {attacker}: {recovers}." if is_defense else f"{where}, {recovers}."
    elif v == "protected":
        plain = f"{where.replace('up to', 'at')} stops {attacker}: {recovers}."
    elif v == "attack below prior":
        plain = f"{where}, the attack does worse than guessing without the messages: not evidence of protection."
    elif v == "no evidence of leakage":
        plain = f"{where}, this attack learns nothing measurable ({recovers}), but it has no power here."
    elif v == "not applicable":
        plain = f"{where}, this attack does not apply."
    else:
        few = verdict_label(row)
        why = few[len("inconclusive") :].strip() if few.startswith("inconclusive (") else ""
        plain = f"{where}: not enough evidence either way{' ' + why if why else ''}; {recovers}."
    plain = plain[0].upper() + plain[1:]
    if len(plain) > PLAIN_MAX:
        plain = plain[: PLAIN_MAX - 1].rstrip() + "…"
    detail = ""
    if t:
        detail = f"{verdict_label(row)} at {sweep} = {fmt_value(row.get('value'))}: " if is_defense else ""
        detail += _holm_note(_test_text(t), [row])
        family = max((x.get("family", 0) for r in rows for x in (r.get("tests") or {}).values()), default=0)
        if family and f"Holm over {family}" not in detail:
            detail += f" [Holm over {family} tests at {fmt_value(ALPHA)}; family: this experiment]"
    cost = row.get("utility_cost")
    if isinstance(cost, Mapping) and math.isfinite(num(cost.get("cost"))):
        detail += f" {utility_clause(cost, verdict.get('utility_metric'))}"
    return plain, detail


def utility_clause(cost: Mapping[str, Any], utility: Any) -> str:
    """ "Utility (ndcg@10) cost 0.0695 [0.0612, 0.0778]: costs (95 %, paired bootstrap over 768 users,
    1 seed)." from a row's ``utility_cost`` (:func:`~privaudit.results.utility.cost_summary`)."""
    low, high = num(cost.get("low")), num(cost.get("high"))
    interval = f" [{fmt(low, 4)}, {fmt(high, 4)}]" if math.isfinite(low) else ""
    label = str(cost.get("label"))
    if label == "no interval":
        return f"Utility ({utility}) cost {fmt(cost.get('cost'), 4)}: {cost.get('method') or label}."
    if label == "within noise":
        label += f" (inside ± {fmt(cost.get('margin'), 4)} = 5 % of the reference)"
    return f"Utility ({utility}) cost {fmt(cost.get('cost'), 4)}{interval}: {label} (95 %, {cost.get('method')})."
