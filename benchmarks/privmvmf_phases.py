"""Seconds per phase and epoch, FedMVMF vs PrivMVMF (privmvmf.txt Table 5).

Phases (privmvmf.txt §6.3 "Efficiency"):

- local update: the clients' u-update and gradients (``privaudit.models.mvmf`` client kernels)
  plus, for PrivMVMF, fixed-point encoding, packing and Paillier encryption; reported per user
  (total / number of clients), as in the paper;
- aggregation: the server's sum (plain sum / ciphertext products), decryption excluded;
- decryption: the decrypting clients (slowest decryptor; they work in parallel);
- server update: the item server's Q step and its part of V's gradient, and the Adam steps.

The protocol code is not modified: the benchmark wraps the model kernels and
:meth:`Channel.sum` with timers, and reads the ``paillier`` defense's own timings. Both
protocols run from the same seed with the same ``sampling`` defense. Encryption runs in the
process (``jobs=1``) so that "per user" is one client's cost, and every time is process CPU
time (``time.process_time``), so a busy shared machine does not inflate it; "whole epoch"
includes the per-epoch bookkeeping outside the four phases (loss evaluation).

    python benchmarks/privmvmf_phases.py [--data PATH] [--users 30] [--epochs 2] [--key-length 2048] [--decryptors 1]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections import defaultdict

import numpy as np

from privaudit.data import load_dataset, synthetic
from privaudit.models import mvmf
from privaudit.protocols import base as protocol_base
from privaudit.registry import get
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

ML100K = ml100k_dir()
LOCAL = ("normal_equations", "solve_users", "sgd_users", "entry_coefficients", "dense_coefficients", "grad_V_rows", "grad_P")
SERVER = ("solve_Q", "grad_Q", "item_grad_V")
#: process CPU time: insensitive to other jobs on a shared machine (encryption runs in process)
CLOCK = time.process_time


class Timers:
    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self._saved: list = []

    def wrap(self, owner, name: str, phase: str) -> None:
        if not hasattr(owner, name):
            return
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*a, **k):
            t0 = CLOCK()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[phase] += CLOCK() - t0

        self._saved.append((owner, name, fn))
        setattr(owner, name, timed)

    def __enter__(self):
        for name in LOCAL:
            self.wrap(mvmf, name, "local")
        for name in SERVER:
            self.wrap(mvmf, name, "server")
        self.wrap(mvmf.Adam, "step", "server")
        self.wrap(protocol_base.Channel, "sum", "sum")
        return self

    def __exit__(self, *exc):
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)


def phases(protocol: str, ds, cfg, defenses, seed):
    with Timers() as timers:
        for d in defenses:
            if d.name == "paillier":
                d.clock = CLOCK
        t0 = CLOCK()
        res = get("protocol", protocol)().run(ds, cfg, defenses, rng=seed)
        wall = CLOCK() - t0
    he = next((d for d in defenses if d.name == "paillier"), None)
    enc = dec = dec_total = 0.0
    if he is not None:
        enc = sum(t.get("encrypt", 0.0) for t in he.timings.values())
        dec = sum(t.get("decrypt", 0.0) for t in he.timings.values())
        dec_total = sum(t.get("decrypt_total", 0.0) for t in he.timings.values())
    E = cfg["epochs"]
    n = res.transcript.config["n_users"]
    return {
        "local_per_user": (timers.seconds["local"] + enc) / E / n,
        "local_total": (timers.seconds["local"] + enc) / E,
        "aggregation": (timers.seconds["sum"] - dec_total) / E,
        "decryption": dec / E if he is not None else float("nan"),
        "server_update": timers.seconds["server"] / E,
        "wall_per_epoch": wall / E,
        "users": n,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ML100K) if ML100K.exists() else "synthetic")
    ap.add_argument("--users", type=int, default=30, help="subsample this many users (0: all)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--key-length", type=int, default=2048)
    ap.add_argument("--decryptors", type=int, default=1)
    ap.add_argument("--rho", type=float, default=1.0)
    ap.add_argument("--packing", default="true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ds = synthetic() if args.data == "synthetic" else load_dataset(args.data)
    if args.users:
        idx = np.sort(np.random.default_rng(args.seed).choice(ds.n_users, min(args.users, ds.n_users), replace=False))
        ds = ds.subset_users(idx)
    cfg = {"epochs": args.epochs, "update": "semials", "record_rounds": 0}
    sampling = get("defense", "sampling")
    paillier = get("defense", "paillier")
    fed = phases("fedmvmf", ds, cfg, [sampling(rho=args.rho)], args.seed)
    priv = phases(
        "privmvmf",
        ds,
        cfg,
        [sampling(rho=args.rho), paillier(key_length=args.key_length, decryptors=args.decryptors, packing=args.packing)],
        args.seed,
    )
    print(
        f"data={ds.summary()['name']} training clients={fed['users']} epochs={args.epochs} rho={args.rho} "
        f"key_length={args.key_length} decryptors={args.decryptors} packing={args.packing}"
    )
    print(f"{'CPU seconds per epoch':28s} {'FedMVMF':>12s} {'PrivMVMF':>12s}")
    rows = [
        ("local update (per user)", "local_per_user"),
        ("local update (all users)", "local_total"),
        ("aggregation", "aggregation"),
        ("decryption", "decryption"),
        ("server update", "server_update"),
        ("whole epoch", "wall_per_epoch"),
    ]
    for label, key in rows:
        a = "/" if key == "decryption" else f"{fed[key]:12.4g}"
        print(f"{label:28s} {a:>12s} {priv[key]:12.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
