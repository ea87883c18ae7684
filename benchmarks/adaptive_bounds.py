"""What a score bound (feature-bounds ``max_score``) costs honest FedNCF training, and what an
adaptive saturating server still reads under it (docs/malicious-server.md, "feature-bounds").

    python benchmarks/adaptive_bounds.py cost [--data synthetic|ml-100k] [--models gmf,neumf] [--global-rounds 5]
    python benchmarks/adaptive_bounds.py crafts [--seeds 3]

``cost``: honest runs (seed 0) without a bound and with ``max_score`` 10, 15, 20 (``max_bias``
off): HR@10 and the aggregation rounds aborted because some member's score of a row it was
about to train exceeded the bound. ``crafts``: synthetic (40 users, 120 items, cohorts of 4,
two saturated rounds, plain uploads, one round read), NeuMF: the bias and the MLP-unit
saturation against ``max_bias`` 5 and ``max_score`` 10 / 15 / 20 (the server crafts at 0.9 x a
public ``max_score``); precision and F1 of the target's positives, means over the seeds.
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

from privaudit.attacks.ncf.active_saturation import NCFActiveSaturation, NCFUnitSaturation
from privaudit.data import load_dataset, synthetic
from privaudit.defenses.feature_bounds import FeatureBounds
from privaudit.protocols.fedncf import FedNCF

BOUNDS = (10.0, 15.0, 20.0)


def cost(data: str, models: list[str], global_rounds: int) -> None:
    if data == "synthetic":
        ds = synthetic()
    else:
        ds = load_dataset(str(ml100k_dir()))  # $PRIVAUDIT_ML100K, else ../shared/data/ml-100k
    print("| model | max_score | HR@10 | rounds aborted |")
    print("|---|---|---|---|")
    for model in models:
        base = {"model": model, "global_rounds": global_rounds, "record_rounds": -1}
        ref = FedNCF().run(ds, {**base, "record_rounds": 0}, [], rng=0)
        print(f"| {model} | none | {ref.utility['hr@10']:.3f} | 0 |", flush=True)
        for bound in BOUNDS:
            res = FedNCF().run(ds, base, [FeatureBounds(max_score=bound, max_bias=-1.0)], rng=0)
            aggs = res.transcript.select("aggregate")
            aborted = sum(1 for m in aggs if (m.meta or {}).get("aborted"))
            print(f"| {model} | {bound:g} | {res.utility['hr@10']:.3f} | {aborted} of {len(aggs)} |", flush=True)


def crafts(seeds: int) -> None:
    ds = synthetic(n_users=40, n_items=120, seed=3)
    cfg = {"server": "saturate", "model": "neumf", "clients_per_round": 4, "global_rounds": 0, "deviation_rounds": 2}
    settings = [{"max_bias": 5.0}, {"max_bias": 5.0, "max_norm": 1.0}] + [
        {"max_bias": -1.0, "max_score": b} for b in BOUNDS
    ]
    print("| craft | feature-bounds | precision | F1 | honest reading F1 | prior F1 |")
    print("|---|---|---|---|---|---|")
    for via, attack in (("bias", NCFActiveSaturation), ("mlp-unit", NCFUnitSaturation)):
        for bounds in settings:
            rows = []
            for seed in range(seeds):
                tr = FedNCF().run(ds, {**cfg, "craft_via": via}, [FeatureBounds(**bounds)], rng=seed).transcript
                out = attack(rounds=1).evaluate(tr, np.random.default_rng(seed))
                m = out.metrics
                rows.append((m["precision"], m["f1"], m["honest_f1"], out.baseline_prior["f1"]))
            mean = np.mean(rows, axis=0)
            text = ",".join(f"{k}={v:g}" for k, v in bounds.items())
            print(f"| {via} | {text} | " + " | ".join(f"{v:.3f}" for v in mean) + " |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("cost", "crafts"))
    p.add_argument("--data", default="synthetic", choices=("synthetic", "ml-100k"))
    p.add_argument("--models", default="gmf,mlp,neumf")
    p.add_argument("--global-rounds", type=int, default=5)
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args()
    if args.part == "cost":
        cost(args.data, args.models.split(","), args.global_rounds)
    else:
        crafts(args.seeds)


if __name__ == "__main__":
    main()
