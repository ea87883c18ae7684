"""Tables and quick checks of the FedProto (prototype membership) for ``benchmarks/reproduce.py fedproto``."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np
from reproduce_common import BENCH, Check, Context, script_table


def q_fedproto(ctx: Context) -> list[Check]:
    """proto-membership on the ML-100K ZIP silos, the same draws as ``fedproto_compare.py --part ml`` seed 0."""
    sys.path.insert(0, str(BENCH))
    from fedproto_compare import membership_auc, silo_prototypes

    from privaudit.data import zip_silos
    from privaudit.protocols.fedproto import split_test_users

    ds = ctx.dataset()
    rng = np.random.default_rng(0)
    train, _ = split_test_users(ds.ratings, 0.2, 5, rng)
    silos = [np.asarray(s, dtype=np.int64) for s in zip_silos(ds) if len(s)]
    Xd = train.toarray()
    auc = {}
    for kind, eps in (("exact", None), ("dp", 1.0)):  # the benchmark draws random and dp 0.1 in between
        t0 = time.perf_counter()
        protos = silo_prototypes(kind, Xd, silos, 50, rng, eps, 50, ds.rating_max, 10, 0)
        auc[(kind, eps)] = membership_auc(train, silos, protos, 0)["auc"]
        print(f"fedproto quick: {kind} prototypes {time.perf_counter() - t0:.0f} s", flush=True)
    return [
        Check(
            "fedproto", "proto-membership AUC, exact k-means prototypes (docs 0.867)", auc[("exact", None)], 0.867, 0.01
        ),
        Check(
            "fedproto",
            "proto-membership AUC, DP prototypes eps = 1 (docs 0.492, other draws; baseline 0.5)",
            auc[("dp", 1.0)],
            0.5,
            0.05,
        ),
    ]


#: Tables of ``reproduce.py fedproto`` by name (each returns Markdown).
TABLES: dict[str, Callable[[Context], str]] = {
    "ml": script_table("fedproto_compare.py", "--part", "ml", "--seeds", "1", "--swap-iters", "10", data_flag=None),
    "poisson": script_table(
        "fedproto_compare.py",
        "--part",
        "poisson",
        "--seeds",
        "1",
        "--poisson-items",
        "100",
        "--poisson-eps",
        "0.01",
        "1",
        "--swap-iters",
        "10",
        data_flag=None,
    ),
    "noise": script_table("fedproto_noise.py", "--configs", "50:5:1:10,50:5:1:100,50:5:1:1000", data_flag=None),
}

#: Quick checks of ``reproduce.py fedproto --quick``.
QUICK = q_fedproto
