"""Noise against signal of the dp-prototypes mechanism on MovieLens 100K ZIP silos.

``--scales``: the Laplace scale of the sparse-recovery values in mean units for a silo of 90 rows,
and the rows per silo at which that scale equals the 50th most-rated item's silo-mean rating
(pure arithmetic of :func:`privaudit.models.private_kmeans.budget_split` and the data).

``--configs k:T:c:eps,...``: FedProto with dp prototypes (k per silo, T trials, every silo's rows
repeated c times before the mechanism, epsilon), ell = 20, one seed: mean rank, MAP@10 and rho,
the mean over silos of the Spearman correlation of a silo's summed prototypes with its item
popularity. Repeating rows c times equals multiplying epsilon by c (every sensitivity is per row,
every utility a sum over rows), so a large epsilon reads as "a silo epsilon times larger at
epsilon = 1" — a diagnostic, not a privacy claim.

Run: ``python benchmarks/fedproto_noise.py --scales`` and
``python benchmarks/fedproto_noise.py --configs 50:5:1:10,50:5:1:1000,1:1:8:10,1:1:1:80``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fedproto_compare import ML100K, silo_prototypes  # noqa: E402

from privaudit.data import load_dataset, zip_silos  # noqa: E402
from privaudit.models.private_kmeans import budget_split, clip_rows  # noqa: E402
from privaudit.protocols.fedproto import fit_users, recommendation_metrics, server_factorize, split_test_users  # noqa: E402


def scales(ds, s=50, Lam=5.0):
    silos = [np.asarray(u) for u in zip_silos(ds) if len(u)]
    A = clip_rows(ds.ratings, s, Lam, np.random.default_rng(0))
    mus = [np.sort(np.asarray(A[u].mean(0)).ravel())[::-1] for u in silos]
    mu1, mu50 = (float(np.median([m[i] for m in mus])) for i in (0, 49))
    sizes = [len(u) for u in silos]
    print(
        f"ZIP silos: {len(silos)}, rows min/median/max {min(sizes)}/{np.median(sizes):.0f}/{max(sizes)}; "
        f"signal (median over silos of the silo-mean rating): 1st item {mu1:.2f}, 50th item {mu50:.2f}\n"
    )
    print("| k | T | eps | eps_values | Laplace scale in mean units (90 rows) | rows per silo for scale = 50th item |")
    print("|---|---|---|---|---|---|")
    for k in (50, 10, 1):
        for T in (5, 1):
            for eps in (0.1, 1.0, 10.0):
                b = budget_split(eps, T)
                print(
                    f"| {k} | {T} | {eps:g} | {b.values:.4f} | {s * Lam / (b.values * 90 / k):.3g} | {k * s * Lam / (b.values * mu50):,.0f} |"
                )


def sweep(ds, configs, ell=20, swap_iters=10):
    train, test = split_test_users(ds.ratings, 0.2, 5, np.random.default_rng(0))
    silos = [np.asarray(u, dtype=np.int64) for u in zip_silos(ds) if len(u)]
    Xd = train.toarray()
    for k, T, c, eps in configs:
        t0 = time.perf_counter()
        Xrep = np.vstack([np.repeat(Xd[u], c, axis=0) for u in silos])
        bounds = np.cumsum([0] + [len(u) * c for u in silos])
        rep = [np.arange(bounds[h], bounds[h + 1]) for h in range(len(silos))]
        P = silo_prototypes("dp", Xrep, rep, k, np.random.default_rng(1), eps, 50, 5.0, swap_iters, T)
        rho = float(np.mean([stats.spearmanr(P[h].sum(0), (Xd[u] != 0).sum(0)).statistic for h, u in enumerate(silos)]))
        V = server_factorize(np.vstack(P), ell, 0.1, 200, 0)
        met = recommendation_metrics(fit_users(Xd, V, 0.1, 200) @ V.T, train, test, 10)
        print(
            json.dumps(dict(k=k, T=T, c=c, eps=eps, rho=rho, **met, secs=round(time.perf_counter() - t0, 1))),
            flush=True,
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", action="store_true")
    ap.add_argument("--configs", default="", help="comma-separated k:T:c:eps")
    args = ap.parse_args()
    ds = load_dataset(ML100K)
    if args.scales:
        scales(ds)
    if args.configs:
        cfgs = []
        for item in args.configs.split(","):
            k, T, c, eps = item.split(":")
            cfgs.append((int(k), int(T), int(c), float(eps)))
        sweep(ds, cfgs)


if __name__ == "__main__":
    main()
