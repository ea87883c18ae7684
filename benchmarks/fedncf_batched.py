"""Batched FedNCF client training vs a per-client loop (same results, >= 10x faster).

A whole global round by default: every ML-100K user's training-set size (after the
leave-one-out split; a log-normal stand-in if the data folder is absent), shuffled and cut into
cohorts of ``--clients`` (default 20, the paper's ML-100K cohort) as FedNCF's random selection
does, 4 negatives per positive, 2 local epochs, batch 64, Adam 1e-3. Times
:func:`privaudit.models.ncf.train_clients` (the cohort together: stacked parameters, batched
matrix products, hand-written backward pass, per-client fused Adam) against
:func:`privaudit.models.ncf.train_clients_loop` (one ``torch.optim.Adam`` per client, autograd,
one Python iteration per mini-batch), both on one torch thread, cohort by cohort, and prints the
ratio of the totals and the largest difference between their results. A single cohort's ratio
depends on its largest client (the batched loop lasts as many steps as it does), which is why
the default times all cohorts of a global round::

    python benchmarks/fedncf_batched.py [--model gmf|mlp|neumf] [--clients 20] [--cohorts 0] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

from privaudit.models import ncf

DATA = ml100k_dir()


def client_sizes(rng: np.random.Generator) -> np.ndarray:
    """Training positives of every ML-100K user after the leave-one-out split (log-normal stand-in without the data)."""
    if (DATA / "u.data").exists():
        users = np.loadtxt(DATA / "u.data", dtype=np.int64, usecols=0)
        counts = np.bincount(users)[1:] - 1  # minus the held-out item
        return counts[counts > 0]
    return np.maximum(19, rng.lognormal(4.3, 0.9, size=943).astype(np.int64))


def cohort_problem(model: str, npos: np.ndarray, n_items: int, rng: np.random.Generator) -> tuple:
    """The arguments of train_clients / train_clients_loop for one cohort with these positive counts."""
    D, layers, C = 12, [48, 24, 12, 6], len(npos)
    Dt = ncf.item_dim(model, D)
    n = 5 * npos  # 4 negatives per positive
    local = [np.unique(rng.choice(n_items, size=min(int(k), n_items), replace=False)) for k in n]
    L, N = max(len(x) for x in local), int(n.max())
    net = ncf.init_network(model, D, layers, rng)
    table = ncf.init_embeddings(n_items, Dt, rng)
    rows = np.zeros((C, L, Dt), dtype=np.float32)
    inst_item = np.zeros((C, N), dtype=np.int64)
    labels = np.zeros((C, N), dtype=np.float32)
    for c in range(C):
        rows[c, : len(local[c])] = table[local[c]]
        inst_item[c, : n[c]] = rng.integers(len(local[c]), size=n[c])
        labels[c, : npos[c]] = 1
    users = ncf.init_embeddings(C, Dt, rng)
    index, valid = ncf.make_batches(n, 2, 64, rng)
    n_rows = np.array([len(x) for x in local])
    return (model, D, layers, net, rows, users, inst_item, labels, n, index, valid), n_rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gmf", choices=list(ncf.ARCHS))
    p.add_argument("--clients", type=int, default=20, help="cohort size c (paper: 20 on ML-100K)")
    p.add_argument(
        "--cohorts",
        type=int,
        default=0,
        help="cohorts timed, cut from one random permutation of the users as FedNCF does (0: a whole global round)",
    )
    p.add_argument("--items", type=int, default=1682)
    p.add_argument("--repeats", type=int, default=3, help="the whole timing is repeated; the best total is kept")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.clients < 1 or args.cohorts < 0 or args.repeats < 1:
        p.error("--clients and --repeats must be >= 1, --cohorts >= 0")
    rng = np.random.default_rng(args.seed)
    sizes = rng.permutation(client_sizes(rng))
    cuts = [sizes[s : s + args.clients] for s in range(0, len(sizes), args.clients)]
    cuts = cuts[: args.cohorts] if args.cohorts else cuts
    problems = [cohort_problem(args.model, npos, args.items, rng) for npos in cuts]
    tb = np.zeros((args.repeats, len(problems)))
    tl = np.zeros_like(tb)
    diff, steps, max_steps = 0.0, 0, 0
    with ncf.single_thread():
        ncf.train_clients(*problems[0][0], n_rows=problems[0][1])  # warm-up
        for r in range(args.repeats):
            for j, (args_t, n_rows) in enumerate(problems):
                t0 = time.perf_counter()
                a = ncf.train_clients(*args_t, n_rows=n_rows)
                tb[r, j] = time.perf_counter() - t0
                t0 = time.perf_counter()
                b = ncf.train_clients_loop(*args_t)
                tl[r, j] = time.perf_counter() - t0
                if r == 0:
                    diff = max(
                        diff,
                        float(np.abs(a["items"] - b["items"]).max()),
                        float(np.abs(a["users"] - b["users"]).max()),
                        max(float(np.abs(a["net"][k] - b["net"][k]).max()) for k in a["net"]),
                    )
                    steps += int(b["steps"].sum())
                    max_steps += int(b["steps"].max())
    loop, batched = tl.sum(1).min(), tb.sum(1).min()
    n_inst = 5 * np.concatenate(cuts)
    print(
        f"model={args.model} clients per cohort={args.clients} cohorts={len(problems)} clients={len(n_inst)} "
        f"local instances: mean {n_inst.mean():.0f}, max {n_inst.max()}"
    )
    print(
        f"Adam steps: per-client loop {steps}, batched {max_steps} (the longest client of each cohort); "
        f"bound of the ratio at equal step cost {steps / max_steps:.1f}"
    )
    print(f"per-client loop: {loop:.3f} s   batched: {batched:.3f} s   (best of {args.repeats} totals)")
    print(f"speed-up (loop / batched): {loop / batched:.1f}x   max |difference| of the trained parameters: {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
