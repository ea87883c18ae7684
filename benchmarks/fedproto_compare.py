"""FedProto comparisons (DP-prototypes paper §4.3-4.6) and the prototype membership attack.

Parts (``--part``):

- ``ml``: MovieLens 100K by first ZIP digit (11 silos: 10 regions + unknown), test set = 20 %
  of the users with 5 held-out ratings each (§4.3); methods Full (centralised NMF), Local
  (per-silo NMF), Federated with exact k-means / k random rows / epsilon-DP prototypes
  (epsilon in --eps), Random scores; latent dims ell in --dims; metrics test RMSE, mean rank
  (eq. 4), MAP@10. The prototypes of a seed are computed once and reused for every ell. The
  same prototypes are attacked by ``proto-membership`` (AUC per kind; figure
  ``docs/figures/fedproto_membership.png``).
- ``poisson``: the paper's synthetic data scaled down: U, V ~ N(0, 1/ell_true) (the paper's
  N(0, 1) with ell_true = 100 makes exp(U V^T) overflow), X ~ Pois(exp(U V^T)), n_users x
  n_items = --poisson-users x --poisson-items, dealt uniformly into 10 silos; RMSE of the
  reconstruction U_h V^T of X (all entries, §4.6) for MF, MF + k-means, MF + k-random and
  MF + epsilon-DP prototypes, k in --ks; figure ``docs/figures/fedproto_poisson.png``.

Run: ``python benchmarks/fedproto_compare.py --part all --seeds 2`` (prints Markdown tables).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from privaudit.attacks.proto_membership import ProtoMembership
from privaudit.data import load_dataset, zip_silos
from privaudit.defenses.dp_prototypes import DPPrototypes
from privaudit.protocols.fedproto import (
    exact_prototypes,
    fit_users,
    local_scores,
    nmf_scores,
    random_prototypes,
    recommendation_metrics,
    server_factorize,
    split_test_users,
)
from privaudit.transcript import Transcript

ROOT = Path(__file__).resolve().parents[1]
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

ML100K = ml100k_dir()


def silo_prototypes(kind, Xd, silos, k, rng, eps=None, s=50, Lambda=5.0, swap_iters=30, trials=0):
    out = []
    for _h, users in enumerate(silos):
        X = Xd[users]
        if kind == "exact":
            out.append(exact_prototypes(X, k, int(rng.integers(2**31))))
        elif kind == "random":
            out.append(random_prototypes(X, k, rng))
        else:
            d = DPPrototypes(epsilon=eps, k=k, s=s, swap_iters=swap_iters, trials=trials)
            out.append(d.prototypes(X, k, s, Lambda, rng)[0])
    return out


def membership_auc(Xtrain, silos, protos, seed):
    """proto-membership on a minimal transcript holding the silos' private rows and prototypes."""
    m = Xtrain.shape[1]
    parties = [f"client:{h}" for h in range(len(silos))]
    tr = Transcript(protocol="fedproto", config={"n_items": int(m)}, parties=["server", *parties])
    for h, users in enumerate(silos):
        sub = Xtrain[users].tocoo()
        tr.add(
            0,
            parties[h],
            parties[h],
            "private",
            {
                "user_ids": users,
                "users": sub.row.astype(np.int64),
                "items": sub.col.astype(np.int64),
                "ratings": sub.data,
            },
        )
    for h, P in enumerate(protos):
        tr.add(0, parties[h], "server", "prototypes", {"prototypes": P})
    return ProtoMembership().evaluate(tr, np.random.default_rng(seed)).metrics


def part_ml(args):
    ds = load_dataset(ML100K)
    rows = []
    attack_rows = []
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        train, test = split_test_users(ds.ratings, 0.2, 5, rng)
        if args.silos == "zip":
            silos = [np.asarray(s, dtype=np.int64) for s in zip_silos(ds) if len(s)]
        else:
            silos = [
                np.sort(p)
                for p in np.array_split(np.random.default_rng(seed + 7).permutation(ds.n_users), args.n_silos)
            ]
        Xd = train.toarray()
        kinds = [("exact", None), ("random", None)] + [("dp", e) for e in args.eps]
        protos = {}
        for kind, eps in kinds:
            t0 = time.perf_counter()
            protos[(kind, eps)] = silo_prototypes(
                kind, Xd, silos, args.k, rng, eps, args.s, ds.rating_max, args.swap_iters, args.trials
            )
            am = membership_auc(train, silos, protos[(kind, eps)], seed)
            attack_rows.append({"seed": seed, "kind": kind, "epsilon": eps, **am})
            print(
                f"seed {seed} prototypes {kind} eps={eps}: {time.perf_counter() - t0:.1f}s, membership auc {am['auc']:.3f}",
                flush=True,
            )
        for ell in args.dims:
            res = {
                "Full": nmf_scores(Xd, ell, 0.1, args.max_iter, seed),
                "Local": local_scores(Xd, silos, ell, 0.1, args.max_iter, seed),
            }
            for (kind, eps), P in protos.items():
                V = server_factorize(np.vstack(P), ell, 0.1, args.max_iter, seed)
                res[f"Fed-{kind}" + (f" eps={eps:g}" if eps is not None else "")] = (
                    fit_users(Xd, V, 0.1, args.max_iter) @ V.T
                )
            res["Random"] = np.random.default_rng(seed + 99).random(Xd.shape)
            # non-private reference: every user gets the item popularity (training counts) ranking
            res["Popularity"] = np.broadcast_to(np.asarray((train != 0).sum(axis=0), dtype=np.float64), Xd.shape)
            for name, S in res.items():
                rows.append({"seed": seed, "ell": ell, "method": name, **recommendation_metrics(S, train, test, 10)})
            print(f"seed {seed} ell {ell} done", flush=True)
    return rows, attack_rows


def poisson_data(n_users, n_items, ell_true, seed):
    rng = np.random.default_rng(seed)
    U = rng.normal(0, 1 / np.sqrt(np.sqrt(ell_true)), size=(n_users, ell_true))
    V = rng.normal(0, 1 / np.sqrt(np.sqrt(ell_true)), size=(n_items, ell_true))
    return rng.poisson(np.exp(U @ V.T)).astype(np.float64)


def part_poisson(args):
    rows = []
    for seed in range(args.seeds):
        X = poisson_data(args.poisson_users, args.poisson_items, args.poisson_rank, seed)
        Lambda = float(args.poisson_clip)
        rng = np.random.default_rng(seed)
        silos = np.array_split(rng.permutation(X.shape[0]), 10)
        ell = args.poisson_dim

        def rmse_of(V, X=X):
            return float(np.sqrt(np.mean((fit_users(X, V, 0.1, args.max_iter) @ V.T - X) ** 2)))

        S = nmf_scores(X, ell, 0.1, args.max_iter, seed)
        mf = float(np.sqrt(np.mean((S - X) ** 2)))
        for k in args.ks:
            rows.append({"seed": seed, "k": k, "method": "MF", "epsilon": None, "rmse": mf})
            for kind in ("exact", "random"):
                P = np.vstack(silo_prototypes(kind, X, silos, k, rng))
                rows.append(
                    {
                        "seed": seed,
                        "k": k,
                        "method": f"MF+{kind}",
                        "epsilon": None,
                        "rmse": rmse_of(server_factorize(P, ell, 0.1, args.max_iter, seed)),
                    }
                )
            for eps in args.poisson_eps:
                t0 = time.perf_counter()
                P = np.vstack(silo_prototypes("dp", X, silos, k, rng, eps, X.shape[1], Lambda, args.swap_iters))
                r = rmse_of(server_factorize(P, ell, 0.1, args.max_iter, seed))
                rows.append({"seed": seed, "k": k, "method": "MF+dp", "epsilon": eps, "rmse": r})
                print(
                    f"poisson seed {seed} k {k} eps {eps}: rmse {r:.3f} ({time.perf_counter() - t0:.0f}s)", flush=True
                )
    return rows


def _mean(rows, key, **match):
    vals = [r[key] for r in rows if all(r.get(k) == v for k, v in match.items())]
    return (float(np.mean(vals)), float(np.std(vals))) if vals else (float("nan"), float("nan"))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="all", choices=["ml", "poisson", "all"])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--eps", type=float, nargs="+", default=[0.1, 1.0, 10.0])
    ap.add_argument("--dims", type=int, nargs="+", default=[10, 20, 50])
    ap.add_argument("--k", type=int, default=50, help="prototypes per silo on ML (paper: 50)")
    ap.add_argument("--s", type=int, default=50, help="public non-zero bound s of the DP mechanism on ML")
    ap.add_argument("--swap-iters", type=int, default=30)
    ap.add_argument(
        "--trials", type=int, default=0, help="T of the DP mechanism (0: ceil(2 ln(1/delta)) = 5; the authors' code: 1)"
    )
    ap.add_argument(
        "--silos",
        default="zip",
        choices=["zip", "uniform"],
        help="ML silos: first ZIP digit or --n-silos random equal silos",
    )
    ap.add_argument("--n-silos", type=int, default=10)
    ap.add_argument("--max-iter", type=int, default=200)
    ap.add_argument("--ks", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--poisson-users", type=int, default=1000)
    ap.add_argument("--poisson-items", type=int, default=200)
    ap.add_argument("--poisson-rank", type=int, default=20)
    ap.add_argument("--poisson-dim", type=int, default=20)
    ap.add_argument("--poisson-clip", type=float, default=10.0)
    ap.add_argument("--poisson-eps", type=float, nargs="+", default=[0.01, 0.1, 1.0, 10.0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "figures"))
    ap.add_argument("--json", default=None, help="also write the raw results to this JSON file")
    return ap


def _report_ml(args, rows: list[dict], attack_rows: list[dict], out: Path, plt) -> None:
    """Markdown tables of the ML-100K part and the membership-AUC figure."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    print(
        f"\n### ML-100K by {args.silos} silos, k={args.k}, s={args.s}, trials={args.trials or 'default'}, {args.seeds} seeds (mean rank / MAP@10 / RMSE)\n"
    )
    print("| method | " + " | ".join(f"ell={d} rank | MAP@10 | RMSE" for d in args.dims) + " |")
    print("|---|" + "---|---|---|" * len(args.dims))
    for mth in methods:
        cells = []
        for d in args.dims:
            cells += [f"{_mean(rows, key, method=mth, ell=d)[0]:.3f}" for key in ("mean_rank", "map@10", "rmse")]
        print(f"| {mth} | " + " | ".join(cells) + " |")
    print("\n### proto-membership on the ML-100K prototypes (mean over seeds)\n")
    print("| prototypes | AUC | AUC pooled | advantage |")
    print("|---|---|---|---|")
    for kind, eps in dict.fromkeys((r["kind"], r["epsilon"]) for r in attack_rows):
        m = {k: _mean(attack_rows, k, kind=kind, epsilon=eps)[0] for k in ("auc", "auc_pooled", "advantage")}
        print(
            f"| {kind}{'' if eps is None else f' eps={eps:g}'} | {m['auc']:.3f} | {m['auc_pooled']:.3f} | {m['advantage']:.3f} |"
        )
    fig, ax = plt.subplots(figsize=(5, 3.5))
    e = args.eps
    a = [_mean(attack_rows, "auc", kind="dp", epsilon=x) for x in e]
    ax.errorbar(e, [v[0] for v in a], yerr=[v[1] for v in a], marker="o", label="dp prototypes")
    for kind, style in (("random", "--"), ("exact", ":")):
        ax.axhline(
            _mean(attack_rows, "auc", kind=kind)[0],
            ls=style,
            color="C1" if kind == "random" else "C2",
            label=f"{kind} prototypes",
        )
    ax.axhline(0.5, color="grey", lw=0.8, label="baseline 0.5")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon")
    ax.set_ylabel("membership AUC")
    ax.set_title(f"proto-membership, ML-100K ZIP silos, k={args.k}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "fedproto_membership.png", dpi=120)


def _report_poisson(args, rows: list[dict], out: Path, plt) -> None:
    """Markdown table of the synthetic Poisson part and its RMSE figure."""
    print(
        f"\n### Synthetic Poisson {args.poisson_users}x{args.poisson_items}, rank {args.poisson_rank}, ell={args.poisson_dim}, 10 silos: reconstruction RMSE\n"
    )
    print("| k | MF | MF+k-means | MF+k-random | " + " | ".join(f"dp eps={e:g}" for e in args.poisson_eps) + " |")
    print("|---|" + "---|" * (3 + len(args.poisson_eps)))
    for k in args.ks:
        cells = [_mean(rows, "rmse", k=k, method=mth)[0] for mth in ("MF", "MF+exact", "MF+random")]
        cells += [_mean(rows, "rmse", k=k, method="MF+dp", epsilon=e)[0] for e in args.poisson_eps]
        print(f"| {k} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for i, k in enumerate(args.ks):
        ax.plot(
            args.poisson_eps,
            [_mean(rows, "rmse", k=k, method="MF+dp", epsilon=e)[0] for e in args.poisson_eps],
            marker="o",
            color=f"C{i}",
            label=f"dp prototypes k={k}",
        )
        ax.axhline(_mean(rows, "rmse", k=k, method="MF+exact")[0], ls=":", color=f"C{i}", label=f"k-means k={k}")
    ax.axhline(_mean(rows, "rmse", method="MF")[0], color="k", lw=0.8, label="MF (centralised)")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon")
    ax.set_ylabel("reconstruction RMSE")
    ax.set_title("Synthetic Poisson (scaled down), Fig. 4c/d")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "fedproto_poisson.png", dpi=120)


def main():
    args = _parser().parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    results = {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if args.part in ("ml", "all"):
        rows, attack_rows = part_ml(args)
        results["ml"], results["ml_attack"] = rows, attack_rows
        _report_ml(args, rows, attack_rows, out, plt)
    if args.part in ("poisson", "all"):
        rows = part_poisson(args)
        results["poisson"] = rows
        _report_poisson(args, rows, out, plt)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    main()
