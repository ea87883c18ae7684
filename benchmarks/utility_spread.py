"""Does a one-seed utility interval cover the spread of a defense's cost over runs?

For seeds 0 .. N-1 the protocol runs on the synthetic data (default config) without and with the
defense (the same seed: the same split and initial model), and the paired bootstrap over users
(:func:`privaudit.results.utility.paired_bootstrap`) gives the cost of that seed and its standard
error. Printed: each seed's reference and defended utility, cost, SE and units, then the SD of the
costs over the seeds against the mean SE, and the SD of ``(cost - mean cost) / SE`` (1 if a
bootstrap over users covered the run-level spread; the factor
:data:`privaudit.results.utility.UTILITY_RUN_INFLATION` covers the values measured here).

    python benchmarks/utility_spread.py --protocol fedmvmf --metric ndcg@10 --defense dp-gaussian:noise_multiplier=1
    python benchmarks/utility_spread.py --protocol fedmvmf --metric ndcg@10 --defense dp-gaussian:noise_multiplier=0.3
    python benchmarks/utility_spread.py --protocol fedrec --metric rmse --defense laplace:scale=1
"""

from __future__ import annotations

import argparse

import numpy as np

from privaudit import registry
from privaudit.results.utility import paired_bootstrap
from privaudit.runner import load_data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", default="fedmvmf")
    ap.add_argument("--metric", default="ndcg@10")
    ap.add_argument("--defense", default="dp-gaussian:noise_multiplier=1", help="NAME:param=value")
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    name, _, spec = args.defense.partition(":")
    param, _, value = spec.partition("=")
    proto = registry.get("protocol", args.protocol)
    defense = registry.get("defense", name)
    spec = proto.utility_specs.get(args.metric)
    higher = spec.higher_is_better if spec is not None else True
    data = load_data("synthetic")
    costs, ses = [], []
    print("| seed | reference | defended | cost | bootstrap SE | units |")
    print("|---|---|---|---|---|---|")
    for seed in range(args.seeds):
        ref = proto().run(data, {}, (), seed)
        dfd = proto().run(data, {}, (defense(**{param: float(value)}),), seed)
        b = paired_bootstrap(ref.user_utility[args.metric], dfd.user_utility[args.metric], higher)
        costs.append(b["cost"])
        ses.append(b["se"])
        print(
            f"| {seed} | {ref.utility[args.metric]:.4f} | {dfd.utility[args.metric]:.4f} | {b['cost']:.4f} "
            f"| {b['se']:.4f} | {b['n']} {b['over']} |",
            flush=True,
        )
    c, s = np.array(costs), np.array(ses)
    z = (c - c.mean()) / s
    print(
        f"\n{args.protocol} {args.defense} {args.metric}: cost mean {c.mean():.4f}, SD over {args.seeds} seeds "
        f"{c.std(ddof=1):.4f}, mean bootstrap SE {s.mean():.4f}, SD of (cost - mean) / SE {z.std(ddof=1):.2f}"
    )


if __name__ == "__main__":
    main()
