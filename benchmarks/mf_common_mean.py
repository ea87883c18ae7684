"""generic-mf-ratings-estimated with the global mean hidden: one mean for all clients vs one per client.

Records ``tests/flower_apps/ridge_mf`` (6 MovieLens users, 2 rounds, Flower's simulation engine)
``--recordings`` times, hides ``lr``, ``lam``, ``local-steps`` and ``mean`` from its run config,
and decodes each recording and ``--perturb`` copies of the first one (every uploaded float
times 1 + 1e-9 N(0, 1)) twice: with the mean the clients share (the attack's default,
``estimate_common_mean``) and with a mean fitted per client (the former behaviour). Prints the
exact-rating accuracy and the mean found of each.

    python benchmarks/mf_common_mean.py --recordings 3 --perturb 12

Needs ``privaudit[flower]`` and MovieLens 100K (``PRIVAUDIT_ML100K``, else ``../shared/data/ml-100k``).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, ml100k_dir  # noqa: E402

from privaudit.attacks.generic.mf_ratings import GenericMFRatingsEstimated  # noqa: E402

HIDDEN = ("lr", "lam", "local-steps", "mean")


class PerClientMean(GenericMFRatingsEstimated):
    """The former decode: a mean fitted per client, never a common one."""

    def settle_mean(self, hp, ups, grid, known):
        return hp, known, "fitted per client"


def hidden(t):
    out = copy.copy(t)
    run = {k: v for k, v in t.config["flower_run_config"].items() if k not in HIDDEN}
    out.config = {**t.config, "flower_run_config": run}
    return out


def perturbed(t, seed: int):
    out = copy.deepcopy(t)
    rng = np.random.default_rng(seed)
    for m in out.messages:
        if m.kind == "private":
            continue
        for v in m.payload.values():
            if isinstance(v, np.ndarray) and v.dtype.kind == "f":
                v *= 1 + 1e-9 * rng.standard_normal(v.shape)
    out.derived = {}
    return out


def decode(attack, t) -> tuple[float, float | None]:
    view = t.view("server")
    rec = attack.run(view, {}, np.random.default_rng(0))
    return float(attack.score(rec, t)["accuracy"]), rec.meta.get("global_mean")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recordings", type=int, default=3)
    ap.add_argument("--perturb", type=int, default=12)
    args = ap.parse_args()
    data = ml100k_dir()
    if not (data / "u.data").is_file():
        sys.exit(f"MovieLens 100K not found at {data} (set PRIVAUDIT_ML100K)")
    from privaudit.integrations.flower import record

    app = REPO / "tests" / "flower_apps" / "ridge_mf"
    cases = []
    for r in range(args.recordings):
        t = hidden(record(app, clients=6, run_config={"data": str(data)}, cpus_per_client=1).transcript)
        cases.append((f"recording {r}", t))
        if r == 0:
            cases += [(f"recording 0, perturbed {s}", perturbed(t, s)) for s in range(args.perturb)]
    print("| transcript | accuracy (common mean) | mean found | accuracy (per-client means) |")
    print("|---|---|---|---|")
    for label, t in cases:
        acc, mean = decode(GenericMFRatingsEstimated(), t)
        old, _ = decode(PerClientMean(), t)
        print(f"| {label} | {acc:.3f} | {mean:.3f} | {old:.3f} |", flush=True)


if __name__ == "__main__":
    main()
