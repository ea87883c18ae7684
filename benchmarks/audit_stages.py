"""CPU seconds per stage of ``privaudit audit``: data loading, protocol runs by defense, each attack.

Runs :func:`privaudit.audit.run_audit` in this process (``--jobs 1``) with the protocol runs and
attack evaluations timed by ``time.process_time`` (CPU seconds, not wall: the machine may be
shared), and prints one JSON object and a Markdown table::

    PYTHONPATH=. python benchmarks/audit_stages.py --protocol fedmvmf --data ../shared/data/ml-100k --seeds 1
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time

from privaudit import audit, runner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--protocol", default="fedmvmf")
    ap.add_argument("--data", default="synthetic")
    ap.add_argument("--users", type=int, default=None)
    ap.add_argument("--seeds", type=int, default=audit.DEFAULT_AUDIT_SEEDS)
    ap.add_argument("--defenses", default=None, help="comma-separated defenses to sweep (default: every one)")
    ap.add_argument("--log", default=None, help="append the running per-stage totals (JSON lines) here")
    args = ap.parse_args()

    cpu: dict[str, float] = collections.defaultdict(float)
    wall: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter = collections.Counter()
    run_protocol, evaluate_attack, load_data = runner.run_protocol, runner.evaluate_attack, runner.load_data

    def timed(key: str, fn, *a, **k):
        t, w = time.process_time(), time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            cpu[key] += time.process_time() - t
            wall[key] += time.perf_counter() - w
            count[key] += 1
            if args.log:  # the running totals, so that an interrupted measurement still tells
                with open(args.log, "a") as f:
                    f.write(json.dumps({"stage": key, "cpu": dict(cpu), "calls": dict(count)}) + "\n")

    runner.run_protocol = lambda task, data: timed(
        "protocol runs: " + (task.names[2] or "no defense"), run_protocol, task, data
    )
    runner.evaluate_attack = lambda cls, *a, **k: timed(f"attack {cls.name}", evaluate_attack, cls, *a, **k)
    runner.load_data = lambda data: timed("load data", load_data, data)
    canary_audit = audit._canary_audit
    audit._canary_audit = lambda *a: timed("canary runs (DP cells)", canary_audit, *a)
    load0 = os.getloadavg()[0]
    t0, w0 = time.process_time(), time.perf_counter()
    defenses = args.defenses.split(",") if args.defenses else None
    spec = audit.Audit(
        protocol=args.protocol, data=args.data, users=args.users, seeds=args.seeds, jobs=1, defenses=defenses
    )
    result = audit.run_audit(spec)
    total = time.process_time() - t0
    total_wall = time.perf_counter() - w0
    out = {
        "cpu_seconds": {k: round(v, 1) for k, v in sorted(cpu.items())},
        "wall_seconds_by_stage": {k: round(v, 1) for k, v in sorted(wall.items())},
        "calls": dict(count),
        "runs": len(result["runs"]),
        "shared_runs": sum(bool(r.get("protocol_shared")) for r in result["runs"]),
        "total_cpu_seconds": round(total, 1),
        "wall_seconds": round(total_wall, 1),
        "load_average_start_end": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(out, indent=1))
    print("| stage | calls | CPU s | wall s |\n|---|---|---|---|")
    for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]):
        print(f"| {k} | {count[k]} | {v:.1f} | {wall[k]:.1f} |")
    rest_cpu, rest_wall = total - sum(cpu.values()), total_wall - sum(wall.values())
    print(f"| rest (audit assembly, privacy accounting, matrix) | | {rest_cpu:.1f} | {rest_wall:.1f} |")
    print(f"| **total** | {out['runs']} runs | {total:.1f} | {total_wall:.1f} |")


if __name__ == "__main__":
    main()
