"""Tables and quick checks of the PrivMVMF paper (FedMVMF, mvmf-nonlinear, PrivMVMF) for ``benchmarks/reproduce.py privmvmf``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import numpy as np
from reproduce_common import Check, Context, md_table, script_table

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
    from privaudit.attacks.mvmf.nonlinear import MVMFNonlinear

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
    from privaudit.attacks.mvmf.analytic import MVMFAnalytic
    from privaudit.attacks.mvmf.nonlinear import MVMFNonlinear

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


#: Tables of ``reproduce.py privmvmf`` by name (each returns Markdown).
TABLES: dict[str, Callable[[Context], str]] = {
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
}

#: Quick checks of ``reproduce.py privmvmf --quick``.
QUICK = q_privmvmf
