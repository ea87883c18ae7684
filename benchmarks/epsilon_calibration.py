"""Calibration of the two empirical epsilon lower bounds on mechanisms with a known epsilon.

(a) Per-record bound (:func:`privaudit.metrics.empirical_epsilon`, threshold chosen on a
held-out half): a count of sensitivity 1 released with Laplace(1 / eps) noise, ``--records``
releases with the record (label 1) and as many without (label 0).

(b) One-run canary bound (:func:`privaudit.canary.canary_bound`, Steinke, Nasr and Jagielski,
NeurIPS 2023): ``--canaries`` canaries with uniform bits S_i = +-1, each released as
S_i / 2 + Laplace(1 / eps) (flipping one bit moves one release by 1: eps-DP), guessed by the
k most confident in each direction over the fixed menu.

For every eps, ``--reps`` repetitions: the share of bounds above the true eps (must be <= 5 %
at 95 % confidence), the median bound and the median ratio bound / eps. Prints a Markdown table.

    python benchmarks/epsilon_calibration.py [--epsilons 0.5,1,2,4] [--reps 200]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from privaudit.canary import canary_bound
from privaudit.metrics import empirical_epsilon


def per_record(eps: float, n: int, rng: np.random.Generator) -> float:
    y = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    return empirical_epsilon(y, y + rng.laplace(0.0, 1.0 / eps, y.size), seed=rng)["epsilon_lb"]


def one_run(eps: float, m: int, rng: np.random.Generator) -> float:
    bits = rng.integers(0, 2, m) * 2 - 1
    return canary_bound(bits / 2.0 + rng.laplace(0.0, 1.0 / eps, m), bits)["epsilon_lb"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilons", default="0.5,1,2,4")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--records", type=int, default=1000, help="per class, bound (a)")
    ap.add_argument("--canaries", type=int, default=1000, help="bound (b)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    print("| bound | true eps | exceed rate | median eps_lb | median eps_lb / eps |")
    print("|---|---|---|---|---|")
    for name, fn, size in (
        (f"(a) held-out threshold, {args.records:,} per class", per_record, args.records),
        (f"(b) one-run canaries, m = {args.canaries:,}", one_run, args.canaries),
    ):
        for eps in (float(e) for e in args.epsilons.split(",")):
            rng = np.random.default_rng([args.seed, int(eps * 1000), size])
            lbs = np.array([fn(eps, size, rng) for _ in range(args.reps)])
            print(
                f"| {name} | {eps:g} | {np.mean(lbs > eps):.1%} | {np.median(lbs):.2f} | {np.median(lbs) / eps:.2f} |"
            )
    print(f"\n{args.reps} repetitions per row, {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
