"""Choose FedMVMF's default hyperparameters by validation on MovieLens 100K.

Validation data: ML-100K minus a per-user 20 % holdout of the ratings (seed 100), which this
script never looks at. On the remaining 80 % the protocol makes its own split (seed 1: 10 %
cold users, 10 % cold items, per-user 80/20 train/validation) and reports NDCG@10 on the
validation ratings (existing users), the cold-start users and the cold-start items.

Search: coordinate descent from the starting point, one parameter at a time over a small grid,
``--passes`` passes. Shared parameters (K, alpha, lam, lr, epochs) are scored by the mean
existing-user validation NDCG@10 over the four scenarios (SemiALS/SGD x ObsOnly/InclUnc);
``w`` by the two InclUnc scenarios, ``eta`` by the two SGD scenarios. Every evaluated point is
printed (one JSON line each) and a Markdown table of the chosen point is printed at the end.

    python benchmarks/fedmvmf_validation.py [--data PATH] [--passes 2] [--log FILE]
           [--start '{"K": 20, ...}'] [--grid '{"lam": [10, 30], ...}']
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

from privaudit.data import holdout_split, load_dataset
from privaudit.protocols.fedmvmf import FedMVMF

ML100K = ml100k_dir()
SCENARIOS = [(u, c) for u in ("semials", "sgd") for c in ("obsonly", "inclunc")]
GRID = {
    "K": [5, 10, 20],
    "alpha": [0.1, 0.5, 2.0],
    "lam": [0.1, 1.0, 10.0],
    "lr": [0.01, 0.05, 0.2],
    "epochs": [10, 20, 40],
    "w": [0.01, 0.05, 0.2],
    "eta": [1e-4, 3e-4, 1e-3],
}
START = {"K": 10, "alpha": 0.5, "lam": 1.0, "lr": 0.05, "epochs": 20, "w": 0.05, "eta": 3e-4}
SCORED_BY = {"w": [s for s in SCENARIOS if s[1] == "inclunc"], "eta": [s for s in SCENARIOS if s[0] == "sgd"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ML100K))
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--log", default=None, help="append every evaluated point (JSON lines) to this file")
    ap.add_argument("--start", default=None, help="JSON dict overriding the starting point")
    ap.add_argument("--grid", default=None, help="JSON dict {param: [values]} replacing the grid")
    args = ap.parse_args(argv)
    ds = load_dataset(args.data)
    val, _held_out = holdout_split(ds, 0.2, 100)
    cache: dict[tuple, dict] = {}
    log = open(args.log, "a") if args.log else None

    def evaluate(point: dict, scenario: tuple[str, str]) -> dict:
        key = (scenario, tuple(sorted(point.items())))
        if key not in cache:
            tic = time.perf_counter()
            res = FedMVMF().run(
                val,
                {**point, "update": scenario[0], "unrated": scenario[1], "record_rounds": 0, "track_loss": True},
                rng=1,
            )
            util = {k: v for k, v in res.utility.items() if k.endswith("ndcg@10")}
            util["seconds"] = time.perf_counter() - tic
            util["epoch_seconds"] = res.utility["epoch_seconds"]
            if not np.isfinite(res.model["loss"][-1]) or res.model["loss"][-1] > res.model["loss"][0]:
                util["ndcg@10"] = 0.0  # diverged
            cache[key] = util
            line = json.dumps({"point": point, "update": scenario[0], "unrated": scenario[1], **util})
            print(line, flush=True)
            if log:
                log.write(line + "\n")
                log.flush()
        return cache[key]

    def score(point: dict, param: str) -> float:
        scen = SCORED_BY.get(param, SCENARIOS)
        return float(np.mean([evaluate(point, s)["ndcg@10"] for s in scen]))

    point = {**START, **(json.loads(args.start) if args.start else {})}
    grid = json.loads(args.grid) if args.grid else GRID
    for _ in range(args.passes):
        for param, values in grid.items():
            best = max(values, key=lambda v: score({**point, param: v}, param))
            point[param] = best
            print(f"# {param} -> {best}", file=sys.stderr, flush=True)
    print("# chosen:", json.dumps(point), file=sys.stderr)
    print("\n| scenario | val NDCG@10 existing | cold users | cold items | s/epoch |")
    print("|---|---|---|---|---|")
    for s in SCENARIOS:
        u = evaluate(point, s)
        print(
            f"| {s[0]}/{s[1]} | {u['ndcg@10']:.4f} | {u['cold_user_ndcg@10']:.4f} | {u['cold_item_ndcg@10']:.4f} | {u['epoch_seconds']:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
