"""Tables and quick checks of the FedNCF paper (NCF, FedNCF with secure aggregation) for ``benchmarks/reproduce.py fedncf``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from reproduce_common import Check, Context, md_table, script_table


def _ncf_eval_setup(ds, seed: int):
    from privaudit.protocols.fedncf import _exclusion, eval_candidates, implicit_split, rng_streams

    streams = rng_streams(seed)
    pos, test_item = implicit_split(ds, streams["split"], "random")
    eval_users, cand = eval_candidates(pos, test_item, ds.n_items, 100, streams["eval"])
    return pos, test_item, eval_users, cand, _exclusion(pos, test_item, ds.n_items)


def central_ncf(ds, model: str, epochs: int, seed: int = 0) -> dict:
    """Centralised NCF as ``fedncf_ml100k.py central`` (batch 256, embeddings N(0, 0.01^2))."""
    from privaudit.models import ncf
    from privaudit.protocols.fedncf import ncf_utility

    pos, test_item, eval_users, cand, excl = _ncf_eval_setup(ds, seed)
    layers = [48, 24, 12, 6]
    with ncf.single_thread():
        mdl = ncf.train_centralized(
            model,
            12,
            layers,
            pos,
            ds.n_users,
            ds.n_items,
            epochs,
            256,
            4,
            1e-3,
            np.random.default_rng(seed),
            exclude=excl,
            init_std=ncf.EMBED_STD,
        )
    return ncf_utility(model, 12, layers, mdl, eval_users, cand, 10)


def fed_ncf(ds, model: str, global_rounds: int, seed: int = 0, **cfg: Any) -> dict:
    from privaudit.protocols.fedncf import FedNCF

    # the paper's learning rate (the protocol's default 0.01 is tuned for short first runs)
    res = FedNCF().run(
        ds, {"model": model, "global_rounds": global_rounds, "record_rounds": 0, "lr": 1e-3, **cfg}, [], seed
    )
    return res.utility


def popularity_hr(ds, seed: int = 0) -> float:
    """HR@10 of ranking the 101 candidates by training popularity (the strongest trivial baseline)."""
    pos, _, eval_users, cand, _ = _ncf_eval_setup(ds, seed)
    pop = np.asarray(pos.sum(axis=0)).ravel()
    scores = pop[cand] + 1e-9 * np.random.default_rng(seed).random(cand.shape)  # random tie-break
    rank = (scores[:, 1:] > scores[:, :1]).sum(axis=1)
    return float(np.mean(rank < 10))


def user_fraction(ds, fraction: float, seed: int):
    """A random ``fraction`` of the users, items left without interactions removed (FedNCF paper §4.7)."""
    if fraction >= 1.0:
        return ds
    rng = np.random.default_rng(1000 + seed)
    users = np.sort(rng.choice(ds.n_users, int(round(fraction * ds.n_users)), replace=False))
    sub = ds.subset_users(users)
    keep = np.flatnonzero(np.diff(sub.ratings.tocsc().indptr) > 0)
    return sub.subset_items(keep)


def t_fedncf_fraction(
    ctx: Context, fractions=(1.0, 0.9, 0.8, 0.7, 0.5), seeds=(0,), global_rounds: int = 50, epochs: int = 20
) -> str:
    """python benchmarks/reproduce.py fedncf --table fraction"""
    ds = ctx.dataset()
    fractions = tuple(float(f) for f in np.atleast_1d(fractions))
    seeds = tuple(int(s) for s in np.atleast_1d(seeds))
    rows = []
    for f in fractions:
        c, fd = [], []
        for s in seeds:
            sub = user_fraction(ds, f, s)
            c.append(central_ncf(sub, "gmf", epochs, s))
            fd.append(fed_ncf(sub, "gmf", global_rounds, s))
            print(
                json.dumps(
                    {"fraction": f, "seed": s, "central": c[-1], "fed": {k: fd[-1][k] for k in ("hr@10", "ndcg@10")}}
                ),
                flush=True,
            )
        rows.append(
            [
                f,
                sub.n_users,
                sub.n_items,
                np.mean([x["hr@10"] for x in c]),
                np.mean([x["ndcg@10"] for x in c]),
                np.mean([x["hr@10"] for x in fd]),
                np.mean([x["ndcg@10"] for x in fd]),
            ]
        )
    base = rows[0]
    for r in rows:
        r += [f"{100 * (r[3] / base[3] - 1):+.1f} %", f"{100 * (r[5] / base[5] - 1):+.1f} %"]
    return md_table(
        [
            "fraction of users",
            "users",
            "items",
            f"central GMF HR@10 ({epochs} epochs)",
            "NDCG@10",
            f"FedGMF HR@10 ({global_rounds} global rounds)",
            "NDCG@10",
            "central change",
            "federated change",
        ],
        rows,
    )


def secagg_overhead(
    ds, model: str, cohort: int, dropout: float, rounds: int = 10, seed: int = 0, repeats: int = 3
) -> dict:
    """CPU seconds per aggregation round of FedNCF with ``secagg`` minus the same run without it.

    The first ``rounds`` aggregation rounds of a run (``max_rounds``), same seed with and without
    the defense (so the same cohorts and training); the fastest of ``repeats`` alternated runs.
    """
    from privaudit.defenses.secagg import SecAgg
    from privaudit.protocols.fedncf import FedNCF

    cfg = {
        "model": model,
        "global_rounds": 1,
        "max_rounds": rounds,
        "clients_per_round": cohort,
        "record_rounds": 0,
        "lr": 1e-3,
    }
    FedNCF().run(
        ds, {**cfg, "global_rounds": 1, "max_rounds": 2}, [SecAgg(dropout=dropout)], seed
    )  # warm-up (imports, torch)
    out = {"plain": np.inf, "secagg": np.inf}
    for _ in range(repeats):  # alternate the two, keep the fastest of each (CPU time; the machine may be shared)
        for name, defs in (("plain", []), ("secagg", [SecAgg(dropout=dropout)])):
            t0 = time.process_time()
            res = FedNCF().run(ds, cfg, defs, seed)
            out[name] = min(out[name], time.process_time() - t0)
            out["rounds"] = res.utility["rounds"]
    per_round = (out["secagg"] - out["plain"]) / out["rounds"]
    return {
        "model": model,
        "cohort": cohort,
        "dropout": dropout,
        "rounds": out["rounds"],
        "plain_s_per_round": out["plain"] / out["rounds"],
        "overhead_s_per_round": per_round,
        "overhead_ms_per_participant": 1000 * per_round / cohort,
    }


#: (model, cohort size, dropout fraction) points of the MF-SecAvg overhead table
SECAGG_GRID = "gmf:20:0,neumf:20:0,gmf:10:0,gmf:50:0,gmf:100:0,gmf:20:0.1,gmf:20:0.3,neumf:50:0"


def t_fedncf_secagg(ctx: Context, repeats: int = 3, rounds: int = 10, grid: str = SECAGG_GRID) -> str:
    """python benchmarks/reproduce.py fedncf --table secagg-overhead"""
    ds = ctx.dataset()
    rows = []
    grid = [(m, int(c), float(d)) for m, c, d in (g.split(":") for g in grid.split(","))]
    paper = {("gmf", 20, 0.0): "3 ms", ("neumf", 20, 0.0): "7 ms"}
    for model, c, d in grid:
        r = secagg_overhead(ds, model, c, d, rounds=rounds, repeats=repeats)
        print(json.dumps(r), flush=True)
        rows.append(
            [
                model,
                c,
                d,
                r["rounds"],
                f"{1000 * r['plain_s_per_round']:.0f}",
                f"{1000 * r['overhead_s_per_round']:.0f}",
                f"{r['overhead_ms_per_participant']:.1f}",
                paper.get((model, c, d), ""),
            ]
        )
    return md_table(
        [
            "model",
            "cohort c",
            "dropout",
            "aggregation rounds",
            "plain MF-FedAvg ms / round (CPU)",
            "MF-SecAvg extra ms / round (CPU)",
            "extra ms per participant",
            "paper (Table 8, per participant)",
        ],
        rows,
    )


def t_fedncf_t6(ctx: Context, global_rounds: int = 400, models: str = "gmf,mlp,neumf", central: bool = True) -> str:
    """python benchmarks/reproduce.py fedncf --table table6"""
    ds = ctx.dataset()
    paper = {
        ("fed", "gmf"): (0.59, 0.33),
        ("fed", "mlp"): (0.43, 0.23),
        ("fed", "neumf"): (0.61, 0.34),
        ("central", "gmf"): (0.68, 0.42),
        ("central", "mlp"): (0.61, 0.35),
        ("central", "neumf"): (0.69, 0.42),
    }
    rows = []
    for model in models.split(","):
        u = fed_ncf(ds, model, global_rounds)
        print(json.dumps({"model": model, **u}), flush=True)
        rows.append(
            [
                f"Fed{model.upper() if model != 'neumf' else 'NeuMF'} ({global_rounds} global rounds)",
                u["hr@10"],
                u["ndcg@10"],
                *paper[("fed", model)],
            ]
        )
    for model, ep in (("gmf", 20), ("mlp", 20), ("neumf", 12)) if central else ():
        u = central_ncf(ds, model, ep)
        rows.append(
            [
                f"{model.upper() if model != 'neumf' else 'NeuMF'} centralised ({ep} epochs)",
                u["hr@10"],
                u["ndcg@10"],
                *paper[("central", model)],
            ]
        )
    return md_table(["model", "HR@10 (ours)", "NDCG@10 (ours)", "HR@10 (paper)", "NDCG@10 (paper)"], rows)


def q_fedncf(ctx: Context) -> list[Check]:
    from privaudit.data import synthetic
    from privaudit.defenses.secagg import SecAgg
    from privaudit.protocols.fedncf import FedNCF

    ds = ctx.dataset()
    u = central_ncf(ds, "gmf", 20)
    pop = popularity_hr(ds)
    checks = [
        Check("fedncf", "centralised GMF, 20 epochs, seed 0: HR@10 (docs 0.664; paper 0.68)", u["hr@10"], 0.664, 0.01),
        Check("fedncf", "  ... NDCG@10 (docs 0.384)", u["ndcg@10"], 0.384, 0.01),
        Check("fedncf", "popularity ranker HR@10, seed 0 (training counts; 0.408)", pop, 0.408, 0.005),
        Check("fedncf", "centralised GMF HR@10 minus popularity HR@10", u["hr@10"] - pop, 0.2, 0.0, "min"),
    ]
    syn = synthetic(n_users=40, n_items=60, seed=0)
    cfg = {"global_rounds": 2, "clients_per_round": 10, "record_rounds": 0}
    plain = FedNCF().run(syn, cfg, [], 0).model
    masked = FedNCF().run(syn, cfg, [SecAgg()], 0).model
    diff = float(np.max(np.abs(np.asarray(plain["items"]) - np.asarray(masked["items"]))))
    checks.append(
        Check(
            "fedncf",
            "MF-SecAvg vs plain MF-FedAvg, synthetic: max |item table difference| (docs: to 1e-6)",
            diff,
            0.0,
            1e-6,
            "max",
        )
    )
    return checks


#: Tables of ``reproduce.py fedncf`` by name (each returns Markdown).
TABLES: dict[str, Callable[[Context], str]] = {
    "central": script_table("fedncf_ml100k.py", "central", "--model", "gmf", "--epochs", "20"),
    "table5": script_table(
        "fedncf_ml100k.py",
        "fed",
        "--model",
        "gmf",
        "--aggregation",
        "mf-fedavg",
        "--global-rounds",
        "400",
        "--eval-every",
        "25",
    ),
    "table6": t_fedncf_t6,
    "fraction": t_fedncf_fraction,
    "secagg-overhead": t_fedncf_secagg,
    "dp": script_table("fedncf_dp.py", data_flag=None),
    "linking": script_table("fedncf_linking.py", data_flag=None),
}

#: Quick checks of ``reproduce.py fedncf --quick``.
QUICK = q_fedncf
