"""Seconds per phase and epoch, FedMVMF vs PrivMVMF (PrivMVMF paper Table 5).

Phases (PrivMVMF paper §6.3 "Efficiency"):

- local update: the clients' u-update and gradients (``privaudit.models.mvmf`` client kernels)
  plus, for PrivMVMF, fixed-point encoding, packing and the online part of Paillier encryption
  (one product per ciphertext); reported per user (total / number of clients), as in the paper;
- offline: the Paillier obfuscators (``r^n`` or DJN's ``h_s^r``), which do not depend on the
  data and can be computed before the round; reported beside the online phases;
- aggregation: the server's sum (plain sum / ciphertext products), decryption excluded;
- decryption: the decrypting clients (slowest decryptor; they work in parallel);
- server update: the item server's Q step and its part of V's gradient, and the Adam steps.

The protocol code is not modified: the benchmark wraps the model kernels and
:meth:`Channel.sum` with timers, and reads the ``paillier`` defense's own timings. Both
protocols run from the same seed with the same ``sampling`` defense. With ``--jobs 1``
(default) encryption runs in the process so that "per user" is one client's cost, and every
time is process CPU time (``time.process_time``), so a busy shared machine does not inflate
it; with ``--jobs N`` the obfuscators and decryptions run in N joblib workers and every time is
wall time. "whole epoch" includes the per-epoch bookkeeping outside the phases (loss
evaluation); "online epoch" is the whole epoch minus the offline phase. The utility metrics of
both runs are printed with their largest absolute difference (the lossless claim).

    python benchmarks/privmvmf_phases.py [--data PATH] [--users 30] [--epochs 2] [--key-length 2048] [--decryptors 1]
        [--obfuscation djn] [--jobs 1]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections import defaultdict

import numpy as np
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

from privaudit.data import load_dataset, synthetic
from privaudit.defenses.paillier import MIN_KEY_LENGTH
from privaudit.models import mvmf
from privaudit.protocols import base as protocol_base
from privaudit.registry import get

ML100K = ml100k_dir()
LOCAL = (
    "normal_equations",
    "solve_users",
    "sgd_users",
    "entry_coefficients",
    "dense_coefficients",
    "grad_V_rows",
    "grad_P",
)
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
    global CLOCK
    if any(d.name == "paillier" and d.config["jobs"] != 1 for d in defenses):
        CLOCK = time.perf_counter  # work in joblib workers: process CPU time would miss it
    with Timers() as timers:
        for d in defenses:
            if d.name == "paillier":
                d.clock = CLOCK
        t0 = CLOCK()
        res = get("protocol", protocol)().run(ds, cfg, defenses, rng=seed)
        wall = CLOCK() - t0
    he = next((d for d in defenses if d.name == "paillier"), None)
    enc = dec = dec_total = offline = 0.0
    if he is not None:
        offline = sum(t.get("offline", 0.0) for t in he.timings.values())
        enc = sum(t.get("encrypt", 0.0) for t in he.timings.values())
        dec = sum(t.get("decrypt", 0.0) for t in he.timings.values())
        dec_total = sum(t.get("decrypt_total", 0.0) for t in he.timings.values())
    E = cfg["epochs"]
    n = res.transcript.config["n_users"]
    return {
        "local_per_user": (timers.seconds["local"] + enc) / E / n,
        "local_total": (timers.seconds["local"] + enc) / E,
        "aggregation": (timers.seconds["sum"] - dec_total) / E,
        "offline": offline / E if he is not None else float("nan"),
        "decryption": dec / E if he is not None else float("nan"),
        "server_update": timers.seconds["server"] / E,
        "wall_per_epoch": wall / E,
        "online_per_epoch": (wall - offline) / E,
        "users": n,
        "ciphertexts_per_epoch": sum(c.get("encrypted", 0) for c in he.ciphertext_counts.values()) / E if he else 0,
        "utility": res.utility,
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
    ap.add_argument("--obfuscation", default="djn", choices=("djn", "standard"))
    ap.add_argument("--jobs", type=int, default=1, help="joblib workers for obfuscators and decryption (1: in process)")
    args = ap.parse_args(argv)
    if args.key_length < MIN_KEY_LENGTH:
        print(f"key_length {args.key_length} < {MIN_KEY_LENGTH}: INSECURE test key (timing only)")
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
        [
            sampling(rho=args.rho),
            paillier(
                key_length=args.key_length,
                decryptors=args.decryptors,
                packing=args.packing,
                obfuscation=args.obfuscation,
                jobs=args.jobs,
                insecure_test_key=args.key_length < MIN_KEY_LENGTH,
            ),
        ],
        args.seed,
    )
    print(
        f"data={ds.summary()['name']} training clients={fed['users']} epochs={args.epochs} rho={args.rho} "
        f"key_length={args.key_length} decryptors={args.decryptors} packing={args.packing} "
        f"obfuscation={args.obfuscation} jobs={args.jobs} ciphertexts/epoch={priv['ciphertexts_per_epoch']:.0f}"
    )
    unit = "CPU" if CLOCK is time.process_time else "wall"
    print(f"{unit + ' seconds per epoch':28s} {'FedMVMF':>12s} {'PrivMVMF':>12s}")
    rows = [
        ("local update (per user)", "local_per_user"),
        ("local update (all users)", "local_total"),
        ("aggregation", "aggregation"),
        ("decryption", "decryption"),
        ("server update", "server_update"),
        ("offline (obfuscators)", "offline"),
        ("online epoch", "online_per_epoch"),
        ("whole epoch", "wall_per_epoch"),
    ]
    for label, key in rows:
        a = "/" if key in ("decryption", "offline") else f"{fed[key]:12.4g}"
        print(f"{label:28s} {a:>12s} {priv[key]:12.4g}")
    worst = 0.0
    print(f"\n{'utility':28s} {'FedMVMF':>12s} {'PrivMVMF':>12s} {'|diff|':>10s}")
    for key, a in fed["utility"].items():
        if key in ("epoch_seconds",) or not isinstance(a, float):
            continue
        b = priv["utility"][key]
        diff = abs(b - a)
        if key != "train_loss":
            worst = max(worst, diff)
        print(f"{key:28s} {a:12.6f} {b:12.6f} {diff:10.2e}")
    print(f"largest |difference| of a ranking metric: {worst:.2e} (lossless: <= 1e-4: {worst <= 1e-4})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
