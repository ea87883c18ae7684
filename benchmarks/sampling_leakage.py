"""What the uploaded item sets leak under unrated-item sampling, and what the sampling costs.

For each sampling distribution (``uniform`` = the papers', ``popularity``, ``matched``) and rho,
samples unrated items for every ML-100K user (all 943 by default) and prints the precision of
an observer of the item sets who guesses round(|set| / (1 + rho)) of each user's uploaded items
as rated (:func:`privaudit.defenses.sampling.item_set_guess`):

- ``uniform`` no item prior (the paper's bound 1 / (1 + rho));
- ``popularity`` / ``rarity``: ranks by how many users uploaded the item (c_j = n_j + s_j), or
  the reverse;
- ``counts``: ranks by the true rating counts n_j (if the server knew them);
- ``cooccurrence``: ranks by the lift of the item with the user's other uploaded items
  computed from the other users' sets;
- ``lowrank`` / ``lowrank_centered``: ranks by a rank-20 SVD of the users x items upload
  matrix (as is / after removing the independence term of its margins) — collaborative
  filtering on the item sets.

For ``matched`` it also prints the unmatchable ("capped") items and the oracle bound: the
precision of the best item-only observer if every other item were matched exactly (capped
items, rated with probability n_jb / N_b > 1 / (1 + rho), guessed first).

With ``--utility`` it runs FedMVMF (current defaults, SemiALS) with each distribution and
prints NDCG@10 etc. for existing users, cold-start users and cold-start items.

    PYTHONPATH=. python benchmarks/sampling_leakage.py [--data PATH] [--rho 1,2,3]
           [--distributions uniform,popularity,matched] [--utility] [--epochs N]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

from privaudit.data import load_dataset, synthetic
from privaudit.defenses.base import ClientData
from privaudit.defenses.sampling import SamplingDefense, item_set_guess
from privaudit.registry import get

ML100K = ml100k_dir()
STRATEGIES = ("uniform", "popularity", "rarity", "counts", "cooccurrence", "lowrank", "lowrank_centered")
UTILITY_KEYS = [f"{p}{m}@10" for p in ("", "cold_user_", "cold_item_") for m in ("ndcg", "precision", "recall", "f1")]


def _sets(mat):
    return [mat.indices[mat.indptr[u] : mat.indptr[u + 1]] for u in range(mat.shape[0])]


def oracle_bound(R, sampled_sets, rho: float, defense: SamplingDefense) -> float:
    """Best item-only precision if all matchable items had posterior exactly 1/(1+rho).

    Per user: the guess takes the user's uploaded capped items first (posterior n_jb / N_b in
    its activity group b, as every non-rater of the group uploads them), then matchable items
    at 1 / (1 + rho).
    """
    n, m = R.shape
    n_real = np.diff(R.indptr)
    groups = int(defense.config["matched_groups"])
    edges = np.quantile(n_real, np.linspace(0.0, 1.0, groups + 1)[1:-1]) if groups > 1 else np.empty(0)
    group = np.searchsorted(edges, n_real, side="right")
    post = np.zeros((groups, m))
    capped = np.zeros((groups, m), bool)
    for b in range(groups):
        idx = np.flatnonzero(group == b)
        nj = np.bincount(R[idx].indices, minlength=m)
        capped[b] = rho * nj > len(idx) - nj
        post[b] = nj / max(len(idx), 1)
    chance = 1.0 / (1.0 + rho)
    out = []
    for u, items in enumerate(sampled_sets):
        if not len(items):
            continue
        b = group[u]
        k = max(1, int(np.floor(len(items) / (1.0 + rho) + 0.5)))
        p = np.where(capped[b, items], post[b, items], chance)
        out.append(np.sort(p)[::-1][:k].mean())
    return float(np.mean(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ML100K) if ML100K.exists() else "synthetic")
    ap.add_argument("--rho", default="1,2,3")
    ap.add_argument("--distributions", default="uniform,popularity,matched")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--utility", action="store_true", help="also run FedMVMF with each distribution")
    ap.add_argument("--no-leakage", action="store_true", help="skip the item-set observers")
    ap.add_argument("--epochs", type=int, default=None, help="FedMVMF epochs (default: FedMVMF's)")
    ap.add_argument(
        "--sampling",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra sampling-defense parameter, e.g. matched_min_samplers=0 (repeatable)",
    )
    args = ap.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.sampling)
    ds = synthetic() if args.data == "synthetic" else load_dataset(args.data)
    R = ds.ratings
    counts = np.bincount(R.indices, minlength=R.shape[1])
    rhos = [float(r) for r in args.rho.split(",")]
    dists = args.distributions.split(",")
    print(f"data={ds.summary()}")
    if not args.no_leakage:
        print(
            f"{'rho':>4s} {'distribution':12s} "
            + " ".join(f"{s:>12s}" for s in STRATEGIES)
            + "  (precision; chance 1/(1+rho))"
        )
        for rho in rhos:
            for dist in dists:
                t0 = time.perf_counter()
                d = SamplingDefense(rho=rho, distribution=dist, **extra)
                out = d.on_client_data(ClientData.from_ratings(R), np.random.default_rng(args.seed))
                sets = _sets(out.ratings)
                res = [item_set_guess(sets, _sets(R), rho, s, item_counts=counts)["precision"] for s in STRATEGIES]
                line = f"{rho:4g} {dist:12s} " + " ".join(f"{v:12.3f}" for v in res)
                c = np.bincount(out.ratings.indices, minlength=R.shape[1])
                line += f"  best-chance={max(res) - 1 / (1 + rho):+.3f}; items uploaded by one client: {int((c == 1).sum())}"
                line += f" ({time.perf_counter() - t0:.0f}s)"
                if dist == "matched":
                    info = d.matched_info
                    caps = [g["capped"] for g in info["groups"]]
                    line += (
                        f"\n     capped items per activity group {caps}, share of sampled uploads "
                        f"{info['capped_uploads']:.3f}; oracle bound {oracle_bound(R, sets, rho, d):.3f}; fit "
                        + ", ".join(f"{g['iterations']} it err {g['max_rel_error']:.3f}" for g in info["groups"])
                    )
                print(line, flush=True)
    if args.utility:
        cfg = {} if args.epochs is None else {"epochs": args.epochs}
        cfg = get("protocol", "fedmvmf").resolve_config(cfg)
        for rho in rhos:
            rows = {}
            for dist in dists:
                t0 = time.perf_counter()
                res = get("protocol", "fedmvmf")().run(
                    ds, cfg, [SamplingDefense(rho=rho, distribution=dist, **extra)], rng=args.seed
                )
                rows[dist] = res.utility
                print(f"rho={rho:g} {dist}: FedMVMF {time.perf_counter() - t0:.0f}s", flush=True)
            print(f"FedMVMF utility, rho={rho:g}, K={cfg['K']}, epochs={cfg['epochs']}, w={cfg['w']}")
            print(f"{'metric':24s} " + " ".join(f"{d:>11s}" for d in dists))
            for key in UTILITY_KEYS:
                print(f"{key:24s} " + " ".join(f"{rows[d][key]:11.5f}" for d in dists))
    return 0


if __name__ == "__main__":
    sys.exit(main())
