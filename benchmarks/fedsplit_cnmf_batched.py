"""Speed of FedSPLIT's local step: all groups' CNMFs in one batched pass vs one CNMF per group.

Both fit the same groups of MovieLens 100K (or the synthetic set) with the same
hyperparameters; the batched fit uses :func:`privaudit.models.cnmf.block_columns`. Prints the
seconds of each and their ratio, measured in this run, and the largest difference between the
two fits (constant initialisation, so they must agree to rounding).

    python benchmarks/fedsplit_cnmf_batched.py [--data PATH|synthetic] [--iters 50]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

DEFAULT_DATA = ml100k_dir()


def main(argv=None) -> int:
    from privaudit.data import load_dataset, random_groups, synthetic
    from privaudit.models.cnmf import CNMF, block_columns

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA) if DEFAULT_DATA.exists() else "synthetic")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--k", type=int, default=5)
    args = ap.parse_args(argv)
    ds = synthetic() if args.data == "synthetic" else load_dataset(args.data)
    groups = random_groups(ds, 3, 30, 0)
    N, (n, m) = len(groups), ds.ratings.shape
    gid = np.empty(n, dtype=np.int64)
    for g, users in enumerate(groups):
        gid[users] = g
    k_g = np.maximum(1, np.minimum(args.k, np.array([len(u) for u in groups]) - 1))
    kw = dict(n_iter=args.iters, init_low=0.05, init_high=0.05)
    t0 = time.perf_counter()
    batched = CNMF(n_components=args.k, **kw).fit(
        block_columns(ds.ratings, gid, N), mu=3.5, row_rank=k_g[gid], col_rank=np.repeat(k_g, m)
    )
    t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    diff = 0.0
    fits = []
    for g, users in enumerate(groups):
        fits.append(CNMF(n_components=int(k_g[g]), **kw).fit(ds.ratings[users], mu=3.5))
    t_loop = time.perf_counter() - t0
    for g, users in enumerate(groups):
        diff = max(diff, float(np.abs(batched.W_[users, : k_g[g]] - fits[g].W_).max()))
    print(f"{ds.name}: {N} groups, {ds.n_ratings} ratings, {args.iters} iterations")
    print(
        f"batched (one pass): {t_batched:.2f} s; one CNMF per group: {t_loop:.2f} s; ratio loop/batched = {t_loop / t_batched:.1f}x"
    )
    print(f"max |W_batched - W_loop| = {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
