"""Is there a useful DP point of FedNCF on MovieLens 100K? dp-sgd settings vs the non-private model.

    python benchmarks/fedncf_dp_point.py --csv points.csv                  # ML-100K, the grid of docs/fedncf-dp.md
    python benchmarks/fedncf_dp_point.py --points np-e1,dp10-lr03          # some points only
    python benchmarks/fedncf_dp_point.py --render docs/fedncf-dp-points.csv  # the tables of the recorded rows
    python benchmarks/fedncf_dp_point.py --grad-norms                      # per-sample gradient norms by group
    python benchmarks/fedncf_dp_point.py --sign-reading none,10,1000       # sign reading of saturated rounds
    python benchmarks/fedncf_dp_point.py --small                           # synthetic 60 x 80, 3 points (the test)

FedGMF, MF-FedAvg, c = 20 clients per aggregation round, 4 negatives per positive, embeddings
N(0, 0.1^2), seed 0, and -- unlike the protocol's default batch of 64 -- **full-batch local steps**
(``batch_size`` 4096, more than any ML-100K client's 3,680 instances): every client's sampling rate
is q = 1, so the accounting is the plain composition of ``local_epochs x global_rounds`` Gaussian
mechanisms (no subsampling amplification and so no Poisson-vs-shuffling approximation), and the
noise per step is spread over a client's whole local data instead of 64 instances.

Each dp-sgd point gives a target epsilon (delta 1e-5); the noise multiplier is the one at which
dp-sgd's own accountant (Opacus RDP, replace-one-instance neighbours, sensitivity 2C) spends
exactly that over the run (:func:`noise_for_epsilon`), and the run's accounted ``epsilon`` (largest
over clients, for the rounds each took part in) is printed beside it, with the mu-GDP of the
composition and the TPR at 1 % FPR it allows (:func:`gdp`). Unit: **one training instance** (a
positive or a sampled negative) of one client replaced, its instance count fixed -- not one
rating, not one user (docs/dp-claims.md).

Per point: HR@10 / NDCG@10 (101 candidates, FedNCF paper §4.1) and the gap to the non-private model
of the same settings. Points marked ``attacks`` record their first 10 aggregation rounds (200
clients' uploads) and are attacked by ``ncf-update-leak`` and ``ncf-interaction-inference`` (an
honest-but-curious server, each client's first upload), :func:`ranked_reading` of the latter's
scores, and a malicious server that sends every member of ``--saturate-rounds`` consecutive
cohorts the saturated model (``server=saturate``, ``ncf-active-saturation`` reading every deviation
round; ``--saturate-seeds`` targets; the run stops after the deviation rounds, and the target's
epsilon printed is that of the full run plus those rounds). Verdicts are privaudit's
(:func:`privaudit.results.verdicts.experiment_verdicts`) except the two readings made here, whose
test is stated in their docstrings. ``--sign-reading``: :func:`sign_reading`.

Prints one JSON line per point as it finishes (and appends it to ``--csv``), then the Markdown
tables of docs/fedncf-dp.md. Minutes per point on 2 cores (the ``attacks`` points longer).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

from privaudit.data import load_dataset, synthetic
from privaudit.defenses.dp_sgd import DPSGD, REPLACE_SENSITIVITY, rdp_epsilon
from privaudit.experiment import attack_transcript, build_experiment, run_experiment
from privaudit.protocols.fedncf import FedNCF, eval_candidates, implicit_split, rng_streams
from privaudit.results.verdicts import experiment_verdicts

DELTA = 1e-5
FULL_BATCH = 4096
BASE = {
    "model": "gmf",
    "aggregation": "mf-fedavg",
    "clients_per_round": 20,
    "negatives": 4,
    "init_std": 0.1,
    "batch_size": FULL_BATCH,
    "global_rounds": 20,
    "local_epochs": 1,
    "lr": 0.03,
    "record_rounds": 0,
}
ATTACK_ROUNDS = 10  # aggregation rounds recorded for the honest-but-curious attacks


@dataclasses.dataclass(frozen=True)
class Point:
    """One setting: protocol overrides of :data:`BASE`, and dp-sgd (None: no defense) as a target
    ``epsilon`` (the noise multiplier is calibrated to it; 0: clipping only, no noise) and clip C."""

    name: str
    config: dict[str, Any]
    epsilon: float | None = None
    clip: float = 0.1
    noise: float | None = None  # a fixed noise multiplier instead of a target epsilon (batch < n: slow accounting)
    attacks: bool = False
    note: str = ""


E1 = {"local_epochs": 1, "lr": 0.03}
B64 = {"batch_size": 64, "local_epochs": 2, "lr": 0.01, "global_rounds": 5}  # the protocol's batch and epochs
POINTS = (  # in the order they run and are shown
    Point("np-e1", E1, attacks=True, note="non-private reference of every E = 1 point"),
    Point("dp1", E1, epsilon=1.0),
    Point("dp10-lr03", E1, epsilon=10.0, attacks=True),
    Point("dp10-lr01", {"local_epochs": 1, "lr": 0.01}, epsilon=10.0),
    Point("dp10-lr003", {"local_epochs": 1, "lr": 0.003}, epsilon=10.0),
    Point(
        "dp10-c1",
        E1,
        epsilon=10.0,
        clip=1.0,
        note="C = 1 (about the median per-sample norm; 0.1 is below every median)",
    ),
    Point("dp10-g5", {**E1, "global_rounds": 5}, epsilon=10.0, note="5 global rounds: 4x fewer releases"),
    Point("clip-only", E1, epsilon=0.0, note="clipping to C = 0.1, no noise (epsilon infinite)"),
    Point("dp30", E1, epsilon=30.0),
    Point("dp100", E1, epsilon=100.0, attacks=True),
    Point("dp300", E1, epsilon=300.0, attacks=True),
    Point("dp1000", E1, epsilon=1000.0, attacks=True),
    Point("np-e3", {"local_epochs": 3, "lr": 0.01}, note="non-private reference of dp10-e3"),
    Point("dp10-e3", {"local_epochs": 3, "lr": 0.01}, epsilon=10.0),
    Point("np-b64", B64, note="non-private reference of dp-b64"),
    Point("dp-b64", B64, noise=3.5, note="batch 64 (q = 64 / n, Poisson-accounted): epsilon as accounted"),
)
SMALL_BASE = {**BASE, "clients_per_round": 10, "global_rounds": 2}
SMALL_POINTS = (
    Point("np-e1", E1, attacks=True),
    Point("dp10-lr03", E1, epsilon=10.0, attacks=True),
    Point("dp1000", E1, epsilon=1000.0),
)


def noise_for_epsilon(epsilon: float, steps: int, delta: float = DELTA) -> float:
    """The dp-sgd noise multiplier sigma at which ``steps`` full-batch steps (q = 1) spend
    ``epsilon`` by dp-sgd's accountant (Opacus RDP at sigma / 2: replace-one sensitivity 2C)."""
    from scipy.optimize import brentq

    def gap(log_sigma: float) -> float:
        return math.log(rdp_epsilon(math.exp(log_sigma) / REPLACE_SENSITIVITY, 1.0, steps, delta)) - math.log(epsilon)

    return math.exp(brentq(gap, math.log(1e-3), math.log(1e5), xtol=1e-8))


def popularity_hr(ds: Any, seed: int = 0, k: int = 10) -> float:
    """HR@k of ranking the candidates by training popularity (the same split and candidates as
    FedNCF's evaluation with ``seed``; benchmarks/reproduce_fedncf.py)."""
    streams = rng_streams(seed)
    pos, test_item = implicit_split(ds, streams["split"], "random")
    _, cand = eval_candidates(pos, test_item, ds.n_items, 100, streams["eval"])
    pop = np.asarray(pos.sum(axis=0)).ravel()
    scores = pop[cand] + 1e-9 * np.random.default_rng(seed).random(cand.shape)
    return float(np.mean((scores[:, 1:] > scores[:, :1]).sum(axis=1) < k))


def gradient_norms(ds: Any, base: dict, rounds: tuple[int, ...], samples: int = 3000) -> list[dict[str, Any]]:
    """Median per-sample gradient norms of GMF's parameter groups (item row, user vector,
    prediction weights h, bias b) and of their joint norm (what dp-sgd clips), for positives and
    uniformly drawn negatives, after ``rounds`` global rounds of the non-private E = 1 setting.
    GMF: logit s = h . (p * q) + b, dL/ds = sigmoid(s) - y, so dL/dq = dL/ds (h * p),
    dL/dp = dL/ds (h * q), dL/dh = dL/ds (p * q), dL/db = dL/ds."""
    out = []
    rng = np.random.default_rng(1)
    pos, _ = implicit_split(ds, rng_streams(0)["split"])
    has = np.flatnonzero(np.diff(pos.indptr) > 0)
    users = rng.choice(has, samples)
    items_pos = np.array([rng.choice(pos.indices[pos.indptr[u] : pos.indptr[u + 1]]) for u in users])
    items_neg = rng.integers(0, ds.n_items, samples)
    for g in rounds:
        model = FedNCF().run(ds, {**base, **E1, "global_rounds": g}, [], 0).model
        h = np.asarray(model["net"]["predict.weight"], dtype=np.float64)
        b = float(np.asarray(model["net"]["predict.bias"]).ravel()[0])
        P = np.asarray(model["users"], dtype=np.float64)[users]
        for label, items in ((1.0, items_pos), (0.0, items_neg)):
            Q = np.asarray(model["items"], dtype=np.float64)[items]
            s = (P * Q) @ h + b
            d = 1.0 / (1.0 + np.exp(-s)) - label
            parts = {
                "item": np.abs(d) * np.linalg.norm(h * P, axis=1),
                "user": np.abs(d) * np.linalg.norm(h * Q, axis=1),
                "h": np.abs(d) * np.linalg.norm(P * Q, axis=1),
                "b": np.abs(d),
            }
            joint = np.sqrt(sum(v**2 for v in parts.values()))
            row = {"global_rounds": g, "label": int(label), "joint": float(np.median(joint))}
            row.update({k: float(np.median(v)) for k, v in parts.items()})
            row["item_share"] = float(np.median(parts["item"] / joint))
            out.append(row)
    return out


def _verdict(results: dict) -> dict[str, Any]:
    v = experiment_verdicts(results)[0]
    row = v["rows"][-1]
    t = (row.get("tests") or {}).get(v["metric"]) or {}
    value = float(t.get("baseline", math.nan)) + float(t.get("advantage", math.nan))
    lo, hi = t.get("low", math.nan), t.get("high", math.nan)
    return {
        "metric": v["metric"],
        "value": value,
        "prior": float(t.get("baseline", math.nan)),
        "advantage": float(t.get("advantage", math.nan)),
        "ci": [float(lo), float(hi)],
        "verdict": str(row.get("verdict")),
    }


def ranked_reading(transcript: Any) -> dict[str, Any]:
    """A stronger reading of ncf-interaction-inference's per-row scores under dp-sgd, where every
    client uploads all m rows and the attack's fixed recipe (positives implied by the number of
    rows) predicts nearly every row: each client's k highest-scoring rows, k its number of
    positives (public: ``n_instances`` = k (1 + negatives) is uploaded exactly), against the
    message-free guess with the same k (its k items most popular among the other attacked
    clients). precision@k (= recall@k) per client; advantage = mean paired difference with a
    normal 95 % interval over clients ("leaks" when its lower end is above 0). Also the AUC and
    TPR at 1 % FPR of the scores over all (client, item) records."""
    from privaudit.attack_metrics import roc_summary
    from privaudit.registry import get

    rec = get("attack", "ncf-interaction-inference")(rounds=1).evaluate(transcript, np.random.default_rng(0))
    d = rec.decisions["positive"]
    m = int(transcript.config["n_items"])
    S, L = d.scores.reshape(-1, m), d.labels.reshape(-1, m)
    pop = L.sum(axis=0)[None, :] - L + 1e-6 * np.random.default_rng(1).random(L.shape)
    k = L.sum(axis=1)

    def prec(score: np.ndarray) -> np.ndarray:
        top = np.argsort(-score, axis=1, kind="stable")
        return np.array([L[g, top[g, : k[g]]].mean() for g in range(len(k))])

    diff = prec(S) - prec(pop)
    half = 1.96 * diff.std(ddof=1) / math.sqrt(len(diff))
    lo, hi = float(diff.mean() - half), float(diff.mean() + half)
    roc = roc_summary(d.labels, d.scores)
    return {
        "metric": "precision@k",
        "value": float(prec(S).mean()),
        "prior": float(prec(pop).mean()),
        "advantage": float(diff.mean()),
        "ci": [lo, hi],
        "verdict": "leaks" if lo > 0 else ("below the popularity guess" if hi < 0 else "no evidence of leakage"),
        "auc": float(roc["auc"]),
        "tpr@0.01": float(roc.get("tpr@0.01", math.nan)),
    }


def sign_reading(ds: Any, base: dict, epsilon: float | None, rounds: int, seeds: int) -> dict[str, Any]:
    """A reading of the saturated rounds made for dp-sgd's full-batch uploads: with one local step
    from a fresh Adam state a client's change of every row is -lr sign(noisy gradient) per
    coordinate, so every row moves by the same amount (``ncf-active-saturation``'s "moved" test
    sees all rows move) and only the signs carry information. Under the saturated model a
    negative's gradient is ~0 (its signs are the noise's), while every positive's item gradient
    is a multiple of the same vector -h * p_u. The reading sums each row's sign vectors over the
    ``rounds`` saturated rounds, takes the top right singular vector w of that (m x D) matrix and
    ranks rows by |row . w|; the target's top k (k public from ``n_instances``) against its k items
    most popular among the other clients. One target per seed; precision@k, paired difference,
    normal 95 % interval over targets. ``epsilon`` None: no dp-sgd."""
    cfg = {**base, **E1, "server": "saturate", "deviation_rounds": rounds, "deviation_start": 0}
    cfg.update(max_rounds=rounds, record_rounds=rounds)
    steps = int(cfg["local_epochs"]) * int(base["global_rounds"])
    sigma = None if epsilon is None else noise_for_epsilon(epsilon, steps)
    pos, _ = implicit_split(ds, rng_streams(0)["split"])
    counts = np.asarray(pos.sum(axis=0)).ravel()
    got, prior = [], []
    for seed in range(seeds):
        dp = [] if sigma is None else [DPSGD(noise_multiplier=sigma, max_grad_norm=0.1, delta=DELTA)]
        t = FedNCF().run(ds, cfg, dp, seed).transcript
        me = f"client:{int(t.config['target'])}"
        truth = next(np.asarray(m.payload["items"]) for m in t.messages if m.kind == "private" and m.sender == me)
        ups = [m for m in t.messages if m.kind == "item_update" and m.sender == me]
        A = np.zeros((ds.n_items, int(np.asarray(ups[0].payload["values"]).shape[1])))
        for m in ups:
            A[np.asarray(m.payload["items"], dtype=np.int64)] += np.sign(np.asarray(m.payload["values"]))
        w = np.linalg.svd(A, full_matrices=False)[2][0]
        k = len(truth)
        own = np.zeros(ds.n_items)
        own[truth] = 1.0  # the target's own positives are not part of the others' popularity
        pop = counts - own + 1e-6 * np.random.default_rng(seed).random(ds.n_items)
        got.append(np.isin(np.argsort(-np.abs(A @ w), kind="stable")[:k], truth).mean())
        prior.append(np.isin(np.argsort(-pop, kind="stable")[:k], truth).mean())
    diff = np.asarray(got) - np.asarray(prior)
    half = 1.96 * diff.std(ddof=1) / math.sqrt(len(diff)) if len(diff) > 1 else math.nan
    lo, hi = float(diff.mean() - half), float(diff.mean() + half)
    verdict = "leaks" if lo > 0 else ("below the popularity guess" if hi < 0 else "no evidence of leakage")
    return {
        "epsilon": epsilon,
        "noise_multiplier": sigma,
        "target_epsilon": math.inf
        if sigma is None
        else rdp_epsilon(sigma / REPLACE_SENSITIVITY, 1.0, steps + rounds, DELTA),
        "metric": "precision@k",
        "value": float(np.mean(got)),
        "prior": float(np.mean(prior)),
        "advantage": float(diff.mean()),
        "ci": [lo, hi],
        "verdict": verdict if len(diff) > 1 else "one target: no interval",
    }


def honest_attacks(transcript: Any) -> dict[str, Any]:
    """ncf-update-leak and ncf-interaction-inference (each client's first recorded upload), and
    :func:`ranked_reading` of the latter."""
    out = {}
    for name, params in (("ncf-update-leak", {}), ("ncf-interaction-inference", {"rounds": 1})):
        out[name] = _verdict(attack_transcript(transcript, {"name": name, **params}, progress=False))
    out["interaction scores, top k (k known)"] = ranked_reading(transcript)
    return out


def saturation_attack(ds: Any, cfg: dict, defenses: list, rounds: int, seeds: int) -> dict[str, Any]:
    """A malicious server's ``rounds`` saturated rounds (ncf-active-saturation reading them all), one
    target per seed; the run stops after them."""
    mal = {**cfg, "server": "saturate", "deviation_rounds": rounds, "deviation_start": 0}
    mal.update(max_rounds=rounds, record_rounds=rounds)
    exp = build_experiment(
        protocol="fedncf",
        attack={"name": "ncf-active-saturation", "rounds": -1},
        defenses=defenses,
        protocol_config=mal,
        seeds=seeds,
        progress=False,
    )
    return _verdict(run_experiment(exp, dataset=ds))


def run_point(ds: Any, base: dict, point: Point, args: argparse.Namespace) -> dict[str, Any]:
    cfg = {**base, **point.config}
    if point.attacks:
        cfg["record_rounds"] = ATTACK_ROUNDS
    steps = int(cfg["local_epochs"]) * int(cfg["global_rounds"])
    defenses, sigma = [], None
    if point.noise is not None:
        sigma = float(point.noise)
    elif point.epsilon is not None:
        sigma = 0.0 if point.epsilon == 0 else noise_for_epsilon(point.epsilon, steps)
    if sigma is not None:
        defenses = [{"name": "dp-sgd", "noise_multiplier": sigma, "max_grad_norm": point.clip, "delta": DELTA}]
    t0 = time.perf_counter()
    dp = [DPSGD(**{k: v for k, v in d.items() if k != "name"}) for d in defenses]
    res = FedNCF().run(ds, cfg, dp, 0)
    row: dict[str, Any] = {
        "point": point.name,
        "local_epochs": cfg["local_epochs"],
        "global_rounds": cfg["global_rounds"],
        "lr": cfg["lr"],
        "batch_size": cfg["batch_size"],
        "clip": point.clip if defenses else None,
        "noise_multiplier": sigma,
        "epsilon_target": point.epsilon,
        "epsilon": res.utility.get("epsilon", math.inf) if defenses else math.inf,
        "hr@10": res.utility["hr@10"],
        "ndcg@10": res.utility["ndcg@10"],
        "seconds": round(time.perf_counter() - t0, 1),
        "note": point.note,
    }
    if point.attacks:
        row["attacks"] = honest_attacks(res.transcript)
        del res
        mal_cfg = {k: v for k, v in cfg.items() if k != "record_rounds"}
        row["attacks"]["ncf-active-saturation"] = saturation_attack(
            ds, mal_cfg, defenses, args.saturate_rounds, args.saturate_seeds
        )
        if sigma:  # the target's epsilon: the full run's releases plus the deviation rounds
            extra = int(cfg["local_epochs"]) * args.saturate_rounds
            row["attacks"]["ncf-active-saturation"]["target_epsilon"] = rdp_epsilon(
                sigma / REPLACE_SENSITIVITY, 1.0, steps + extra, DELTA
            )
            row["attacks"]["ncf-active-saturation"]["target_steps"] = steps + extra
        row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isinf(x):
            return "inf"
        if math.isnan(x):
            return "n/a"
        return f"{x:.{nd}g}" if abs(x) >= 1000 else f"{x:.{nd}f}"
    return str(x)


def reference_of(row: dict, rows: dict[str, dict]) -> dict | None:
    """The non-private point with the same batch, local epochs, rounds and lr (np-*), if run."""
    keys = ("batch_size", "local_epochs", "lr", "global_rounds")
    for r in rows.values():
        if r["noise_multiplier"] is None and all(r[k] == row[k] for k in keys):
            return r
    return rows.get("np-e1")


def gdp(sigma: float | None, steps: int, fpr: float = 0.01) -> tuple[float, float]:
    """(mu, largest TPR at ``fpr``) that ``steps`` full-batch dp-sgd steps at noise multiplier
    ``sigma`` allow a test of one replaced instance: each step is a Gaussian mechanism with
    sensitivity 2C and standard deviation sigma C, so the composition is exactly mu-GDP with
    mu = 2 sqrt(steps) / sigma (Dong, Roth and Su, "Gaussian differential privacy", JRSS B 2022),
    and no test does better than TPR = Phi(Phi^-1(fpr) + mu)."""
    from scipy.stats import norm

    if not sigma:
        return math.inf, 1.0
    mu = REPLACE_SENSITIVITY * math.sqrt(steps) / sigma
    return mu, float(norm.cdf(norm.ppf(fpr) + mu))


def tables(rows: dict[str, dict], pop: float) -> str:
    out = [
        f"popularity ranker HR@10: {pop:.3f}",
        "",
        "| point | E | global rounds | lr | C | noise multiplier | epsilon (target / accounted) | mu (GDP) "
        "| TPR bound at FPR 1 % | HR@10 | NDCG@10 | HR@10 - non-private | within 0.05 | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows.values():
        ref = reference_of(r, rows)
        gap = r["hr@10"] - ref["hr@10"] if ref is not None else math.nan
        eps = f"{_fmt(r['epsilon_target'], 2)} / {_fmt(r['epsilon'], 2)}"
        if r["noise_multiplier"] is None:
            eps = "inf (no dp-sgd)"
        elif r["noise_multiplier"] == 0:
            eps = "inf (no noise)"
        within = "yes" if gap >= -0.05 else "no"
        mu, tpr = gdp(r["noise_multiplier"], r["local_epochs"] * r["global_rounds"])
        if r["batch_size"] < FULL_BATCH:  # subsampled steps: not a plain Gaussian composition
            mu, tpr = math.nan, math.nan
        out.append(
            f"| {r['point']} | {r['local_epochs']} | {r['global_rounds']} | {r['lr']} | {_fmt(r['clip'])} "
            f"| {_fmt(r['noise_multiplier'])} | {eps} | {_fmt(mu, 2)} | {_fmt(tpr, 2)} | {r['hr@10']:.3f} | {r['ndcg@10']:.3f} | {gap:+.3f} "
            f"| {within} | {r['note']} |"
        )
    attacked = [r for r in rows.values() if "attacks" in r]
    if attacked:
        out += [
            "",
            "| point | epsilon | attack | metric | attack value | prior | advantage [95 % CI] | verdict "
            "| AUC / TPR at 1 % FPR |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in attacked:
            for name, a in r["attacks"].items():
                eps = _fmt(a.get("target_epsilon", r["epsilon"]), 2)
                lo, hi = a["ci"]
                out.append(
                    f"| {r['point']} | {eps} | {name} | {a['metric']} | {a['value']:.3f} | {a['prior']:.3f} "
                    f"| {a['advantage']:+.3f} [{lo:+.3f}, {hi:+.3f}] | {a['verdict']} "
                    f"| {_fmt(a.get('auc'))} / {_fmt(a.get('tpr@0.01'))} |"
                )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="synthetic 60 users x 80 items, 3 points (seconds)")
    ap.add_argument("--points", default="", help="comma-separated point names (default: all)")
    ap.add_argument("--csv", default="", help="append one row per point to this new file (refused if it exists)")
    ap.add_argument(
        "--grad-norms", action="store_true", help="only the median per-sample gradient norms after 0, 5, 20 rounds"
    )
    ap.add_argument(
        "--sign-reading",
        default="",
        metavar="EPS,...",
        help="only the sign reading of the saturated rounds at these target epsilons of the E = 1 setting (none: no dp-sgd)",
    )
    ap.add_argument("--render", default="", help="only print the tables of the rows of this --csv file")
    ap.add_argument("--saturate-rounds", type=int, default=5, help="malicious server's saturated rounds")
    ap.add_argument("--saturate-seeds", type=int, default=10, help="targets of the malicious server (one per seed)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message="Optimal order is the", category=UserWarning)  # Opacus, at q = 1
    points, base = (SMALL_POINTS, SMALL_BASE) if args.small else (POINTS, BASE)
    names = [p.name for p in points]
    wanted = [s for s in args.points.split(",") if s] or names
    unknown = [s for s in wanted if s not in names]
    if unknown:
        print(f"fedncf_dp_point: unknown point(s) {', '.join(unknown)}; known: {', '.join(names)}", file=sys.stderr)
        return 2
    if args.saturate_rounds < 1 or args.saturate_seeds < 1:
        print("fedncf_dp_point: --saturate-rounds and --saturate-seeds must be at least 1", file=sys.stderr)
        return 2
    eps: list[float | None] = []
    if args.sign_reading:
        try:
            eps = [None if e == "none" else float(e) for e in args.sign_reading.split(",")]
        except ValueError:
            eps = [-1.0]
        if any(e is not None and not (e > 0 and math.isfinite(e)) for e in eps):
            print("fedncf_dp_point: --sign-reading takes positive epsilons or none, comma-separated", file=sys.stderr)
            return 2
    if not args.small and not ml100k_dir().is_dir():
        print(f"fedncf_dp_point: no MovieLens 100K at {ml100k_dir()} (set PRIVAUDIT_ML100K)", file=sys.stderr)
        return 2
    csv_path = Path(args.csv) if args.csv else None
    if csv_path is not None and csv_path.exists():
        print(f"fedncf_dp_point: {csv_path} exists; name a new file", file=sys.stderr)
        return 2
    if args.render:
        path = Path(args.render)
        if not path.is_file():
            print(f"fedncf_dp_point: {path}: no such file", file=sys.stderr)
            return 2
        try:
            with path.open(newline="") as fh:
                found = {r["point"]: json.loads(r["json"]) for r in csv.DictReader(fh)}  # a later row of a point wins
            if not found:
                raise ValueError("no rows")
            tables(found, 0.0)
        except (KeyError, TypeError, ValueError, csv.Error, UnicodeDecodeError):
            print(f"fedncf_dp_point: {path}: not a CSV written by --csv", file=sys.stderr)
            return 2
        order = [p.name for p in points]
        for p in points:  # the notes as the grid states them now
            if p.name in found:
                found[p.name]["note"] = p.note
        rows = {k: found[k] for k in sorted(found, key=lambda k: order.index(k) if k in order else len(order))}
        ds = synthetic(n_users=60, n_items=80, seed=0) if args.small else load_dataset(ml100k_dir())
        print(tables(rows, popularity_hr(ds)))
        return 0
    if args.small:
        ds = synthetic(n_users=60, n_items=80, seed=0)
    else:
        ds = load_dataset(ml100k_dir())
        n_max = int(np.diff(implicit_split(ds, rng_streams(0)["split"])[0].indptr).max()) * (1 + BASE["negatives"])
        assert n_max <= FULL_BATCH, n_max  # q = 1 for every client
    if args.sign_reading:
        print(
            "| target epsilon | noise multiplier | target's epsilon | precision@k | popularity, same k "
            "| advantage [95 % CI] | verdict |"
        )
        print("|---|---|---|---|---|---|---|")
        for e in eps:
            r = sign_reading(ds, base, e, args.saturate_rounds, args.saturate_seeds)
            print(
                f"| {_fmt(e) if e else 'none'} | {_fmt(r['noise_multiplier'])} | {_fmt(r['target_epsilon'], 2)} "
                f"| {r['value']:.3f} | {r['prior']:.3f} | {r['advantage']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}] "
                f"| {r['verdict']} |",
                flush=True,
            )
        return 0
    if args.grad_norms:
        print("| global rounds | label | joint norm | item row | user vector | h | b | item row / joint |")
        print("|---|---|---|---|---|---|---|---|")
        for r in gradient_norms(ds, base, (0, 2) if args.small else (0, 5, 20)):
            print(
                f"| {r['global_rounds']} | {r['label']} | {r['joint']:.3f} | {r['item']:.3f} | {r['user']:.3f} "
                f"| {r['h']:.3f} | {r['b']:.3f} | {r['item_share']:.3f} |",
                flush=True,
            )
        return 0
    pop = popularity_hr(ds)
    rows: dict[str, dict] = {}
    for p in points:
        if p.name not in wanted:
            continue
        row = run_point(ds, base, p, args)
        rows[p.name] = row
        print(json.dumps(row), flush=True)
        if csv_path is not None:
            new = not csv_path.exists()
            with csv_path.open("a", newline="") as fh:
                w = csv.writer(fh)
                if new:
                    w.writerow(["point", "json"])
                w.writerow([p.name, json.dumps(row)])
    print(tables(rows, pop))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
