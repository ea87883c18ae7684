"""Tables and quick checks of the FedSPLIT paper (CNMF groups) for ``benchmarks/reproduce.py fedsplit``."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from reproduce_common import Check, Context, md_table, script_table


def q_fedsplit(ctx: Context) -> list[Check]:
    from privaudit.protocols.fedsplit import FedSPLIT

    u = FedSPLIT().run(ctx.dataset(), {"centralized": False}, (), 0).utility
    return [
        Check("fedsplit", "seed 0: groups (docs 55)", u["n_groups"], 55, 0),
        Check("fedsplit", "seed 0: fraction of groups improved (docs 100 %)", u["improved_fraction"], 1.0, 0.0),
        Check("fedsplit", "seed 0: local CNMF RMSE (docs 1.111)", u["rmse_local"], 1.111, 0.002),
        Check("fedsplit", "seed 0: FedSPLIT RMSE (docs 0.992)", u["rmse_fedsplit"], 0.992, 0.002),
        Check("fedsplit", "seed 0: RMSE drop (target >= 0.1)", u["rmse_drop"], 0.1, 0.0, "min"),
    ]


def pearson_columns(n_users: np.ndarray, n_ratings: np.ndarray, rmse_local: np.ndarray, rmse_fed: np.ndarray) -> dict:
    """Pearson r of group members / ratings with the group's RMSE change (FedSPLIT - local) and FedSPLIT RMSE."""
    from scipy.stats import pearsonr

    ok = np.isfinite(rmse_local) & np.isfinite(rmse_fed)
    d = rmse_fed[ok] - rmse_local[ok]
    return {
        "members_change": float(pearsonr(n_users[ok], d)[0]),
        "ratings_change": float(pearsonr(n_ratings[ok], d)[0]),
        "members_rmse": float(pearsonr(n_users[ok], rmse_fed[ok])[0]),
        "ratings_rmse": float(pearsonr(n_ratings[ok], rmse_fed[ok])[0]),
    }


def fedsplit_summary(label: str, per_group: list[tuple], central: list[float]) -> list[Any]:
    """One Markdown row from per-grouping (n_users, n_ratings, rmse_local, rmse_fed) arrays."""
    from privaudit.metrics import mean_ci95

    nu, nr, lo, fe = (np.concatenate([g[i] for g in per_group]) for i in range(4))
    ok = np.isfinite(lo) & np.isfinite(fe)
    nu, nr, lo, fe = nu[ok], nr[ok], lo[ok], fe[ok]
    lm, lc = mean_ci95(lo)
    fm, fc = mean_ci95(fe)
    better = fe < lo
    worse = ~better
    p = pearson_columns(nu, nr, lo, fe)
    cm, cc = mean_ci95(central) if central else (float("nan"), float("nan"))
    return [
        label,
        len(per_group),
        int(lo.size),
        f"{int(better.sum())} ({better.mean():.1%})",
        f"{lm:.3f} ± {lc:.3f}",
        f"{fm:.3f} ± {fc:.3f}",
        f"{-(lo[better] - fe[better]).mean():.3f}",
        f"{(fe[worse] - lo[worse]).mean():.3f}" if worse.any() else "-",
        f"{p['members_change']:.2f} / {p['members_rmse']:.2f}",
        f"{p['ratings_change']:.2f} / {p['ratings_rmse']:.2f}",
        f"{cm:.3f} ± {cc:.3f}" if central else "-",
    ]


FEDSPLIT_HEADER = [
    "setting",
    "groupings",
    "groups",
    "improved",
    "local CNMF RMSE",
    "FedSPLIT RMSE",
    "mean change, improved groups",
    "mean rise, worse groups",
    "Pearson members vs change / vs FedSPLIT RMSE",
    "Pearson ratings vs change / vs FedSPLIT RMSE",
    "non-private CNMF",
]
FEDSPLIT_PAPER = [
    "paper (Table 2-3, ML-100K variant)",
    10,
    365,
    "359 (98.4 %)",
    "1.00 ± 0.022",
    "0.78 ± 0.016",
    "-0.22",
    "0.07",
    "-0.06 (column 'Members-RMSE')",
    "-0.11 (column 'Ratings-RMSE')",
    "0.71 ± 0.006",
]


def filtered(ds, min_ratings: int = 20):
    from privaudit.data.splits import filter_min_ratings

    return filter_min_ratings(ds, min_user=min_ratings, min_item=min_ratings)


def t_fedsplit_untuned(ctx: Context, groupings: int = 10, filter20: bool = False) -> str:
    from privaudit.protocols.fedsplit import FedSPLIT

    ds = ctx.dataset()
    if filter20:
        ds = filtered(ds)
    per_group, central = [], []
    for s in range(groupings):
        res = FedSPLIT().run(ds, {}, (), s)
        m = res.model
        per_group.append(
            (m["n_users"].astype(float), m["n_ratings"].astype(float), m["rmse_local"], m["rmse_fedsplit"])
        )
        central.append(res.utility["rmse_central"])
        print(f"grouping {s}: {res.utility['rmse_local']:.3f} -> {res.utility['rmse_fedsplit']:.3f}", flush=True)
    label = (
        f"untuned{', >= 20 ratings' if filter20 else ''} "
        f"({ds.n_users} users, {ds.n_items} items, {ds.n_ratings} ratings)"
    )
    return md_table(FEDSPLIT_HEADER, [fedsplit_summary(label, per_group, central), FEDSPLIT_PAPER])


def t_fedsplit_pearson(ctx: Context, groupings: int = 10) -> str:
    """python benchmarks/reproduce.py fedsplit --table untuned"""
    return t_fedsplit_untuned(ctx, groupings, False)


def t_fedsplit_filter(ctx: Context, groupings: int = 10) -> str:
    """python benchmarks/reproduce.py fedsplit --table filter20"""
    return t_fedsplit_untuned(ctx, groupings, True)


#: the paper's per-group search space (FedSPLIT paper §4.1), log-uniform except k
TUNE_SPACE = {
    "alpha": (0.04, 0.08),
    "beta": (0.04, 0.08),
    "gamma": (0.01, 0.04),
    "delta": (0.01, 0.04),
    "eta_W": (0.002, 0.009),
    "eta_H": (0.002, 0.009),
}


def tune_group(
    X, mu: float, n_users: int, trials: int, seed: int, n_iter: int = 100, val_fraction: float = 0.2
) -> dict:
    """Optuna TPE over the paper's search space on one group's training ratings X (n^g x m sparse).

    Objective: RMSE on a random ``val_fraction`` of X's ratings, the model fitted on the rest
    (every row keeps at least one training rating). Returns the best parameters (with ``k``).
    """
    import optuna
    import scipy.sparse as sp

    from privaudit.models.cnmf import CNMF, observed

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _, rows, cols, vals = observed(X)
    rng = np.random.default_rng(seed)
    val = rng.random(vals.size) < val_fraction
    first = np.unique(rows, return_index=True)[1]
    val[first] = False  # keep one training rating per user
    shape = X.shape
    Xtr = sp.csr_matrix((vals[~val], (rows[~val], cols[~val])), shape=shape)
    k_max = max(2, min(n_users, 21) - 1)

    def objective(trial):
        params = {name: trial.suggest_float(name, lo, hi, log=True) for name, (lo, hi) in TUNE_SPACE.items()}
        k = trial.suggest_int("k", 2, k_max) if k_max > 2 else 2
        model = CNMF(n_components=k, n_iter=n_iter, init_high=0.1, **params).fit(Xtr, mu=mu, rng=seed)
        if not val.any():
            return 0.0
        pred = model.predict(rows[val], cols[val])
        return float(np.sqrt(np.mean((pred - vals[val]) ** 2)))

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.optimize(objective, n_trials=trials)
    best = dict(study.best_params)
    best.setdefault("k", 2)
    return best


def fedsplit_tuned_run(ds, seed: int, trials: int, final_iter: int = 500, K: int = 20) -> tuple:
    """FedSPLIT with each group's CNMF tuned by Optuna (the protocol's pipeline, per-group hyperparameters).

    Same split, grouping, global mean and server NMF as ``FedSPLIT().run(ds, {}, (), seed)``;
    returns (n_users, n_ratings, rmse_local, rmse_fedsplit) per group.
    """
    import scipy.sparse as sp

    from privaudit.data import holdout_split, random_groups
    from privaudit.models.cnmf import CNMF, observed
    from privaudit.protocols.fedsplit import FedSPLIT, _joint_nmf

    cfg = FedSPLIT.resolve_config({})
    split_rng, group_rng, init_rng, _channel_rng, server_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)
    )
    n, m = ds.ratings.shape
    train, test = holdout_split(ds, cfg["test_fraction"], split_rng)
    groups = [np.asarray(g, dtype=np.int64) for g in random_groups(ds, cfg["group_min"], cfg["group_max"], group_rng)]
    Xtr = sp.csr_matrix(train.ratings)
    Xte = sp.csr_matrix(test.ratings)
    mus = [float(Xtr[g].sum() / max(Xtr[g].nnz, 1)) for g in groups]
    mu = float(np.mean(mus))  # eq. 14 (global_mean="groups")
    models, H_T, b_H, ranks = [], [], [], []
    for gi, g in enumerate(groups):
        p = tune_group(Xtr[g], mu, g.size, trials, seed * 1000 + gi)
        k = int(p.pop("k"))
        model = CNMF(n_components=k, n_iter=final_iter, init_high=cfg["init_high"], **p).fit(
            Xtr[g], mu=mu, rng=init_rng
        )
        models.append(model)
        H_T.append(model.H_.T)
        b_H.append(model.b_H_)
        ranks.append(k)
    X_server = np.maximum(np.hstack(H_T), 0.0)
    b_H_global = np.mean(b_H, axis=0)
    offsets = np.concatenate(([0], np.cumsum(ranks)))
    W_global, H_global = _joint_nmf(X_server, K, cfg["server_max_iter"], int(server_rng.integers(2**31)))
    nu, nr, lo, fe = [], [], [], []
    for gi, (g, model) in enumerate(zip(groups, models)):
        _, r, c, v = observed(Xte[g])
        local = model.predict(r, c)
        W_star = model.W_ @ H_global[:, offsets[gi] : offsets[gi + 1]].T  # eq. 18
        fed = np.clip(
            np.einsum("nk,nk->n", W_star[r], W_global[c]) + model.b_W_[r] + b_H_global[c] + mu,
            ds.rating_min,
            ds.rating_max,
        )  # eq. 19
        nu.append(g.size)
        nr.append(Xtr[g].nnz)
        lo.append(np.sqrt(np.mean((local - v) ** 2)) if v.size else np.nan)
        fe.append(np.sqrt(np.mean((fed - v) ** 2)) if v.size else np.nan)
    return tuple(np.asarray(a, dtype=float) for a in (nu, nr, lo, fe))


def t_fedsplit_tuned(
    ctx: Context, groupings: int = 10, trials: int = 20, filter20: bool = True, final_iter: int = 500
) -> str:
    """python benchmarks/reproduce.py fedsplit --table tuned"""
    ds = ctx.dataset()
    if filter20:
        ds = filtered(ds)
    per_group = []
    for s in range(groupings):
        t0 = time.perf_counter()
        per_group.append(fedsplit_tuned_run(ds, s, trials, final_iter))
        lo, fe = per_group[-1][2], per_group[-1][3]
        print(
            f"grouping {s}: {np.nanmean(lo):.3f} -> {np.nanmean(fe):.3f} ({time.perf_counter() - t0:.0f} s)", flush=True
        )
        (ctx.out / "fedsplit_tuned_partial.json").write_text(json.dumps([[a.tolist() for a in g] for g in per_group]))
    label = (
        f"Optuna per group ({trials} TPE trials, one 80/20 validation split, {final_iter} final iterations)"
        f"{', >= 20 ratings' if filter20 else ''} ({ds.n_users} users, {ds.n_items} items)"
    )
    return md_table(FEDSPLIT_HEADER, [fedsplit_summary(label, per_group, []), FEDSPLIT_PAPER])


#: Tables of ``reproduce.py fedsplit`` by name (each returns Markdown).
TABLES: dict[str, Callable[[Context], str]] = {
    "groups": script_table("fedsplit_groups.py", "--seeds", "4", "--surprise"),
    "untuned": t_fedsplit_pearson,
    "filter20": t_fedsplit_filter,
    "tuned": t_fedsplit_tuned,
}

#: Quick checks of ``reproduce.py fedsplit --quick``.
QUICK = q_fedsplit
