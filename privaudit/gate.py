"""The CI gate: which cells of an ``audit.json`` or ``results.json`` meet a ``--fail-on`` condition.

A *cell* is one configuration a run judged, with its verdict:

- an audit of a protocol (``privaudit audit --protocol P``): a matrix cell, (attack, defense at
  its strongest grid value) or (attack, no defense);
- an audit of a transcript (``privaudit audit --transcript FILE``): one row per attack;
- a sweep (``privaudit attack``): one verdict row per swept value (the undefended reference
  runs, when there are some, are one more cell).

The gated cells are the defended ones: the undefended column of an audit, a noise sweep's scale 0
and a sweep's reference runs are the positive control a "protected" verdict needs, and gating on
them would fail every defended deployment. When a run has no defended cell (an audit where no
defense applies, a sweep of an attack or protocol parameter, one transcript) every cell is gated.

Conditions (:data:`FAIL_ON`): ``leaks`` (a gated cell's verdict is "leaks"), ``inconclusive``
(a gated cell's verdict is "inconclusive", a transcript row is "unscored" or has too few
victims to judge, or a run or attack of the cell failed), ``dp-violation`` (any cell, gated or not, whose ``dp_violation`` is true or
whose canary audit bounds epsilon above the claim, any run's canary audit doing so, or any entry
of the top-level ``dp_claims`` list with ``holds: false``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FAIL_ON",
    "Cell",
    "cells",
    "dp_findings",
    "failures",
    "fail_on_type",
    "failure_map",
    "gate_lines",
    "named",
    "value_text",
]

#: conditions of ``attack``/``audit --fail-on``
FAIL_ON = ("leaks", "dp-violation", "inconclusive")


def fail_on_type(allowed: Sequence[str]):
    """An argparse ``type`` for ``--fail-on A[,B...]`` (repeatable): the tuple of named conditions;
    an unknown one is a usage error (one line, exit 2, before any compute)."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in str(text).split(",") if n.strip())
        if not names:
            raise argparse.ArgumentTypeError(f"expected one or more of {', '.join(allowed)}")
        unknown = [n for n in names if n not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown condition {unknown[0]!r} (choose from {', '.join(allowed)}; comma-separated or repeated)"
            )
        return names

    return parse


def named(values: Iterable[Sequence[str]] | None) -> tuple[str, ...]:
    """The conditions of repeated ``--fail-on`` values, in order, without repeats."""
    out: list[str] = []
    for group in values or ():
        out += [n for n in group if n not in out]
    return tuple(out)


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _fmt(x: Any) -> str:
    v = _num(x)
    return f"{v:.3g}" if math.isfinite(v) else "n/a"


def value_text(v: Any) -> str:
    """A grid value as a cell's name shows it (``4.0`` as ``4``)."""
    if isinstance(v, float) and v.is_integer():
        return f"{v:g}"
    return str(v)


@dataclass
class Cell:
    """One judged configuration: a name that says which, its verdict, whether it is gated, the
    primary metric's advantage (with its interval) and the DP violations found there."""

    key: str
    name: str
    verdict: str
    gated: bool = True
    advantage: float = math.nan
    low: float = math.nan
    high: float = math.nan
    dp: list[str] = field(default_factory=list)
    label: str = ""
    errors: list[str] = field(default_factory=list)

    @property
    def leaks(self) -> bool:
        return self.verdict == "leaks"

    @property
    def inconclusive(self) -> bool:
        v = self.verdict
        failed = bool(self.errors)  # a run or an attack that crashed shows nothing either way
        return failed or v.startswith("inconclusive") or v == "unscored" or v.startswith("too few victims")

    def shown(self) -> str:
        """The verdict with the advantage interval, as a failure line shows it."""
        text = self.label or self.verdict
        if math.isfinite(self.advantage):
            bounds = f" [{_fmt(self.low)}, {_fmt(self.high)}]" if math.isfinite(self.low) else ""
            text += f", advantage {_fmt(self.advantage)}{bounds}"
        return text


def _canary_violation(canary: Any) -> str | None:
    if not isinstance(canary, Mapping):
        return None
    lb, eps = _num(canary.get("epsilon_lb")), _num(canary.get("epsilon"))
    if math.isfinite(lb) and math.isfinite(eps) and lb > eps:
        level = f", {canary['neighbour']}-level" if canary.get("neighbour") else ""
        return f"canary audit: ε lower bound {_fmt(lb)} > claimed ε {_fmt(eps)}{level}"
    return None


def _cell_dp(entry: Mapping[str, Any]) -> list[str]:
    out = []
    if entry.get("dp_violation") is True:
        lb, eps = entry.get("epsilon_lb"), entry.get("epsilon")
        out.append(f"empirical ε lower bound {_fmt(lb)} > claimed ε {_fmt(eps)}")
    canary = _canary_violation(entry.get("canary"))
    if canary:
        out.append(canary)
    return out


def _empirical_violations(doc: Mapping[str, Any], attack: Any, defense: Any, strength: Any = None) -> list[str]:
    """Where an audit's runs bound epsilon above the claim from ``attack``'s decisions against
    ``defense`` (each grid value once, the largest bound of its seeds)."""
    found: dict[str, tuple[float, float, str]] = {}
    for r in doc.get("runs") or []:
        if r.get("defense") != defense:
            continue
        scored = (r.get("attacks") or {}).get(attack)
        for decision, e in (
            ((scored or {}).get("empirical_epsilon") or {}).items() if isinstance(scored, Mapping) else ()
        ):
            if isinstance(e, Mapping) and e.get("violation") is True:
                key = value_text(r.get("value"))
                lb = _num(e.get("epsilon_lb"))
                if key not in found or lb > found[key][0]:
                    found[key] = (lb, _num(e.get("claimed_epsilon")), str(decision))
    return [
        f"at {strength or 'value'}={v}: empirical ε lower bound {_fmt(lb)} > claimed ε {_fmt(eps)} ({d} decisions)"
        for v, (lb, eps, d) in found.items()
    ]


def _audit_cells(doc: Mapping[str, Any]) -> list[Cell]:
    if "rows" in doc and "matrix" not in doc:  # an audit of one transcript
        return [
            Cell(
                key=f"{r.get('attack')}",
                name=str(r.get("attack")),
                verdict=str(r.get("verdict")),
                advantage=_num(r.get("advantage")),
                low=_num(r.get("advantage_low")),
                high=_num(r.get("advantage_high")),
                dp=_cell_dp(r),
                label=_label(r),
            )
            for r in doc.get("rows") or []
        ]
    strengths = {d.get("name"): d.get("strength") for d in doc.get("defenses") or []}
    matrix = list(doc.get("matrix") or [])
    defended = any(c.get("defense") is not None for c in matrix)
    out = []
    for c in matrix:
        defense = c.get("defense")
        mark = " [malicious server]" if c.get("threat") == "malicious" else ""
        if defense is None:
            where = "no defense"
        elif strengths.get(defense):
            where = f"{defense} {strengths[defense]}={value_text(c.get('value'))}"
        else:
            where = str(defense)
        out.append(
            Cell(
                key=f"{c.get('attack')}|{defense}|{c.get('threat', '')}",
                name=f"{c.get('attack')}{mark} x {where}",
                verdict=str(c.get("verdict")),
                gated=defense is not None or not defended,
                advantage=_num(c.get("advantage")),
                low=_num(c.get("advantage_low")),
                high=_num(c.get("advantage_high")),
                dp=_matrix_dp(doc, c),
                label=str(c.get("verdict_label") or c.get("verdict")),
                errors=[str(e) for e in c.get("errors") or []],
            )
        )
    return out


def _matrix_dp(doc: Mapping[str, Any], c: Mapping[str, Any]) -> list[str]:
    """A matrix cell's DP violations, each grid value named when the runs say where."""
    found = _cell_dp(c)
    if c.get("dp_violation") is True:
        where = _empirical_violations(doc, c.get("attack"), c.get("defense"), c.get("strength"))
        if where:
            found = where + found[1:]
    return found


def _label(row: Mapping[str, Any]) -> str:
    verdict = str(row.get("verdict"))
    if verdict == "leaks" and row.get("leak_metrics"):
        return f"leaks ({', '.join(str(m) for m in row['leak_metrics'])})"
    return verdict


def _results_cells(doc: Mapping[str, Any]) -> list[Cell]:
    out = []
    for v in doc.get("verdicts") or []:
        attack, parameter = v.get("attack"), v.get("parameter")
        rows = [r for r in v.get("rows") or [] if isinstance(r, Mapping)]
        defended = any(r.get("defended") for r in rows)
        if isinstance(v.get("reference_row"), Mapping):
            ref = v["reference_row"]
            out.append(_row_cell(f"{attack} x no defense (reference runs)", f"{attack}|reference", ref, not defended))
        for r in rows:
            where = f" at {parameter} = {value_text(r.get('value'))}" if parameter else ""
            gated = bool(r.get("defended")) or not defended
            out.append(_row_cell(f"{attack}{where}", f"{attack}|{value_text(r.get('value'))}", r, gated))
    return out


def _row_cell(name: str, key: str, r: Mapping[str, Any], gated: bool) -> Cell:
    return Cell(
        key=key,
        name=name,
        verdict=str(r.get("verdict")),
        gated=gated,
        advantage=_num(r.get("advantage")),
        low=_num(r.get("advantage_low")),
        high=_num(r.get("advantage_high")),
        dp=_cell_dp(r),
        label=_label(r),
    )


def cells(doc: Mapping[str, Any], kind: str) -> list[Cell]:
    """The judged cells of an audit (``kind`` ``"audit"``) or a sweep (``"results"``)."""
    return _audit_cells(doc) if kind == "audit" else _results_cells(doc)


def dp_findings(doc: Mapping[str, Any], kind: str) -> dict[str, str]:
    """Every DP violation of a file outside its cells: canary runs of an audit (one per defense
    value), the ``dp_claims`` that do not hold, verdicts flagging one; name -> reason."""
    out: dict[str, str] = {}
    for r in (doc.get("runs") or []) if kind == "audit" else []:
        found = _canary_violation(r.get("canary_audit"))
        if found and r.get("defense") is not None:
            out[f"{r['defense']}={value_text(r.get('value'))} (canary run, seed {r.get('seed')})"] = found
    for claim in doc.get("dp_claims") or []:
        if isinstance(claim, Mapping) and claim.get("holds") is False:
            text = f"claimed ε {_fmt(claim.get('claimed_epsilon'))}, delivered ε {_fmt(claim.get('delivered_epsilon'))}"
            reason = f": {claim['reason']}" if claim.get("reason") else ""
            out[f"DP claim of {claim.get('component')}"] = f"does not hold ({text}){reason}"
    for v in doc.get("verdicts") or []:
        if v.get("dp_violation") is True:
            out[f"verdict of {v.get('attack')}"] = "a canary audit bounds ε above the claim"
    return out


def failure_map(doc: Mapping[str, Any], kind: str, conditions: Sequence[str]) -> dict[str, list[str]]:
    """Failing cell (or DP finding) name -> why it fails each named condition, in file order."""
    out: dict[str, list[str]] = {}
    found_dp = False  # a DP violation found in a cell or a run makes a verdict's flag redundant
    for c in cells(doc, kind):
        why = []
        if "leaks" in conditions and c.gated and c.leaks:
            why.append(c.shown())  # "leaks (metrics), advantage x [low, high]"
        if "inconclusive" in conditions and c.gated and c.inconclusive:
            shown = c.shown() + (f" (failed: {'; '.join(c.errors)[:200]})" if c.errors else "")
            why.append(shown if shown.startswith("inconclusive") else f"inconclusive: {shown}")
        if "dp-violation" in conditions and c.dp:
            why.append("dp-violation: " + "; ".join(c.dp))
            found_dp = True
        if why:
            out.setdefault(c.name, []).extend(why)
    if "dp-violation" in conditions:
        findings = dp_findings(doc, kind)
        found_dp = found_dp or any(" (canary run, " in name for name in findings)
        for name, why in findings.items():
            if name.startswith("verdict of ") and found_dp:
                continue  # a cell or a canary run already names it
            out.setdefault(name, []).append(f"dp-violation: {why}")
    return out


def failures(doc: Mapping[str, Any], kind: str, conditions: Sequence[str]) -> list[str]:
    """One line per failing cell (or DP finding): ``<cell>: <verdict or condition>: <why>``."""
    return [f"{name}: {'; '.join(why)}" for name, why in failure_map(doc, kind, conditions).items()]


def gate_lines(doc: Mapping[str, Any], kind: str, conditions: Sequence[str]) -> tuple[list[str], str]:
    """(failure lines, the line that says what was gated when nothing failed)."""
    lines = failures(doc, kind, conditions)
    all_cells = cells(doc, kind)
    gated = [c for c in all_cells if c.gated]
    control = len(all_cells) - len(gated)
    note = f"; the {control} undefended are the positive control, gated on dp-violation only" if control else ""
    summary = f"fail-on {','.join(conditions)}: not met ({len(gated)} of {len(all_cells)} cells gated{note})"
    return lines, summary
