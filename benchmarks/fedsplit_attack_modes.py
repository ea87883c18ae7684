"""One figure with one line per fedsplit-inference mode (FedSPLIT paper Fig. 4), from reports.

Each ``privaudit attack --protocol fedsplit --attack fedsplit-inference:mode=M`` run writes a
report folder whose ``results.json`` holds the relative error per auxiliary fraction and seed.
This script reads several such folders and draws relative error (eq. 4, mean over seeds of the
mean over groups, 95 % band over seeds) against the auxiliary fraction, one line per mode, the
no-H baseline dashed; it also prints the numbers as a Markdown table.

    python benchmarks/fedsplit_attack_modes.py DIR_user DIR_movie DIR_rating [-o fig.png] [--metric relative_error]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def series(results: dict, metric: str, field: str = "attack_metrics"):
    from privaudit.metrics import mean_ci95

    by_value: dict[float, list[float]] = {}
    for p in results["points"]:
        v = (p.get(field) or {}).get(metric)
        by_value.setdefault(float(p["value"]), []).append(np.nan if v is None else float(v))
    xs = sorted(by_value)
    stats = [mean_ci95(by_value[x]) for x in xs]
    return np.array(xs), np.array([s[0] for s in stats]), np.array([s[1] for s in stats])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("-o", "--out", default="fedsplit_attack_modes.png")
    ap.add_argument("--metric", default="relative_error")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    table: dict[str, tuple] = {}
    base = None
    for d in args.dirs:
        res = json.loads((Path(d) / "results.json").read_text())
        mode = (res.get("attack_params") or {}).get("mode", Path(d).name)
        xs, mean, ci = series(res, args.metric)
        table[mode] = (xs, mean, ci)
        ax.plot(xs, mean, marker="o", ms=3, label=f"{mode} inference")
        ax.fill_between(xs, mean - ci, mean + ci, alpha=0.2)
        if base is None:
            base = series(res, args.metric, "baseline")
        dataset = res.get("dataset", {}).get("name", "")
    if base is not None:
        ax.plot(base[0], base[1], "k--", lw=1, label="baseline: mu + b_H (no H)")
    ax.set_xlabel("auxiliary fraction of X^g known to the adversary")
    ax.set_ylabel(f"{args.metric} (eq. 4; lower = more leakage)")
    ax.set_title(f"fedsplit-inference on {dataset}: one line per mode")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    modes = list(table)
    print("| aux fraction | " + " | ".join(modes) + " | baseline |")
    print("|---" * (len(modes) + 2) + "|")
    xs = table[modes[0]][0]
    for i, x in enumerate(xs):
        cells = [f"{table[m][1][i]:.4f} ± {table[m][2][i]:.4f}" for m in modes]
        print(f"| {x:g} | " + " | ".join(cells) + f" | {base[1][i]:.4f} |")
    print(f"figure written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
