"""What changed between two ``audit.json`` files of the same audit (e.g. two versions of the code).

Prints whether the two are identical apart from timings; per (attack, defense, strength) cell,
the verdict labels that differ; whether the summary
verdicts agree, the largest move of a cell's seed-mean primary metric (with that cell's CI
half-width), and the canary lower bounds of every DP cell side by side::

    python benchmarks/compare_audits.py before/audit.json after/audit.json

Exit status 1 when any verdict label differs.
"""

from __future__ import annotations

import json
import math
import sys

from privaudit.results import audit_series


def _labels(v):
    if isinstance(v, dict):
        return {k: _labels(x) for k, x in v.items() if k in ("verdict", "attack", "defense", "threat", "name")}
    if isinstance(v, list):
        return [_labels(x) for x in v]
    return v


def _untimed(v):
    if isinstance(v, dict):
        return {k: _untimed(x) for k, x in v.items() if "seconds" not in k and k != "timing"}
    if isinstance(v, list):
        return [_untimed(x) for x in v]
    return v


def main(a_path: str, b_path: str) -> int:
    with open(a_path) as f:
        a = json.load(f)
    with open(b_path) as f:
        b = json.load(f)
    print(f"identical apart from timings: {_untimed(a) == _untimed(b)}")
    defenses = [None] + [d["name"] for d in b["defenses"]]
    cells, changed, largest = 0, 0, (0.0, None)
    for attack in (x["name"] for x in b["attacks"]):
        for defense in defenses:
            for ra, rb in zip(audit_series(a, attack, defense), audit_series(b, attack, defense)):
                cells += 1
                if ra.get("verdict") != rb.get("verdict"):
                    changed += 1
                    print(f"changed: {attack} x {defense} = {ra['value']}: {ra.get('verdict')} -> {rb.get('verdict')}")
                ma, mb = ra.get("mean", math.nan), rb.get("mean", math.nan)
                if math.isfinite(ma) and math.isfinite(mb) and abs(ma - mb) > largest[0]:
                    largest = (abs(ma - mb), (attack, defense, ra["value"], ma, mb, ra.get("ci95")))
    same = _labels(a["verdicts"]) == _labels(b["verdicts"]) and _labels(a["threat_verdicts"]) == _labels(
        b["threat_verdicts"]
    )
    print(f"cells: {cells}; verdict labels changed: {changed}; summary verdicts the same: {same}")
    if largest[1]:
        attack, defense, value, ma, mb, ci = largest[1]
        print(
            f"largest move of a seed-mean primary metric: {largest[0]:.4f} "
            f"({attack} x {defense} = {value}: {ma:.3f} -> {mb:.3f}, CI half-width {ci:.3f})"
        )
    for defense in defenses[1:]:
        for ra, rb in zip(
            audit_series(a, b["attacks"][0]["name"], defense), audit_series(b, b["attacks"][0]["name"], defense)
        ):
            ca, cb = ra.get("canary") or {}, rb.get("canary") or {}
            if "epsilon_lb" in ca or "epsilon_lb" in cb:
                print(f"canary {defense} = {ra['value']}: epsilon_lb {ca.get('epsilon_lb')} -> {cb.get('epsilon_lb')}")
    return 1 if changed or not same else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
