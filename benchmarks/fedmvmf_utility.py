"""FedMVMF utility on MovieLens 100K for the three test scenarios of PrivMVMF paper §6.3.

Runs the default configuration (all 943 users) in each of the four training scenarios
(SemiALS/SGD x ObsOnly/InclUnc) and prints NDCG@10, precision@10, recall@10 and F1@10 for
existing users/items (per-user 80/20 split), cold-start users (10 %) and cold-start items
(10 %), as a Markdown table, plus the mean seconds per epoch (no recording).

    python benchmarks/fedmvmf_utility.py [--data PATH] [--seeds 1] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

from privaudit.data import load_dataset
from privaudit.protocols.fedmvmf import FedMVMF

ML100K = ml100k_dir()
SCENARIOS = [(u, c) for u in ("semials", "sgd") for c in ("obsonly", "inclunc")]
GROUPS = [("existing users/items", ""), ("cold-start users", "cold_user_"), ("cold-start items", "cold_item_")]
METRICS = ("ndcg", "precision", "recall", "f1")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ML100K))
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    overrides = dict(s.split("=", 1) for s in args.set)
    ds = load_dataset(args.data)
    results = {}
    for scenario in SCENARIOS:
        utils = [
            FedMVMF()
            .run(ds, {**overrides, "update": scenario[0], "unrated": scenario[1], "record_rounds": "0"}, rng=seed)
            .utility
            for seed in range(args.seeds)
        ]
        results[scenario] = {k: float(np.mean([u[k] for u in utils])) for k in utils[0]}
    print(
        f"FedMVMF on {ds.name} ({ds.n_users} users), config {FedMVMF.resolve_config(overrides)}, seeds 0..{args.seeds - 1}\n"
    )
    print("| test scenario | metric | " + " | ".join(f"{u}/{c}" for u, c in SCENARIOS) + " |")
    print("|---|---|" + "---|" * len(SCENARIOS))
    for label, prefix in GROUPS:
        for metric in METRICS:
            key = f"{prefix}{metric}@10"
            print(f"| {label} | {metric}@10 | " + " | ".join(f"{results[s][key]:.4f}" for s in SCENARIOS) + " |")
    print("| | s/epoch | " + " | ".join(f"{results[s]['epoch_seconds']:.3f}" for s in SCENARIOS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
