"""k-anonymity linking attack on FedNCF under secure aggregation (FedNCF paper §3.5.2): precision and
recall of the target's positives against the number of manipulated round pairs and the number of
negatives per positive (the blurring property); saves docs/fedncf_kanon_linking.png.

    python benchmarks/fedncf_linking.py [--data PATH|synthetic] [--pairs 16] [--targets 3]

Each run: adversarial selection (a fixed random group S of c-1 clients, rounds alternate S+target
and S), ``secagg`` on, ``global_rounds=0``; the attack ``ncf-kanon-linking`` with rounds=r reads
the per-item counts of the first r pairs. Prints a Markdown table (mean over ``--targets``
random targets) and the per-round k (cohort size).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

from privaudit.attacks.ncf.kanon_linking import NCFKAnonLinking
from privaudit.data import load_dataset, synthetic
from privaudit.defenses.secagg import SecAgg
from privaudit.protocols.fedncf import FedNCF

DATA = ml100k_dir()
OUT = Path(__file__).resolve().parents[1] / "docs" / "fedncf_kanon_linking.png"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--pairs", type=int, default=16)
    p.add_argument("--targets", type=int, default=3)
    p.add_argument("--negatives", default="0,1,2,4")
    p.add_argument("--clients-per-round", type=int, default=20)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    ds = (
        synthetic(n_users=300, n_items=500, seed=0)
        if args.data == "synthetic" or not Path(args.data).exists()
        else load_dataset(args.data)
    )
    negs = [int(x) for x in args.negatives.split(",")]
    rounds = [r for r in (1, 2, 4, 8, 16, 32) if r <= args.pairs]
    res: dict[int, dict[int, list]] = {q: {r: [] for r in rounds} for q in negs}
    ks = []
    for q in negs:
        for t in range(args.targets):
            cfg = {
                "global_rounds": 0,
                "selection": "adversarial",
                "manipulated_rounds": args.pairs,
                "clients_per_round": args.clients_per_round,
                "negatives": q,
                "record_rounds": -1,
                "lr": 1e-3,  # the paper's learning rate (the protocol default is 0.01)
            }
            run = FedNCF().run(ds, cfg, [SecAgg()], t)  # same targets and groups for every q
            for r in rounds:
                out = NCFKAnonLinking(rounds=r).evaluate(run.transcript, np.random.default_rng(0))
                res[q][r].append((out.metrics["precision"], out.metrics["recall"], out.metrics["f1"]))
                ks = out.reconstruction.meta["k_per_round"]
    print(f"dataset: {ds.summary()}  cohort k per round (with/without target): {ks[:4]} ...")
    print("| negatives per positive | pairs of rounds | precision | recall | F1 |")
    print("|---|---|---|---|---|")
    table = []
    for q in negs:
        for r in rounds:
            pr, rc, f1 = np.mean(res[q][r], axis=0)
            table.append({"negatives": q, "pairs": r, "precision": pr, "recall": rc, "f1": f1})
            print(f"| {q} | {r} | {pr:.3f} | {rc:.3f} | {f1:.3f} |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for q in negs:
        rows = [x for x in table if x["negatives"] == q]
        axes[0].plot([x["pairs"] for x in rows], [x["precision"] for x in rows], marker="o", label=f"{q} neg/pos")
        axes[1].plot([x["pairs"] for x in rows], [x["recall"] for x in rows], marker="o", label=f"{q} neg/pos")
    for ax, name in zip(axes, ("precision", "recall")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("manipulated round pairs")
        ax.set_title(f"{name} of the target's positives")
        ax.grid(alpha=0.3)
    axes[0].set_ylim(0, 1.05)
    axes[1].legend()
    fig.suptitle(f"ncf-kanon-linking under secagg (k = {max(ks)}/{min(ks)} per round)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"figure: {args.out}")
    print(json.dumps(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
