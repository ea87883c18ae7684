"""First run: ``privaudit attack --protocol P`` with no other flag, for every built-in protocol.

For each protocol it runs the command in a subprocess (wall time and the CPU seconds of the
subprocess and its workers), reads the report's ``results.json`` and compares the protocol's
main utility at each swept point with the protocol's non-private reference on the same
(synthetic) data, three seeds each:

- fedmvmf, fedsplit, fedrec, fedproto: the same protocol with its default config and no defense;
- privmvmf: FedMVMF with PrivMVMF's default config (2 epochs) on the same 10 users, no
  encryption and no sampling;
- fedncf: FedNCF in the paper's setting (lr 0.001) trained for 100 global rounds; the
  popularity ranker's HR@10 on the same split is printed too.

Prints a Markdown table (the one in docs/first-run.md)::

    PYTHONPATH=. python benchmarks/first_run.py [--protocols fedmvmf,fedncf] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PROTOCOLS = ("fedmvmf", "privmvmf", "fedsplit", "fedncf", "fedrec", "fedproto")

#: reference runs: (protocol, --set values, users)
REFERENCES = {
    "fedmvmf": ("fedmvmf", [], None),
    "privmvmf": ("fedmvmf", ["epochs=2"], 10),
    "fedsplit": ("fedsplit", [], None),
    "fedncf": ("fedncf", ["lr=0.001", "global_rounds=100"], None),
    "fedrec": ("fedrec", [], None),
    "fedproto": ("fedproto", [], None),
}


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_default(protocol: str, out: Path) -> dict:
    """Run ``privaudit attack --protocol P --out OUT`` and time it."""
    cmd = [sys.executable, "-m", "privaudit", "attack", "--protocol", protocol, "--out", str(out), "--force", "--quiet"]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"{protocol}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    results = json.loads((out / "results.json").read_text())
    metric = results["utility_metric"]
    primary = results.get("primary_metric")
    values = results.get("sweep_values") or [None]
    util, attack = [], []
    for v in values:
        rows = {r["metric"]: r["mean"] for r in results["summary"] if r["value"] == v}
        util.append(rows.get(f"utility.{metric}"))
        attack.append(rows.get(primary))
    return {
        "wall": wall,
        "cpu": cpu,
        "metric": metric,
        "sweep": results["sweep"],
        "values": values,
        "utility": util,
        "primary": primary,
        "attack": attack,
        "defaults": proc.stdout.splitlines()[0],
    }


def reference(protocol: str, metric: str) -> tuple[float, str]:
    """Seed-mean main utility of the non-private reference run (and a note)."""
    from privaudit.experiment import run_transcript

    name, sets, users = REFERENCES[protocol]
    config = dict(s.split("=", 1) for s in sets)
    vals = [
        run_transcript(protocol=name, protocol_config=config, users=users, seed=s).utility[metric] for s in range(3)
    ]
    note = f"{name} {' '.join('--set ' + x for x in sets)}".strip() + (f" --users {users}" if users else "")
    if protocol == "fedncf":
        note += f"; popularity {popularity_hr():.3f}"
    if protocol == "fedproto":
        rm, gm = fedproto_rmse()
        note += f"; its RMSE {rm:.2f} vs the global-mean predictor's {gm:.2f}"
    return float(np.mean(vals)), note


def fedproto_rmse() -> tuple[float, float]:
    """FedProto's test RMSE and that of predicting the training mean, same split (seeds 0..2)."""
    from privaudit.experiment import run_transcript

    ours, mean = [], []
    for seed in range(3):
        r = run_transcript(protocol="fedproto", seed=seed)
        train, test = r.model["train"], r.model["test"].tocoo()
        ours.append(r.utility["rmse"])
        mean.append(float(np.sqrt(np.mean((test.data - train.data.mean()) ** 2))))
    return float(np.mean(ours)), float(np.mean(mean))


def popularity_hr(k: int = 10) -> float:
    """HR@k of ranking by training popularity on FedNCF's leave-one-out split (seeds 0..2)."""
    from privaudit.data import synthetic
    from privaudit.metrics import hit_ratio_at_k
    from privaudit.protocols import fedncf

    ds = synthetic()
    out = []
    for seed in range(3):
        streams = fedncf.rng_streams(seed)
        pos, test_item = fedncf.implicit_split(ds, streams["split"], "random")
        users, cand = fedncf.eval_candidates(pos, test_item, ds.n_items, 100, streams["eval"])
        pop = np.bincount(pos.indices, minlength=ds.n_items).astype(float)
        out.append(hit_ratio_at_k(pop[cand], np.zeros(len(users), dtype=np.int64), k))
    return float(np.mean(out))


def _fmt(values: list) -> str:
    return ", ".join("n/a" if v is None else f"{v:.3f}" for v in values)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--protocols", default=",".join(PROTOCOLS))
    p.add_argument("--out", default=None, help="report folders (default: a temporary folder)")
    args = p.parse_args()
    base = Path(args.out or tempfile.mkdtemp(prefix="privaudit-first-run-"))
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print()
    print(
        "| protocol | swept | wall s | CPU s | attack (primary metric) per point | utility per point | reference "
        "| worst / reference |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for protocol in args.protocols.split(","):
        r = run_default(protocol, base / protocol)
        ref, note = reference(protocol, r["metric"])
        worst = min(u for u in r["utility"] if u is not None) if r["metric"] != "rmse" else max(r["utility"])
        ratio = worst / ref if ref else float("nan")
        swept = f"{r['sweep']} = {', '.join(str(v) for v in r['values'])}"
        print(
            f"| {protocol} | {swept} | {r['wall']:.0f} | {r['cpu']:.0f} | {r['primary']}: {_fmt(r['attack'])} | "
            f"{r['metric']}: {_fmt(r['utility'])} | {ref:.3f} ({note}) | {ratio:.2f} |",
            flush=True,
        )
    print()
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
