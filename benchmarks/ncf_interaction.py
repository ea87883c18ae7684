"""ncf-interaction-inference against the popularity prior (and ncf-update-leak) on FedNCF.

Prints one Markdown table row per (dataset, model, defense): the attack's precision, recall and
F1, the popularity prior's F1, the F1 advantage, the support-only guess's F1 (the uploaded rows
ranked by popularity) and the advantage over it, AUC and TPR at 1 % and 0.1 % FPR of the
per-(client, item) decisions over all items and AUC and TPR at 1 % FPR over the uploaded rows
only, and ncf-update-leak's F1 on the same transcript. Examples::

    python benchmarks/ncf_interaction.py                       # synthetic, gmf/mlp/neumf
    python benchmarks/ncf_interaction.py --data ml100k --models gmf --global-rounds 1 --record-rounds 48
    python benchmarks/ncf_interaction.py --ldp 0,0.001,0.01    # noise on the uploaded item rows
    python benchmarks/ncf_interaction.py --data ml100k --models mlp --set D=64 --set 'layers=[64,32]' \
        --set local_epochs=20 --set clients_per_round=9 --set max_rounds=20 --set record_rounds=20

Synthetic runs use the settings of benchmarks/prior_baselines.py (lr 1e-3, 3 global rounds,
30 recorded rounds). ``--ldp`` values are the noise standard deviations sigma of ``ldp-interactions`` (clip 1).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np
from _common import ml100k_dir  # noqa: E402 - benchmarks/ is the script's folder

from privaudit.data import load_dataset, synthetic
from privaudit.metrics import roc_summary
from privaudit.registry import get


def run(ds, model: str, cfg: dict, defenses: list, rounds: int) -> dict:
    res = get("protocol", "fedncf")().run(ds, {"model": model, **cfg}, defenses, 0)
    t = res.transcript
    out = get("attack", "ncf-interaction-inference")(rounds=rounds).evaluate(t, np.random.default_rng(0))
    # the support-only read of ncf-update-leak (every uploaded row), as docs/reproduction.md quotes
    leak = get("attack", "ncf-update-leak")(rounds=rounds, decoder="intersection").evaluate(t, np.random.default_rng(0))
    d, u = out.decisions.get("positive"), out.decisions.get("uploaded")
    roc = roc_summary(d.labels, d.scores) if d is not None else {}
    roc_up = roc_summary(u.labels, u.scores) if u is not None else {}
    return {"hr@10": res.utility["hr@10"], "out": out, "leak": leak, "roc": roc, "roc_up": roc_up}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", choices=("synthetic", "ml100k"), default="synthetic")
    ap.add_argument("--models", default="gmf,mlp,neumf")
    ap.add_argument("--global-rounds", type=int, default=3)
    ap.add_argument("--record-rounds", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--rounds", type=int, default=1, help="uploads per client the attack combines")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="other FedNCF config (JSON value)")
    ap.add_argument(
        "--ldp", default="0", help="comma-separated noise standard deviations of ldp-interactions (0: none)"
    )
    args = ap.parse_args(argv)
    if args.data == "ml100k":
        if not ml100k_dir().is_dir():
            print(f"error: MovieLens 100K not found at {ml100k_dir()} (set PRIVAUDIT_ML100K)", file=sys.stderr)
            return 2
        ds = load_dataset(ml100k_dir())
    else:
        ds = synthetic()
    cfg = {"lr": args.lr, "global_rounds": args.global_rounds, "record_rounds": args.record_rounds}
    for item in args.set:
        key, _, value = item.partition("=")
        cfg[key] = json.loads(value)
    print(
        "| data | model | ldp sigma | HR@10 | precision | recall | F1 | prior F1 | F1 adv. | support-only F1 "
        "| F1 adv. over support | AUC | TPR@1% (all items) | TPR@0.1% (all items) | AUC (uploaded rows) "
        "| TPR@1% (uploaded rows) | update-leak F1 | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for b in (float(x) for x in args.ldp.split(",")):
            defenses = [get("defense", "ldp-interactions")(sigma=b)] if b > 0 else []
            tic = time.perf_counter()
            r = run(ds, model, cfg, defenses, args.rounds)
            m, p, roc, up = r["out"].metrics, r["out"].baseline_prior, r["roc"], r["roc_up"]
            nan = math.nan
            print(
                f"| {args.data} | {model} | {b:g} | {r['hr@10']:.3f} | {m['precision']:.3f} | {m['recall']:.3f} "
                f"| {m['f1']:.3f} | {p['f1']:.3f} | {m['f1'] - p['f1']:+.3f} | {m['support_f1']:.3f} "
                f"| {m['f1_over_support']:+.3f} | {roc.get('auc', nan):.3f} "
                f"| {roc.get('tpr@0.01', nan):.3f} | {roc.get('tpr@0.001', nan):.3f} "
                f"| {up.get('auc', nan):.3f} | {up.get('tpr@0.01', nan):.3f} "
                f"| {r['leak'].metrics['f1']:.3f} | {time.perf_counter() - tic:.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
