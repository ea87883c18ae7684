"""Active data manipulation on FedNCF: ncf-active-saturation against the honest readings, the
feature-bounds defense and what it costs honest utility (docs/active-manipulation.md).

    python benchmarks/active_manipulation.py [--data synthetic|ml-100k] [--seeds 3] [--only PART ...]

Parts: ``plain`` (plain uploads: one saturated round against ncf-interaction-inference on the
same target's honest uploads), ``secagg`` (secure aggregate over cohort sizes and rounds),
``bounds`` (feature-bounds settings), ``ldp`` (ldp-interactions), ``utility`` (honest HR@10 with
feature-bounds). Prints Markdown tables: means over the seeds (one target per seed).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from privaudit.attacks.ncf.active_saturation import NCFActiveSaturation
from privaudit.attacks.ncf.interaction_inference import NCFInteractionInference
from privaudit.attacks.ncf.update_leak import _f1, _prf, client_truth
from privaudit.data import load_dataset, synthetic
from privaudit.defenses.feature_bounds import FeatureBounds
from privaudit.defenses.ldp_interactions import LDPInteractions
from privaudit.defenses.secagg import SecAgg
from privaudit.metrics import roc_summary
from privaudit.protocols.fedncf import FedNCF

#: the saturation rounds follow 10 regular rounds (a model that has trained a little)
CRAFT = {"server": "saturate", "global_rounds": 1, "deviation_start": 10, "record_rounds": 16}


def saturate(ds, seed, defenses=(), rounds=-1, **cfg):
    tr = FedNCF().run(ds, {**CRAFT, **cfg}, list(defenses), rng=seed).transcript
    out = NCFActiveSaturation(rounds=rounds).evaluate(tr, np.random.default_rng(seed))
    return tr, out


def honest_iia(ds, seed, target, defenses=(), **cfg):
    """ncf-interaction-inference's F1 on ``target`` from its first honest upload."""
    tr = FedNCF().run(ds, {"global_rounds": 1, "record_rounds": -1, **cfg}, list(defenses), rng=seed).transcript
    rec = NCFInteractionInference(rounds=1).evaluate(tr, np.random.default_rng(seed)).reconstruction
    party = f"client:{target}"
    if party not in rec.victims or "items" not in rec.victims[party]:
        return float("nan")
    return _f1(*_prf(rec.victims[party]["items"], client_truth(tr, party)))


def mean(xs):
    return f"{np.nanmean(xs):.3f}"


def part_plain(ds, seeds):
    print(
        "\n| model | rounds | precision | recall | F1 | AUC | TPR@1%FPR | honest reading F1 | ncf-interaction-inference F1 (same target, honest run) | prior F1 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in ("gmf", "neumf"):
        rows = []
        for s in seeds:
            tr, out = saturate(ds, s, model=model, deviation_rounds=1, rounds=1)
            d = out.decisions["positive"]
            roc = roc_summary(d.labels, d.scores)
            iia = honest_iia(ds, s, tr.config["target"], model=model)
            mt = out.metrics
            rows.append(
                [
                    mt["precision"],
                    mt["recall"],
                    mt["f1"],
                    roc["auc"],
                    roc["tpr@0.01"],
                    mt["honest_f1"],
                    iia,
                    out.baseline_prior["f1"],
                ]
            )
        r = np.array(rows)
        print(f"| {model} | 1 | " + " | ".join(mean(r[:, j]) for j in range(r.shape[1])) + " |")


def part_secagg(ds, seeds):
    print("\n| clients_per_round | rounds | precision | recall | F1 | honest reading F1 (counts) | prior F1 |")
    print("|---|---|---|---|---|---|---|")
    for k in (2, 3, 5, 10, 20):
        trs = [
            FedNCF().run(ds, {**CRAFT, "clients_per_round": k, "deviation_rounds": 5}, [SecAgg()], rng=s).transcript
            for s in seeds
        ]
        for rounds in (1, 2, 4):
            rows = []
            for s, tr in zip(seeds, trs):
                out = NCFActiveSaturation(rounds=rounds).evaluate(tr, np.random.default_rng(s))
                mt = out.metrics
                rows.append([mt["precision"], mt["recall"], mt["f1"], mt["honest_f1"], out.baseline_prior["f1"]])
            r = np.array(rows)
            print(f"| {k} | {rounds} | " + " | ".join(mean(r[:, j]) for j in range(r.shape[1])) + " |")


def part_bounds(ds, seeds):
    print("\n| craft_items | feature-bounds | precision | recall | F1 | honest reading F1 |")
    print("|---|---|---|---|---|---|")
    settings = [
        None,
        {"max_norm": 1.0, "max_bias": -1.0},
        {"max_bias": 20.0},
        {"max_bias": 15.0},
        {"max_bias": 10.0},
        {"max_bias": 5.0},
    ]
    for craft in ("zero", "keep"):
        for b in settings:
            rows = []
            for s in seeds:
                _, out = saturate(
                    ds, s, [FeatureBounds(**b)] if b else [], craft_items=craft, deviation_rounds=1, rounds=1
                )
                mt = out.metrics
                rows.append([mt["precision"], mt["recall"], mt["f1"], mt["honest_f1"]])
            r = np.array(rows)
            name = "none" if b is None else ", ".join(f"{k}={v:g}" for k, v in b.items())
            print(f"| {craft} | {name} | " + " | ".join(mean(r[:, j]) for j in range(r.shape[1])) + " |")


def part_ldp(ds, seeds):
    print(
        "\n| ldp-interactions sigma | saturation F1 | saturation AUC | ncf-interaction-inference F1 (same target) | prior F1 |"
    )
    print("|---|---|---|---|---|")
    for sigma in (0.01, 0.03, 0.1):
        rows = []
        for s in seeds:
            d = [LDPInteractions(sigma=sigma)]
            tr, out = saturate(ds, s, d, deviation_rounds=1, rounds=1)
            dec = out.decisions["positive"]
            rows.append(
                [
                    out.metrics["f1"],
                    roc_summary(dec.labels, dec.scores)["auc"],
                    honest_iia(ds, s, tr.config["target"], d),
                    out.baseline_prior["f1"],
                ]
            )
        r = np.array(rows)
        print(f"| {sigma:g} | " + " | ".join(mean(r[:, j]) for j in range(r.shape[1])) + " |")


def part_utility(ds, seeds, cfg):
    print("\n| feature-bounds | HR@10 | NDCG@10 |")
    print("|---|---|---|")
    for b in (
        None,
        {"max_bias": 5.0},
        {"max_bias": 1.0},
        {"max_norm": 1.0, "max_bias": -1.0},
        {"max_norm": 0.5, "max_bias": -1.0},
    ):
        us = [
            FedNCF().run(ds, {"record_rounds": 0, **cfg}, [FeatureBounds(**b)] if b else [], rng=s).utility
            for s in seeds
        ]
        name = "none" if b is None else ", ".join(f"{k}={v:g}" for k, v in b.items())
        print(f"| {name} | {mean([u['hr@10'] for u in us])} | {mean([u['ndcg@10'] for u in us])} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="synthetic", help="synthetic (default) or ml-100k ($PRIVAUDIT_ML100K)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=["plain", "secagg", "bounds", "ldp", "utility"])
    ap.add_argument("--utility-rounds", type=int, default=5, help="global rounds of the utility runs")
    a = ap.parse_args()
    ds = synthetic(seed=0) if a.data == "synthetic" else load_dataset(os.environ["PRIVAUDIT_ML100K"])
    seeds = list(range(a.seeds))
    print(f"data {a.data}: {ds.n_users} users, {ds.n_items} items; seeds {seeds}")
    parts = {"plain": part_plain, "secagg": part_secagg, "bounds": part_bounds, "ldp": part_ldp}
    for name in a.only:
        if name == "utility":
            part_utility(ds, seeds, {"global_rounds": a.utility_rounds})
        else:
            parts[name](ds, seeds)


if __name__ == "__main__":
    main()
