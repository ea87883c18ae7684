"""Regenerate the tables of docs/reproduction.md from the code, paper by paper.

    python benchmarks/reproduce.py PAPER [--table NAME[,NAME...]] [--quick] [--out DIR] [--data DIR]

PAPER is one of ``privmvmf``, ``fedsplit``, ``fedncf``, ``fedproto``, ``fedrec`` or ``all``.
Without ``--quick`` every table of the paper (or the ones named by ``--table``; ``--list``
prints the names) is recomputed and written as Markdown to ``OUT/PAPER/NAME.md`` (figures beside
it); tables that an existing benchmark script produces are run through that script with the
arguments given in docs/reproduction.md (its output is the Markdown file). Full runs take from
seconds to hours per table; each table's cost is in its heading in docs/reproduction.md.

``--quick`` runs a subsampled check of every paper instead (a few minutes in total on 2 cores):
each check recomputes a figure the docs state and compares it with the stated value and
tolerance, writes ``OUT/quick.md`` and exits 1 after printing the failing rows if any check
fails.

MovieLens 100K (the folder holding ``u.data``) is found at ``--data``, else at
``$PRIVAUDIT_ML100K``, else at ``../shared/data/ml-100k`` next to the checkout (the other
benchmarks' default). A missing dataset is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "ml-100k"
PAPERS = ("privmvmf", "fedsplit", "fedncf", "fedproto", "fedrec")


# ---------------------------------------------------------------------------------------------
# helpers


@dataclass
class Check:
    """One quick check: ``value`` against the docs' ``target`` with ``tol``.

    ``kind``: ``"abs"`` (|value - target| <= tol), ``"min"`` (value >= target - tol) or
    ``"max"`` (value <= target + tol).
    """

    paper: str
    name: str
    value: float
    target: float
    tol: float
    kind: str = "abs"

    @property
    def ok(self) -> bool:
        v = float(self.value)
        if not np.isfinite(v):
            return False
        if self.kind == "abs":
            return abs(v - self.target) <= self.tol
        if self.kind == "min":
            return v >= self.target - self.tol
        return v <= self.target + self.tol

    def row(self) -> str:
        rel = {"abs": "=", "min": ">=", "max": "<="}[self.kind]
        return (
            f"| {self.paper} | {self.name} | {self.value:.5g} | {rel} {self.target:.5g} ± {self.tol:.3g} | "
            f"{'ok' if self.ok else '**FAIL**'} |"
        )


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    def fmt(x: Any) -> str:
        if isinstance(x, float):
            return f"{x:.4f}" if np.isfinite(x) else "n/a"
        return str(x)

    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
    return "\n".join(out)


def run_script(script: str, args: list[str], ctx: Context) -> str:
    """Run an existing benchmark script (same interpreter, this checkout first on the path) and return its stdout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(BENCH), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, str(BENCH / script), *args]
    print("$ " + " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd, env=env, cwd=str(ctx.out), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{script} failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def script_table(script: str, *args: str, data_flag: str | None = "--data") -> Callable[..., str]:
    def fn(ctx: Context) -> str:
        extra = [data_flag, str(ctx.data)] if data_flag else []
        return "```\n" + run_script(script, [*args, *extra], ctx) + "```\n"

    fn.__doc__ = f"python benchmarks/{script} {' '.join(args)}"
    return fn


@dataclass
class Context:
    data: Path
    out: Path
    jobs: int

    def dataset(self):
        from privaudit.data import load_dataset

        return load_dataset(self.data)


# ---------------------------------------------------------------------------------------------
# PrivMVMF paper: FedMVMF, mvmf-nonlinear, PrivMVMF

SCENARIOS = {
    "semials/obsonly": ("semials", "obsonly"),
    "semials/inclunc": ("semials", "inclunc"),
    "sgd/obsonly": ("sgd", "obsonly"),
    "sgd/inclunc": ("sgd", "inclunc"),
}


def fedmvmf_transcript(ds, update: str, unrated: str, b: float, epochs: int = 2, record_rounds: int = 2):
    """FedMVMF on its defaults except ``epochs`` (the attack reads rounds 0 and 1), Laplace b on every upload."""
    from privaudit.defenses.noise import LaplaceNoise
    from privaudit.protocols.fedmvmf import FedMVMF

    cfg = {"update": update, "unrated": unrated, "epochs": epochs, "record_rounds": record_rounds}
    return FedMVMF().run(ds, cfg, [LaplaceNoise(scale=b)] if b else [], rng=0).transcript


def nonlinear_points(
    ds, scenarios: list[str], scales: list[float], users: int | None, solves: int = 0, jobs: int = 1
) -> list[dict]:
    """mvmf-nonlinear on FedMVMF transcripts: one dict per (scenario, b) with accuracies and baselines."""
    from privaudit.attacks.mvmf_nonlinear import MVMFNonlinear

    out = []
    for sc in scenarios:
        update, unrated = SCENARIOS[sc]
        for b in scales:
            tr = fedmvmf_transcript(ds, update, unrated, b)
            t0 = time.perf_counter()
            res = MVMFNonlinear(users=users, solves=solves, jobs=jobs).evaluate(tr, np.random.default_rng(0))
            m, base = res.metrics, res.baseline
            out.append(
                {
                    "scenario": sc,
                    "b": b,
                    "solves": solves,
                    **{k: float(v) for k, v in m.items() if np.isscalar(v)},
                    "random_rating": float(base.get("rating_accuracy", np.nan)),
                    "random_attr": float(base.get("attribute_accuracy", np.nan)),
                    "majority_rating": float(base.get("rating_accuracy_majority", np.nan)),
                    "majority_attr": float(base.get("attribute_accuracy_majority", np.nan)),
                    "attack_s": time.perf_counter() - t0,
                }
            )
            print(json.dumps(out[-1]), flush=True)
    return out


def t_nonlinear_noisefree(ctx: Context) -> str:
    """python benchmarks/reproduce.py privmvmf --table nonlinear-noisefree"""
    pts = nonlinear_points(ctx.dataset(), list(SCENARIOS), [0.0], None, jobs=ctx.jobs)
    rows = [
        [
            p["scenario"],
            p["rating_accuracy"],
            p["attribute_accuracy"],
            p.get("rated_rating_accuracy", np.nan),
            f"{p['random_rating']:.3f} / {p['majority_rating']:.3f}; {p['random_attr']:.3f} / {p['majority_attr']:.3f}",
            f"{p['attack_s']:.0f}",
            "> 0.80 both",
        ]
        for p in pts
    ]
    return md_table(
        [
            "scenario",
            "rating acc.",
            "attribute acc.",
            "rated-item acc.",
            "random / majority baseline (rating; attr.)",
            "attack s",
            "paper's claim",
        ],
        rows,
    )


def t_nonlinear_laplace(ctx: Context) -> str:
    """python benchmarks/reproduce.py privmvmf --table nonlinear-laplace"""
    scales = [0.0001, 0.001, 0.01, 0.1, 0.5, 1.0]
    ds = ctx.dataset()
    pts = nonlinear_points(ds, list(SCENARIOS), scales, 40, jobs=ctx.jobs)
    five = nonlinear_points(ds, list(SCENARIOS), scales, 40, solves=5, jobs=ctx.jobs)
    rows = []
    for p, q in zip(pts, five):
        mr, ma = p["rating_accuracy"] - p["random_rating"], p["attribute_accuracy"] - p["random_attr"]
        holds = "(b > 0.5)" if p["b"] > 0.5 else ("yes" if min(mr, ma) > 0.30 else "**no**")
        rows.append(
            [
                p["scenario"],
                p["b"],
                "K" if p["solves"] == 0 else p["solves"],
                p["rating_accuracy"],
                p["attribute_accuracy"],
                p.get("rated_rating_accuracy", np.nan),
                f"{mr:+.2f}; {ma:+.2f}",
                holds,
                f"{q['rating_accuracy']:.3f} / {q['attribute_accuracy']:.3f}",
                f"{p['attack_s']:.0f}",
            ]
        )
    return md_table(
        [
            "scenario",
            "b",
            "solves",
            "rating acc.",
            "attribute acc.",
            "rated-item acc.",
            "margin over random (rating; attr.)",
            "claim (b <= 0.5) holds",
            "with 5 solves (rating / attr.)",
            "attack s",
        ],
        rows,
    )


def upload_magnitudes(ds, scenarios: list[str]) -> dict[str, dict[str, float]]:
    """RMS of every client's grad_V and grad_P uploads at round 0 (noise-free, FedMVMF defaults)."""
    out = {}
    for sc in scenarios:
        tr = fedmvmf_transcript(ds, *SCENARIOS[sc], 0.0, epochs=1, record_rounds=1)
        sq = {"grad_V": [0.0, 0], "grad_P": [0.0, 0]}
        for msg in tr.messages:
            if msg.round == 0 and msg.kind in sq and msg.receiver == "server":
                a = np.asarray(msg.payload["values"], dtype=np.float64)
                sq[msg.kind][0] += float(np.sum(a * a))
                sq[msg.kind][1] += a.size
        out[sc] = {k: float(np.sqrt(s / n)) if n else float("nan") for k, (s, n) in sq.items()}
    return out


def t_upload_magnitude(ctx: Context) -> str:
    """python benchmarks/reproduce.py privmvmf --table upload-magnitude"""
    mags = upload_magnitudes(ctx.dataset(), list(SCENARIOS))
    rows = [[sc, m["grad_V"], m["grad_P"]] for sc, m in mags.items()]
    return md_table(["scenario", "RMS grad_V (round 0)", "RMS grad_P (round 0)"], rows)


def q_privmvmf(ctx: Context) -> list[Check]:
    from privaudit.attacks.mvmf_analytic import MVMFAnalytic
    from privaudit.attacks.mvmf_nonlinear import MVMFNonlinear

    ds = ctx.dataset()
    checks = []
    tr = fedmvmf_transcript(ds, "semials", "obsonly", 0.0)
    nl = MVMFNonlinear(users=10).evaluate(tr, np.random.default_rng(0))
    checks += [
        Check(
            "privmvmf",
            "mvmf-nonlinear SemiALS ObsOnly noise-free, 10 victims: rating acc.",
            nl.metrics["rating_accuracy"],
            1.0,
            1e-9,
        ),
        Check("privmvmf", "  ... attribute acc.", nl.metrics["attribute_accuracy"], 1.0, 1e-9),
        Check(
            "privmvmf",
            "  ... rating acc. minus majority guess (0.342)",
            nl.metrics["rating_accuracy"] - nl.baseline["rating_accuracy_majority"],
            0.5,
            0.0,
            "min",
        ),
    ]
    an = MVMFAnalytic().evaluate(tr, np.random.default_rng(0))
    checks += [
        Check(
            "privmvmf",
            "mvmf-analytic same transcript, all clients: rating acc.",
            an.metrics["rating_accuracy"],
            1.0,
            1e-9,
        ),
        Check("privmvmf", "  ... attribute acc.", an.metrics["attribute_accuracy"], 1.0, 1e-9),
    ]
    mags = upload_magnitudes(ds, ["semials/obsonly", "sgd/obsonly"])
    checks += [
        Check(
            "privmvmf", "RMS grad_V round 0, SemiALS ObsOnly (docs 2.57)", mags["semials/obsonly"]["grad_V"], 2.57, 0.01
        ),
        Check("privmvmf", "RMS grad_V round 0, SGD ObsOnly (docs 0.73)", mags["sgd/obsonly"]["grad_V"], 0.73, 0.01),
        Check(
            "privmvmf", "RMS grad_P round 0, SemiALS ObsOnly (docs 0.37)", mags["semials/obsonly"]["grad_P"], 0.37, 0.01
        ),
        Check("privmvmf", "RMS grad_P round 0, SGD ObsOnly (docs 0.12)", mags["sgd/obsonly"]["grad_P"], 0.12, 0.01),
    ]
    checks += lossless_checks(ds, users=40, epochs=1)
    return checks


def lossless_checks(ds, users: int, epochs: int) -> list[Check]:
    """PrivMVMF vs FedMVMF with the same sampling: every utility metric identical (docs: 0.0000 %)."""
    from privaudit.registry import get

    idx = np.sort(np.random.default_rng(0).choice(ds.n_users, users, replace=False))
    sub = ds.subset_users(idx)
    cfg = get("protocol", "fedmvmf").resolve_config({"epochs": epochs, "update": "semials", "record_rounds": 1})
    sampling, paillier = get("defense", "sampling"), get("defense", "paillier")
    w = float(cfg["w"])
    fed = get("protocol", "fedmvmf")().run(sub, cfg, [sampling(rho=1.0, w=w)], rng=0)
    priv = get("protocol", "privmvmf")().run(
        sub, cfg, [sampling(rho=1.0, w=w), paillier(key_length=512, insecure_test_key=True)], rng=0
    )
    keys = [k for k in fed.utility if k.endswith("@10")]
    worst = max(abs(priv.utility[k] - fed.utility[k]) for k in keys)
    dV = float(np.max(np.abs(fed.model["V"] - priv.model["V"])))
    return [
        Check(
            "privmvmf",
            f"PrivMVMF lossless, {users} users, {epochs} epoch: largest |metric difference| over {len(keys)} metrics",
            worst,
            0.0,
            0.0,
            "max",
        ),
        Check("privmvmf", "  ... max |V_FedMVMF - V_PrivMVMF| (fixed point, 32 fractional bits)", dV, 0.0, 1e-8, "max"),
    ]


# ---------------------------------------------------------------------------------------------
# FedRec


def fedrec_run(ds, model: str, federated: bool, fold: int):
    from privaudit.protocols.fedrec import FedRec

    return FedRec().run(ds, {"model": model, "federated": federated, "fold": fold, "record_rounds": []}, [], 0).utility


def q_fedrec(ctx: Context) -> list[Check]:
    ds = ctx.dataset()
    fed = fedrec_run(ds, "pmf-batch", True, 0)
    unf = fedrec_run(ds, "pmf-batch", False, 0)
    md = abs(fed["rmse"] - unf["rmse"]) / unf["rmse"] * 100
    return [
        Check("fedrec", "PMF(B) federated fold 0 RMSE (docs 0.94760; paper 0.9424)", fed["rmse"], 0.94760, 0.0005),
        Check("fedrec", "PMF(B) federated fold 0 MAE (docs 0.74667)", fed["mae"], 0.74667, 0.0005),
        Check("fedrec", "PMF(B) fold 0 MD federated vs unfederated, % (docs <= 0.1 %)", md, 0.0, 0.1, "max"),
    ]


# ---------------------------------------------------------------------------------------------
# FedSPLIT


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


# ---------------------------------------------------------------------------------------------
# FedNCF


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


# ---------------------------------------------------------------------------------------------
# FedProto


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


# ---------------------------------------------------------------------------------------------
# registry

TABLES: dict[str, dict[str, Callable[[Context], str]]] = {
    "privmvmf": {
        "nonlinear-noisefree": t_nonlinear_noisefree,
        "nonlinear-laplace": t_nonlinear_laplace,
        "upload-magnitude": t_upload_magnitude,
        "solver-selection": script_table("mvmf_solver_selection.py", "--users", "40"),
        "analytic": script_table(
            "mvmf_attacks.py", "--no-sweep", "--users", "50", "--users-inclunc", "20", "--repeats", "5"
        ),
        "fedmvmf-utility": script_table("fedmvmf_utility.py"),
        "fedmvmf-speed": script_table("fedmvmf_speed.py", "--epochs", "3"),
        "lossless": script_table(
            "privmvmf_utility.py", "--epochs", "6", "--rho", "1", "--key-length", "512", "--jobs", "2"
        ),
        "phases": script_table("privmvmf_phases.py", "--users", "20", "--epochs", "2", "--key-length", "2048"),
        "sampling-leakage": script_table("sampling_leakage.py"),
    },
    "fedrec": {
        "table2": script_table(
            "fedrec_table2.py",
            "--parts",
            "table",
            "--models",
            "pmf-batch,pmf-sgd,svdpp-sgd",
            "--folds",
            "0,1,2,3,4",
            "--jobs",
            "1",
            data_flag=None,
        ),
        "rho": script_table(
            "fedrec_table2.py",
            "--parts",
            "rho",
            "--models",
            "pmf-batch",
            "--folds",
            "0,1,2,3,4",
            "--jobs",
            "1",
            data_flag=None,
        ),
        "render": script_table("fedrec_table2.py", "--render", data_flag=None),
    },
    "fedsplit": {
        "groups": script_table("fedsplit_groups.py", "--seeds", "4", "--surprise"),
        "untuned": t_fedsplit_pearson,
        "filter20": t_fedsplit_filter,
        "tuned": t_fedsplit_tuned,
    },
    "fedncf": {
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
    },
    "fedproto": {
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
    },
}
QUICK: dict[str, Callable[[Context], list[Check]]] = {
    "privmvmf": q_privmvmf,
    "fedrec": q_fedrec,
    "fedsplit": q_fedsplit,
    "fedncf": q_fedncf,
    "fedproto": q_fedproto,
}


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings to a dict; values parsed as int, float, bool, a tuple of numbers (comma) or str."""

    def value(v: str) -> Any:
        if v.lower() in ("true", "false"):
            return v.lower() == "true"
        for cast in (int, float):
            try:
                return cast(v)
            except ValueError:
                pass
        if "," in v and all(_is_number(x) for x in v.split(",")):
            return tuple(float(x) for x in v.split(","))
        return v

    out = {}
    for item in items:
        key, sep, v = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        out[key] = value(v)
    return out


def _is_number(x: str) -> bool:
    try:
        float(x)
    except ValueError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paper", choices=[*PAPERS, "all"])
    ap.add_argument("--table", default="", help="comma-separated table names of the paper (default: all of them)")
    ap.add_argument(
        "--quick", action="store_true", help="subsampled checks against the docs' tolerances (exit 1 on failure)"
    )
    ap.add_argument("--list", action="store_true", help="print the table names and exit")
    ap.add_argument("--out", default="reproduce-out", help="output folder (created)")
    ap.add_argument(
        "--data", default=os.environ.get("PRIVAUDIT_ML100K", str(DEFAULT_DATA)), help="MovieLens 100K folder"
    )
    ap.add_argument("--jobs", type=int, default=1, help="parallel workers where a table supports them")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="budget parameter of the named table (e.g. groupings=5, global_rounds=50); repeatable",
    )
    args = ap.parse_args(argv)
    papers = list(PAPERS) if args.paper == "all" else [args.paper]
    if args.list:
        for p in papers:
            print(f"{p}: {', '.join(TABLES[p])}")
        return 0
    names = [t for t in args.table.split(",") if t]
    if names and len(papers) > 1:
        print("reproduce.py: --table needs a single PAPER", file=sys.stderr)
        return 2
    unknown = [t for t in names if t not in TABLES[papers[0]]]
    if unknown:
        print(
            f"reproduce.py: unknown table {unknown[0]!r} of {papers[0]} (known: {', '.join(TABLES[papers[0]])})",
            file=sys.stderr,
        )
        return 2
    if args.quick and names:
        print("reproduce.py: --quick runs every paper's checks; it takes no --table", file=sys.stderr)
        return 2
    data = Path(args.data)
    if not (data / "u.data").is_file():
        print(
            f"reproduce.py: MovieLens 100K not found at {data} (give --data or set PRIVAUDIT_ML100K)", file=sys.stderr
        )
        return 2
    try:
        overrides = parse_sets(args.set)
    except ValueError as exc:
        print(f"reproduce.py: {exc}", file=sys.stderr)
        return 2
    if overrides and (len(names) != 1 or args.quick):
        print("reproduce.py: --set needs exactly one --table", file=sys.stderr)
        return 2
    if overrides:
        import inspect

        accepted = set(inspect.signature(TABLES[papers[0]][names[0]]).parameters) - {"ctx"}
        bad = sorted(set(overrides) - accepted)
        if bad:
            takes = ", ".join(sorted(accepted)) or "none"
            print(
                f"reproduce.py: table {names[0]!r} takes no parameter {bad[0]!r} (it takes: {takes})", file=sys.stderr
            )
            return 2
    if args.jobs < 1:
        print("reproduce.py: --jobs must be >= 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(data=data.resolve(), out=out.resolve(), jobs=args.jobs)
    warnings.simplefilter("ignore")
    if args.quick:
        checks: list[Check] = []
        for p in papers:
            t0 = time.perf_counter()
            checks += QUICK[p](ctx)
            print(f"{p}: quick checks done in {time.perf_counter() - t0:.0f} s", flush=True)
        head = "| paper | check | ours | docs (tolerance) | |\n|---|---|---|---|---|\n"
        table = head + "\n".join(c.row() for c in checks)
        (out / "quick.md").write_text(table + "\n")
        print(table)
        failed = [c for c in checks if not c.ok]
        if failed:
            print("\nFAILED:\n" + "\n".join(c.row() for c in failed), file=sys.stderr)
            return 1
        return 0
    for p in papers:
        (out / p).mkdir(exist_ok=True)
        for name, fn in TABLES[p].items():
            if names and name not in names:
                continue
            t0 = time.perf_counter()
            text = fn(ctx, **overrides)
            cmd = f"python benchmarks/reproduce.py {p} --table {name}" + "".join(f" --set {kv}" for kv in args.set)
            (out / p / f"{name}.md").write_text(f"Command: `{cmd}`\n\n{text}\n")
            print(f"## {p} / {name} ({time.perf_counter() - t0:.0f} s)\n\n{text}\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
