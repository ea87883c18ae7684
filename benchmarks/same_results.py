"""Record the numbers of a fixed set of runs, to check that a refactor changes no result.

Runs the main job (``privaudit attack --protocol fedmvmf --noise laplace`` at the historical
scales) and one small default run of each protocol through the command line, and writes one
JSON file mapping each run to its per-point numbers (attack metrics, random baseline,
utility, privacy spent; timings, including utility entries named ``*seconds*``, and new keys left out). Two such files from two versions of
the code compare with ``--compare A.json B.json`` (exit 1 and the differences when any number
differs beyond 1e-12).

    python benchmarks/same_results.py --out before.json
    python benchmarks/same_results.py --out after.json
    python benchmarks/same_results.py --compare before.json after.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: (name, privaudit attack arguments). The scales are the historical default grid, given
#: explicitly so that a change of the default grid does not count as a change of results.
RUNS = [
    ("main", ["--protocol", "fedmvmf", "--noise", "laplace", "--scales", "0,1e-4,1e-3,1e-2,1e-1,0.5,1"]),
    ("fedmvmf", ["--protocol", "fedmvmf", "--users", "60", "--seeds", "1"]),
    ("fedmvmf-dp", ["--protocol", "fedmvmf", "--users", "60", "--seeds", "1", "--defense", "dp-laplace"]),
    ("fedproto", ["--protocol", "fedproto", "--users", "60", "--seeds", "1"]),
    ("fedrec", ["--protocol", "fedrec", "--users", "60", "--seeds", "1"]),
    ("fedsplit", ["--protocol", "fedsplit", "--users", "60", "--seeds", "1"]),
    ("fedncf", ["--protocol", "fedncf", "--users", "40", "--seeds", "1", "--set", "global_rounds=3"]),
    (
        "privmvmf",
        [
            "--protocol",
            "privmvmf",
            "--users",
            "8",
            "--seeds",
            "1",
            "--set",
            "epochs=1",
            "--defense",
            "paillier:key_length=512,insecure_test_key=true",
        ],
    ),
]

_KEYS = ("attack_metrics", "utility", "privacy")


def _point_numbers(p: dict) -> dict:
    out = {"value": p.get("value"), "seed": p.get("seed")}
    for key in _KEYS:
        out[key] = p.get(key)
    # the random-guess baseline: "baseline" before the verdicts work, "baseline_random" after
    out["baseline_random"] = p.get("baseline_random", p.get("baseline"))
    return out


def record(out: Path, only: list[str] | None) -> None:
    numbers = {}
    for name, args in RUNS:
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "privaudit", "attack", *args, "--out", tmp + "/r", "--quiet"]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            secs = time.perf_counter() - t0
            if proc.returncode != 0:
                numbers[name] = {"error": proc.stderr.strip().splitlines()[-1:]}
                print(f"{name}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}", file=sys.stderr)
                continue
            results = json.loads(Path(tmp, "r", "results.json").read_text())
        numbers[name] = [_point_numbers(p) for p in results["points"]]
        print(f"{name}: {len(numbers[name])} points, {secs:.1f} s", file=sys.stderr)
    out.write_text(json.dumps(numbers, indent=1, sort_keys=True))


def _diff(a, b, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if "seconds" in k:  # timings (some protocols report them among their utility numbers)
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'second' if k in b else 'first'}")
            else:
                _diff(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} vs {len(b)} entries")
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{path}[{i}]", out)
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if not (a == b or abs(a - b) <= 1e-12 * max(1.0, abs(a)) or (math.isnan(a) and math.isnan(b))):
            out.append(f"{path}: {a!r} vs {b!r}")
    elif a != b:
        out.append(f"{path}: {a!r} vs {b!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--compare", nargs=2, type=Path)
    args = parser.parse_args()
    if args.compare:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        diffs: list[str] = []
        _diff(a, b, "", diffs)
        print("\n".join(diffs) if diffs else f"identical numbers in {len(a)} runs")
        return 1 if diffs else 0
    if args.out is None:
        parser.error("give --out FILE or --compare A B")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    record(args.out, args.only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
