"""Clauses that make a verdict headline explain itself (the hook the reports and the CLI add
beneath a verdict sentence; the sentence itself is :mod:`privaudit.results.verdicts`'s).

- **Which point, and why.** A sweep over an attack or protocol parameter quotes one point: the
  leaking point with the smallest p-value, or (nothing leaks) the one with the largest upper
  bound. The clause says which rule chose it, among how many points.
- **The header's metric.** The headline is named by the attack's primary metric; when the quoted
  point's evidence is another metric, the clause gives the primary metric's own advantage there.
- **Why a defense does not help.** Where a protocol makes a defense powerless against its
  attacks (:data:`WHY_NO_HELP`: PrivMVMF's server decrypts the exact sums it attacks), a point
  that leaks with that defense active gets one clause saying why.
- **Every defense the table decides.** An audit's sentence may summarise the defenses at their
  strongest value; a defense whose cell the matrix reads "protected" elsewhere gets a clause
  naming it, its strength and its DP reading (:func:`audit_clauses`).

Every function reads a results or audit dict only (the JSON schemas), so ``privaudit report``
redraws the same text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from privaudit import results as rs
from privaudit.results import fmt, fmt_value, num


def _rows(verdict: Mapping[str, Any], results: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    rows = verdict.get("rows")
    if rows is None:
        rows = ((results.get("verdicts") or [{}])[0] or {}).get("rows")
    return [r for r in rows or [] if isinstance(r, Mapping)]


def _leak_p(row: Mapping[str, Any]) -> float:
    leak = row.get("leak_metrics") or []
    test = (row.get("tests") or {}).get(leak[0]) if leak else None
    return num((test or {}).get("p"))


def _p_text(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def _quoted(verdict: Mapping[str, Any], results: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, str]:
    """(the row the sentence quotes, the rule that chose it) for a non-defense sweep."""
    rows = _rows(verdict, results)
    if not rows:
        return None, ""
    leaking = [r for r in rows if r.get("verdict") == "leaks" and math.isfinite(_leak_p(r))]
    if leaking:
        row = min(leaking, key=_leak_p)
        rule = (
            f"the point quoted is the leaking point with the smallest p-value ({_p_text(_leak_p(row))}; "
            f"{len(leaking)} of {len(rows)} points leak)"
        )
        return row, rule
    row = max(rows, key=lambda r: -math.inf if math.isnan(num(r.get("advantage_high"))) else r["advantage_high"])
    return row, f"the point quoted is the one with the largest upper bound of the advantage ({len(rows)} points)"


def _is_defense_sweep(results: Mapping[str, Any]) -> bool:
    sweep = results.get("sweep")
    return bool(sweep) and str(sweep).split(".", 1)[0] not in ("attack", "protocol")


def _metric_clause(verdict: Mapping[str, Any], row: Mapping[str, Any]) -> str | None:
    metric = verdict.get("metric")
    leak = row.get("leak_metrics") or []
    if not metric or not leak or leak[0] == metric:
        return None
    test = (row.get("tests") or {}).get(metric)
    if not isinstance(test, Mapping):
        return None
    if math.isfinite(num(test.get("low"))) and math.isfinite(num(test.get("high"))):
        value = (
            f"{fmt(test.get('advantage'))} {rs.fmt_interval(test['low'], test['high'])}, {test.get('status', 'n/a')}"
        )
    else:
        value = f"{fmt(test.get('advantage'))} (no per-victim interval)"
    return f"the headline's metric {metric} at that point: advantage {value}"


def _defense_names(results: Mapping[str, Any]) -> list[str]:
    names = list(BUILT_IN.get(str(results.get("protocol")), ()))
    for d in results.get("defenses") or []:
        name = d.get("name") if isinstance(d, Mapping) else d
        if isinstance(name, str) and name not in names:
            names.append(name)
    sweep = results.get("sweep")
    if _is_defense_sweep(results) and str(sweep).split(".", 1)[0] not in names:
        names.append(str(sweep).split(".", 1)[0])
    return names


#: Why a defense cannot stop the attacks of a protocol, by (protocol, defense): the one clause
#: a "leaks" headline gets when that defense was active (PrivMVMF always runs Paillier: it is
#: the protocol). Reports read results dicts only (never the registry), so the reason lives
#: here, next to the other headline text.
WHY_NO_HELP: Mapping[tuple[str, str], str] = {
    ("privmvmf", "paillier"): (
        "the server decrypts the exact sum of the clients' uploads every round (the sum is the model "
        "update) and the attack reads that sum; encryption hides each upload, not the sum"
    ),
}
#: Defenses a protocol always runs, whether or not ``results["defenses"]`` lists them.
BUILT_IN = {"privmvmf": ("paillier",)}


def _defense_notes(results: Mapping[str, Any]) -> Mapping[str, str]:
    protocol = str(results.get("protocol"))
    return {d: text for (p, d), text in WHY_NO_HELP.items() if p == protocol}


def clauses(verdict: Mapping[str, Any], results: Mapping[str, Any]) -> list[str]:
    """The explaining clauses of one verdict of an experiment's ``results`` (each a sentence)."""
    out: list[str] = []
    rows = _rows(verdict, results)
    if not _is_defense_sweep(results) and results.get("sweep") and rows:
        row, rule = _quoted(verdict, results)
        if row is not None:
            out.append(f"{rule[0].upper()}{rule[1:]}; every point is in the report.")
            metric = _metric_clause(verdict, row)
            if metric:
                out.append(f"{metric[0].upper()}{metric[1:]}.")
    elif rows:  # a defense sweep quotes its protecting strength, else the strongest one
        hit = next((r for r in rows if r.get("verdict") == "protected"), rows[-1])
        metric = _metric_clause(verdict, hit)
        if metric:
            out.append(f"{metric[0].upper()}{metric[1:]}.")
    if any(r.get("verdict") == "leaks" for r in rows):
        notes = _defense_notes(results)
        for name in _defense_names(results):
            if isinstance(notes.get(name), str):
                out.append(f"Why {name} does not stop it here: {notes[name]}.")
    return out


def explained_sentence(verdict: Mapping[str, Any], results: Mapping[str, Any]) -> str:
    """The verdict's sentence with its clauses as a second layer (``\\n``-separated)."""
    extra = clauses(verdict, results)
    text = str(verdict.get("sentence", ""))
    return text + ("\n" + " ".join(extra) if extra else "")


def audit_clauses(audit: Mapping[str, Any]) -> list[str]:
    """One clause per (attack, defense) cell the audit matrix reads "protected" whose defense
    the attack's verdict sentence does not name: the defense, its strength and its DP reading."""
    out = []
    sentences = {v.get("attack"): str(v.get("sentence", "")) for v in audit.get("verdicts") or []}
    for cell in audit.get("matrix") or []:
        name, attack = cell.get("defense"), cell.get("attack")
        if not name or cell.get("verdict") != "protected" or attack not in sentences:
            continue
        if str(name) in sentences[attack]:
            continue
        where = f" at {name}.{cell['strength']} = {fmt_value(cell.get('value'))}" if cell.get("strength") else ""
        canary = rs.canary_text(cell.get("canary"))
        eps = num(cell.get("epsilon"))
        dp = f"; {canary}" if canary else (f"; ε = {fmt(eps, 3)}" if math.isfinite(eps) else "")
        out.append(f"{attack} vs {name}: protected{where}{dp}.")
    return out
