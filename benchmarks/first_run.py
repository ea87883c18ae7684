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

The numbers README.md and docs/first-run.md quote about a default run sit in marked spans,
``<!-- fr:KEY -->text<!-- /fr -->``, written by this script from a fresh run::

    PYTHONPATH=. python benchmarks/first_run.py --update-docs            # fedmvmf (the main job)
    PYTHONPATH=. python benchmarks/first_run.py --update-docs --protocols fedmvmf,privmvmf,...
    PYTHONPATH=. python benchmarks/first_run.py --check                  # exit 1 on a mismatch

``--check`` compares every number of each span with the fresh run's at ``TOLERANCE`` (absolute,
0.002: two units of the third decimal printed; the runs are seeded, three runs on one machine are
identical, and BLAS kernels on another may round a victim's decision differently). Spans of
protocols not run are left alone; wall and CPU times are not checked (they depend on the machine).
tests/test_first_run_docs.py runs ``--check`` for fedmvmf.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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


ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/first-run.md")
#: Absolute tolerance of ``--check`` on every number of a span (two units of the third decimal).
TOLERANCE = 0.002
SPAN = re.compile(r"<!-- fr:(?P<key>[A-Za-z0-9_.-]+) -->(?P<text>.*?)<!-- /fr -->", re.S)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
AGAINST = {"prior": "prior-only baseline", "random": "random guess"}


def _3(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def figures_of(protocol: str, results: dict) -> dict[str, str]:
    """The quoted figures of one default run, by span key (``P.attack``, ``P.utility``, ...).

    For every protocol: the primary metric and the main utility per swept point. For fedmvmf
    (the main job the README quotes) also the verdict's numbers at the strongest point: the
    attack's mean, the baseline it is tested against (name and value: mean - advantage), the
    advantage with its bounds, victims and seeds, the last value, the accuracy lost at scale 1
    and the utility lost at the strongest point."""
    metric, primary = results["utility_metric"], results.get("primary_metric")
    values = results.get("sweep_values") or [None]
    rows = {(json.dumps(r["value"]), r["metric"]): r["mean"] for r in results["summary"]}
    attack = [rows.get((json.dumps(v), primary)) for v in values]
    utility = [rows.get((json.dumps(v), f"utility.{metric}")) for v in values]
    out = {f"{protocol}.attack": ", ".join(map(_3, attack)), f"{protocol}.utility": ", ".join(map(_3, utility))}
    prior = [rows.get((json.dumps(v), f"prior.{primary}")) for v in values]
    if prior and prior[0] is not None:
        out[f"{protocol}.prior"] = _3(prior[0])
    if protocol != "fedmvmf":
        return out
    verdict = results["verdicts"][0]
    row = verdict["rows"][-1]
    test = row["tests"][verdict["metric"]]
    out.update(
        {
            "fedmvmf.last_value": str(values[-1]) if not float(values[-1]).is_integer() else str(int(values[-1])),
            "fedmvmf.last_attack": _3(attack[-1]),
            "fedmvmf.against": AGAINST.get(str(row.get("against")), f"{row.get('against')} baseline"),
            "fedmvmf.baseline": _3(attack[-1] - row["advantage"]),
            "fedmvmf.random": f"{rows[(json.dumps(values[-1]), f'baseline.{primary}')]:.2f}",
            "fedmvmf.lower": _3(row["advantage_low"]),
            "fedmvmf.advantage": f"{_3(row['advantage'])} [{_3(row['advantage_low'])}, {_3(row['advantage_high'])}]",
            "fedmvmf.victims": str(test["n"]),
            "fedmvmf.seeds": str(test["seeds"]),
            "fedmvmf.verdict": str(row["verdict"]),
            "fedmvmf.reference": _3(utility[0]),
            "fedmvmf.worst_ratio": f"{min(utility) / utility[0]:.2f}",
            "fedmvmf.drop_at_1": f"{100 * (attack[0] - attack[values.index(1)]):.0f}",
            "fedmvmf.cost_last": f"{100 * (1 - utility[-1] / utility[0]):.0f}",
        }
    )
    return out


def doc_spans(text: str) -> list[tuple[str, str]]:
    """(key, text) of every marked span of a document."""
    return [(m["key"], m["text"]) for m in SPAN.finditer(text)]


def update_docs(figures: dict[str, str], root: Path = ROOT) -> list[str]:
    """Rewrite the marked spans of README.md and docs/first-run.md whose key ``figures`` has;
    the keys written."""
    done = []
    for name in DOCS:
        path = root / name
        text = path.read_text(encoding="utf-8")

        def put(m: re.Match) -> str:
            if m["key"] not in figures:
                return m.group(0)
            done.append(m["key"])
            return f"<!-- fr:{m['key']} -->{figures[m['key']]}<!-- /fr -->"

        new = SPAN.sub(put, text)
        if new != text:
            path.write_text(new, encoding="utf-8")
    return done


def check_docs(
    figures: dict[str, str], root: Path = ROOT, tolerance: float = TOLERANCE, words_only: bool = False
) -> list[str]:
    """One line per marked span of README.md / docs/first-run.md that does not match
    ``figures`` (every number within ``tolerance``, the words equal; ``words_only``: the words
    alone); spans of other protocols are skipped, a span key this script does not write is a
    mismatch."""
    bad = []
    for name in DOCS:
        for key, text in doc_spans((root / name).read_text(encoding="utf-8")):
            protocol = key.split(".", 1)[0]
            if protocol not in {k.split(".", 1)[0] for k in figures}:
                if protocol not in PROTOCOLS:
                    bad.append(f"{name}: span {key!r}: no such figure")
                continue
            want = figures.get(key)
            if want is None:
                bad.append(f"{name}: span {key!r}: no such figure")
                continue
            got_n, want_n = NUMBER.findall(text), NUMBER.findall(want)
            same_words = " ".join(NUMBER.sub("#", text).split()) == " ".join(NUMBER.sub("#", want).split())
            close = len(got_n) == len(want_n) and all(
                abs(float(a) - float(b)) <= tolerance + 1e-12 for a, b in zip(got_n, want_n)
            )
            if not (same_words and (close or words_only)):
                bad.append(f"{name}: {key} quotes {text!r}, a fresh run gives {want!r}")
    return bad


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
    docs = p.add_mutually_exclusive_group()
    docs.add_argument("--update-docs", action="store_true", help="rewrite the marked spans (default: fedmvmf only)")
    docs.add_argument("--check", action="store_true", help="compare the marked spans with a fresh run; exit 1 if off")
    args = p.parse_args()
    base = Path(args.out or tempfile.mkdtemp(prefix="privaudit-first-run-"))
    if args.update_docs or args.check:
        given = args.protocols != ",".join(PROTOCOLS)
        figures: dict[str, str] = {}
        for protocol in args.protocols.split(",") if given else ["fedmvmf"]:
            run_default(protocol, base / protocol)
            figures.update(figures_of(protocol, json.loads((base / protocol / "results.json").read_text())))
        if args.update_docs:
            reworded = sorted(
                {line.split(": ")[1].split(" quotes ")[0] for line in check_docs(figures, words_only=True)}
            )
            keys = update_docs(figures)
            print(f"updated {len(keys)} spans: {', '.join(sorted(set(keys)))}")
            if reworded:  # a verdict or a baseline's name changed: the prose around it may need it too
                print(f"words changed in {', '.join(reworded)}: reread the sentences around them")
            return
        bad = check_docs(figures)
        print(
            "\n".join(bad)
            if bad
            else f"every quoted figure of {', '.join(sorted({k.split('.')[0] for k in figures}))} matches"
        )
        raise SystemExit(1 if bad else 0)
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
