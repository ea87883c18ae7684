"""``privaudit compare OLD NEW``: what changed between two ``audit.json`` (or two ``results.json``)
files, e.g. the same audit run by two versions of the code.

Both files are read bounded and validated against their schema first
(:func:`privaudit.report_schema.load`). The comparison reads what each file *says* (its stored
verdicts), never re-decides them with this version's rules:

- which privaudit and schema version wrote each file, and whether the two are identical apart from
  timings;
- the cells (:mod:`privaudit.gate`) whose verdict label differs, and the cells only one file has;
- whether the per-attack verdict sentences agree;
- the largest moves of a seed-mean primary metric (per attack, defense and grid value of an audit;
  per swept value of a sweep; per attack of a transcript audit);
- the DP violations of NEW that OLD does not have, and the canary bounds of both side by side.

``--fail-on`` (:data:`COMPARE_FAIL_ON`): ``changed`` (a verdict label differs, or a cell is only in
one file), ``new-leaks`` (a gated cell leaks in NEW and did not in OLD), ``new-dp-violations``
(a DP violation of NEW that OLD does not have), and the conditions of a single run (``leaks``,
``dp-violation``, ``inconclusive``) applied to NEW. Exit code 1 when any is met (one stderr line
per cell), 0 otherwise, 2 for an unreadable or invalid file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from privaudit import gate
from privaudit.errors import PrivauditError
from privaudit.report_schema import load

__all__ = ["COMPARE_FAIL_ON", "Comparison", "compare", "compare_files", "metric_means"]

COMPARE_FAIL_ON = ("changed", "new-leaks", "new-dp-violations", *gate.FAIL_ON)
#: largest metric moves printed
TOP_MOVES = 5


def _untimed(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _untimed(x) for k, x in v.items() if "seconds" not in k and k not in ("timing", "privaudit_version")}
    if isinstance(v, list):
        return [_untimed(x) for x in v]
    return v


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _mean(values: Sequence[Any]) -> float:
    finite = [v for v in (_num(x) for x in values) if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def metric_means(doc: Mapping[str, Any], kind: str) -> dict[str, tuple[str, float]]:
    """Seed-mean primary metric per place: key -> (name shown, mean)."""
    out: dict[str, tuple[str, float]] = {}
    if kind == "results":
        metric = doc.get("primary_metric")
        groups: dict[str, list[Any]] = {}
        for p in doc.get("points") or []:
            groups.setdefault(gate.value_text(p.get("value")), []).append((p.get("attack_metrics") or {}).get(metric))
        for value, vals in groups.items():
            out[f"{value}"] = (
                f"{doc.get('attack')} ({metric}) at {doc.get('sweep') or 'the point'} = {value}",
                _mean(vals),
            )
        return out
    if "rows" in doc and "matrix" not in doc:  # a transcript audit: one row per attack
        for r in doc.get("rows") or []:
            metric = r.get("tested_metric") or r.get("metric")
            out[str(r.get("attack"))] = (f"{r.get('attack')} ({metric})", _num((r.get("metrics") or {}).get(metric)))
        return out
    primary = {a.get("name"): a.get("primary_metric") for a in doc.get("attacks") or []}
    groups = {}
    names: dict[str, str] = {}
    for r in doc.get("runs") or []:
        for attack, scored in (r.get("attacks") or {}).items():
            if not isinstance(scored, Mapping) or "error" in scored:
                continue
            metric = primary.get(attack)
            where = "no defense" if r.get("defense") is None else f"{r['defense']} = {gate.value_text(r.get('value'))}"
            threat = r.get("threat", "")
            key = f"{attack}|{r.get('defense')}|{gate.value_text(r.get('value'))}|{threat}"
            mark = " [malicious server]" if threat == "malicious" else ""
            names[key] = f"{attack}{mark} ({metric}) x {where}"
            groups.setdefault(key, []).append((scored.get("attack_metrics") or {}).get(metric))
    return {k: (names[k], _mean(v)) for k, v in groups.items()}


def _canaries(doc: Mapping[str, Any]) -> dict[str, tuple[str, float, float]]:
    """Canary bounds per defense value of an audit: key -> (name, epsilon_lb, epsilon)."""
    out = {}
    for r in doc.get("runs") or []:
        c = r.get("canary_audit")
        if isinstance(c, Mapping) and "epsilon_lb" in c and r.get("defense") is not None:
            name = f"{r['defense']} = {gate.value_text(r.get('value'))}"
            out[name] = (name, _num(c.get("epsilon_lb")), _num(c.get("epsilon")))
    return out


def _dp_map(doc: Mapping[str, Any], kind: str) -> dict[str, str]:
    """Every DP violation of a file: place -> reason (cells, canary runs, DP claims)."""
    out = {c.name: "; ".join(c.dp) for c in gate.cells(doc, kind) if c.dp}
    out.update({k: v for k, v in gate.dp_findings(doc, kind).items() if not k.startswith("verdict of ")})
    return out


def _labels(verdicts: Any) -> list[Any]:
    keep = ("attack", "defense", "strength", "threat", "dp_violation")  # not the sentence: it holds numbers
    return [{k: v.get(k) for k in keep} for v in verdicts or [] if isinstance(v, Mapping)]


def _writer(doc: Mapping[str, Any], kind: str) -> str:
    version = doc.get("schema_version")
    schema = f"schema {version}" if version is not None else "no schema_version (written before versioned schemas)"
    return f"{kind}.json, {schema}, written by privaudit {doc.get('privaudit_version')}"


class Comparison:
    """The differences of two validated documents of one kind (``lines`` to print, ``failures``
    for ``--fail-on``)."""

    def __init__(self, old: Mapping[str, Any], new: Mapping[str, Any], kind: str, names: tuple[str, str]):
        self.old, self.new, self.kind, self.names = old, new, kind, names
        old_cells = {c.key: c for c in gate.cells(old, kind)}
        new_cells = {c.key: c for c in gate.cells(new, kind)}
        self.changed = [
            (new_cells[k], old_cells[k])
            for k in new_cells
            if k in old_cells
            and old_cells[k].verdict != new_cells[k].verdict  # the verdict, not the order of its metrics
        ]
        self.only_old = [old_cells[k] for k in old_cells if k not in new_cells]
        self.only_new = [new_cells[k] for k in new_cells if k not in old_cells]
        self.new_leaks = [
            c for k, c in new_cells.items() if c.gated and c.leaks and not (k in old_cells and old_cells[k].leaks)
        ]
        self.cells = len(new_cells)
        old_dp, new_dp = _dp_map(old, kind), _dp_map(new, kind)
        self.new_dp = {k: v for k, v in new_dp.items() if k not in old_dp}
        self.same_verdicts = _labels(old.get("verdicts")) == _labels(new.get("verdicts"))
        old_m, new_m = metric_means(old, kind), metric_means(new, kind)
        moves = []
        for k, (name, b) in new_m.items():
            a = old_m.get(k, (name, math.nan))[1]
            if math.isfinite(a) and math.isfinite(b):
                moves.append((abs(b - a), name, a, b))
        self.moves = sorted(moves, key=lambda m: -m[0])[:TOP_MOVES]
        self.canaries = (_canaries(old), _canaries(new))

    def lines(self) -> list[str]:
        old_name, new_name = self.names
        out = [
            f"OLD {old_name}: {_writer(self.old, self.kind)}",
            f"NEW {new_name}: {_writer(self.new, self.kind)}",
            f"identical apart from timings and version: {_untimed(self.old) == _untimed(self.new)}",
        ]
        for new, old in self.changed:
            out.append(f"changed: {new.name}: {old.label or old.verdict} -> {new.label or new.verdict}")
        out += [f"only in OLD: {c.name} ({c.label or c.verdict})" for c in self.only_old]
        out += [f"only in NEW: {c.name} ({c.label or c.verdict})" for c in self.only_new]
        out.append(
            f"cells: {self.cells}; verdict labels changed: {len(self.changed)}; "
            f"summary verdicts the same (defense, strength, DP flag per attack): {self.same_verdicts}"
        )
        if self.moves:
            out.append("largest moves of a seed-mean primary metric (OLD -> NEW):")
            out += [f"  {d:.4f}  {name}: {a:.4g} -> {b:.4g}" for d, name, a, b in self.moves]
        else:
            out.append("largest moves of a seed-mean primary metric: none (no place with a number in both)")
        out += [f"new DP violation: {k}: {v}" for k, v in self.new_dp.items()]
        old_c, new_c = self.canaries
        for key in dict.fromkeys([*old_c, *new_c]):
            a, b = old_c.get(key, (key, math.nan, math.nan)), new_c.get(key, (key, math.nan, math.nan))
            out.append(f"canary {key}: epsilon_lb {_show(a[1])} -> {_show(b[1])} (claimed {_show(b[2])})")
        return out

    def failures(self, conditions: Sequence[str]) -> list[str]:
        """One line per failing cell: every condition it meets, with why."""
        out: dict[str, list[str]] = {}
        if "changed" in conditions:
            for n, o in self.changed:
                out.setdefault(n.name, []).append(f"changed: {o.label or o.verdict} -> {n.label or n.verdict}")
            for c in self.only_old:
                out.setdefault(c.name, []).append("changed: only in OLD")
            for c in self.only_new:
                out.setdefault(c.name, []).append("changed: only in NEW")
        if "new-leaks" in conditions:
            for c in self.new_leaks:
                out.setdefault(c.name, []).append(f"new-leaks: {c.shown()}")
        if "new-dp-violations" in conditions:
            for k, v in self.new_dp.items():
                out.setdefault(k, []).append(f"new-dp-violations: {v}")
        single = [c for c in conditions if c in gate.FAIL_ON]
        for name, why in gate.failure_map(self.new, self.kind, single).items() if single else ():
            mine = out.setdefault(name, [])
            mine.extend(w for w in why if not any(m.endswith(w) for m in mine))
        return [f"{name}: {'; '.join(why)}" for name, why in out.items()]


def _show(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else "-"


def compare(old: Mapping[str, Any], new: Mapping[str, Any], kind: str, names=("OLD", "NEW")) -> Comparison:
    return Comparison(old, new, kind, names)


def compare_files(old_path: str, new_path: str, *, max_bytes: int | None = None, legacy: bool = False) -> Comparison:
    """Read, validate and compare two files (one-line :class:`PrivauditError` on a bad file)."""
    kwargs: dict[str, Any] = {"legacy": legacy}
    if max_bytes is not None:
        kwargs["max_bytes"] = max_bytes
    old, old_kind = load(old_path, **kwargs)
    new, new_kind = load(new_path, **kwargs)
    if old_kind != new_kind:
        raise PrivauditError(f"{old_path} is a {old_kind}.json, {new_path} a {new_kind}.json: compare two of one kind")
    if (old_kind == "audit") and (("rows" in old) != ("rows" in new)):
        raise PrivauditError(
            f"{old_path} and {new_path}: one audits a protocol, the other a transcript: compare two of one kind"
        )
    return compare(old, new, new_kind, (str(old_path), str(new_path)))
